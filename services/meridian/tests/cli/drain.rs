//! `meridian drain --wait` on a `meridian up` cluster (issue 32): each step of the drain
//! is said once (not once per record update: "0 players left" nine times in a second), and
//! `up` notices the drained shard's exit and reaps it (no zombie left under `up`).

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::abuse::process_state;
use meridian_testkit::{deadline, drain_shard, wait_until, Cluster, ClusterOptions, Io};

use crate::meridian_bin;

#[test]
fn drain_says_each_step_once_and_up_reaps_the_drained_shard() {
    // Wolves are players that live on the shard: its drain has some to hand off.
    let opts = ClusterOptions::new(Io::Epoll).shards(2).arg("--game").arg("wolves");
    let cluster = Cluster::start(meridian_bin(), opts).expect("meridian up");
    let checked = (|| {
        let shard = cluster.shard(1).clone();
        let drained = drain_shard(&cluster, shard.id, Duration::from_secs(30))?;
        let output = &drained.output;
        ensure!(output.contains("drained and left"), "the drain finished: {output}");
        // A progress line without its elapsed seconds, "(3 s)": what it says.
        let said: Vec<&str> = output
            .lines()
            .filter(|line| line.contains("players left"))
            .map(|line| line.rsplit_once(" (").map_or(line, |(said, _)| said))
            .collect();
        ensure!(
            said.windows(2).all(|pair| pair[0] != pair[1]),
            "a line is printed only when the progress changes: {output}"
        );

        // `up` says it saw the exit, which it prints once it has reaped the shard.
        let exited = format!("shard-{} exited", shard.id);
        let noticed = wait_until(deadline(Duration::from_secs(10)), &exited, || {
            std::fs::read_to_string(cluster.log_path()).is_ok_and(|log| log.contains(&exited))
        });
        noticed.with_context(|| format!("`up` to say {exited:?}"))?;
        let state = process_state(shard.pid);
        ensure!(state.is_none(), "the drained shard is reaped, not a zombie: state {state:?}");
        Ok(())
    })();
    if let Err(error) = checked {
        panic!("{error:#}\n{}", cluster.log_tail());
    }
    cluster.stop().expect("the rest of the cluster stops cleanly");
}
