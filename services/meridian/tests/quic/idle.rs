//! Keep-alive and the idle timeout: a quiet client stays, a vanished one leaves the world
//! (observers get Left) within the idle timeout plus a keep-alive interval.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::pb::Direction;
use meridian_testkit::{deadline, Bot, ClusterOptions, Io};

use crate::{entered, left, with_cluster};

/// The idle timeout this test gives the gateway (the default is 10 s).
const IDLE: Duration = Duration::from_millis(2000);

#[test]
fn quiet_clients_stay_and_vanished_ones_leave() {
    let opts = ClusterOptions::new(Io::Uring).arg("--quic-idle-timeout").arg("2s");
    with_cluster(opts, |cluster| {
        let quic = cluster.quic_target(0);
        let mut observer = Bot::connect(cluster.game_addr(0))?;
        observer.login("observer", Some((100, 100)))?;
        let mut quiet = Bot::connect(quic)?;
        quiet.login("quiet", Some((105, 100)))?;
        let mut ghost = Bot::connect(quic)?;
        ghost.login("ghost", Some((110, 100)))?;
        observer.expect_messages(&[entered(&quiet, 105, 100), entered(&ghost, 110, 100)])?;
        quiet.expect_messages(&[entered(&ghost, 110, 100)])?;

        // The ghost's device dies: no close, no packet ever again.
        let ghost_left = left(&ghost);
        let vanished_at = Instant::now();
        ghost.vanish()?;
        // The limit: the idle timeout, one keep-alive interval (IDLE / 3 under `up`) before
        // the timer restarts, and a second of slack for a loaded machine.
        let limit = IDLE + IDLE / 3 + Duration::from_secs(1);
        let got = observer
            .recv(vanished_at + limit)
            .with_context(|| format!("observer expecting Left ghost within {limit:?}"))?;
        let took = vanished_at.elapsed();
        ensure!(got == ghost_left, "expected Left ghost, got {got:?}");
        ensure!(took >= IDLE / 2, "Left after {took:?}: sooner than any idle timeout could");
        eprintln!("a vanished QUIC client left the world after {took:?} (idle timeout {IDLE:?})");

        // `quiet` sent nothing all that time (longer than the idle timeout) and is still in:
        // keep-alives kept its connection.
        let got = quiet.recv(deadline(Duration::from_secs(5)))?;
        ensure!(got == ghost_left, "quiet expected Left ghost, got {got:?}");
        ensure!(quiet.move_ok(Direction::Up, 1)? == (105, 99), "quiet moves after the silence");
        Ok(())
    })
}
