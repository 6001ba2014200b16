//! Scenario 3: a player one cell left of the border between two shards writes 200 moves,
//! RIGHT and LEFT in turn, in one write. Each accepted move is a handoff to the other
//! shard; the gateway's move budget (20, kept across handoffs) accepts exactly 20 and
//! answers the rest RATE_LIMITED, every move exactly once and in the order sent.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{Direction, ErrorCode};
use meridian_testkit::{
    deadline, msg, wait_for_partition, wait_until, Answer, Border, Bot, Bystander, ClusterOptions,
    Front, DEFAULT_WAIT,
};

use crate::{with_cluster, BYSTANDER_HOME};

const MOVES: u64 = 200;
const MOVE_BURST: u64 = 20;
const ROW: u32 = 100;

pub fn border_zigzag(front: Front) {
    // What is measured is the move budget: the connection's frame budget (burst 200) is
    // lifted so that the 200-move write never waits on it (a refill would refill moves too).
    let options = ClusterOptions::new(front).shards(2).env("MERIDIAN_INPUT_FRAME_RATE", "10000");
    with_cluster(options, |cluster| {
        let partition = wait_for_partition(cluster, Duration::from_secs(15))?;
        let border = partition
            .borders()
            .into_iter()
            .find_map(|b| match b {
                Border::Vertical { x, y0, y1 } if (y0..y1).contains(&ROW) => Some(x),
                _ => None,
            })
            .with_context(|| format!("no vertical border across row {ROW} in {partition}"))?;
        let (left, right) = ((border - 1, ROW), (border, ROW));
        ensure!(
            partition.owner(left) != partition.owner(right),
            "{left:?} and {right:?} have one owner in {partition}"
        );
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut zigzag = Bot::connect(addr)?;
        let login = zigzag.login("zigzag", Some(left))?;
        ensure!(login.after.is_empty(), "nobody near {left:?}: {login:?}");
        let moves: Vec<_> = (1..=MOVES)
            .map(|t| msg::move_(if t % 2 == 1 { Direction::Right } else { Direction::Left }, t))
            .collect();
        zigzag.send_all(&moves)?;
        let until = deadline(Duration::from_secs(10));
        let mut at = left;
        let mut acked = Vec::new();
        for t in 1..=MOVES {
            // `recv_answer` fails on an answer out of order or to a move answered before.
            let answer = zigzag.recv_answer(until, t)?;
            ensure!(answer.others.is_empty(), "only answers expected, got {:?}", answer.others);
            match &answer.answer {
                Answer::Ack(position) => {
                    let expected = if t % 2 == 1 { right } else { left };
                    ensure!(
                        *position == expected,
                        "move {t} acknowledged at {position:?}, expected {expected:?} (from {at:?})"
                    );
                    at = expected;
                    acked.push(t);
                }
                Answer::Error(ErrorCode::RateLimited, _) => {}
                Answer::Error(code, detail) => {
                    bail!("move {t} refused with {} ({detail:?})", code.as_str_name())
                }
            }
        }
        zigzag.expect_quiet().context("nothing after the 200 answers")?;
        // All 200 arrive in one segment and are read in one pass with one clock reading: the
        // budget gives exactly its burst. A 21st could only come from a refill of 50 ms
        // between two reads of the same write (a split segment on a stalled machine).
        let first: Vec<u64> = (1..=MOVE_BURST).collect();
        ensure!(
            acked.len() as u64 == MOVE_BURST || acked.len() as u64 == MOVE_BURST + 1,
            "{} of {MOVES} moves acknowledged, expected {MOVE_BURST}: {acked:?}",
            acked.len()
        );
        ensure!(
            acked[..MOVE_BURST as usize] == first[..],
            "the first 20 moves are the ones acknowledged: {acked:?}"
        );
        if acked.len() as u64 > MOVE_BURST {
            eprintln!("border zigzag ({front:?}): a 21st move was acknowledged: {acked:?}");
        }

        // The player still plays: once the budget refills its next move is acknowledged
        // from where the last acknowledged move left it.
        let mut t = 1_000;
        let mut outcome = None;
        let direction = if at == left { Direction::Right } else { Direction::Left };
        wait_until(deadline(DEFAULT_WAIT), "a move acknowledged once the budget refills", || {
            t += 1;
            match zigzag.move_(direction, t).map(|answer| answer.answer) {
                Ok(Answer::Error(ErrorCode::RateLimited, _)) => false,
                other => {
                    outcome = Some(other);
                    true
                }
            }
        })?;
        let position = match outcome {
            Some(Ok(Answer::Ack(position))) => position,
            other => bail!("move {t} after the zigzag: {other:?}"),
        };
        let expected = if at == left { right } else { left };
        ensure!(position == expected, "after the zigzag: at {position:?}, expected {expected:?}");
        bystander.finish()?;
        Ok(())
    })
}
