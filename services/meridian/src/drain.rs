//! `meridian drain <shard>`: asks a shard, through etcd, to hand off its players and exit.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use meridian_cluster::{ClusterKeys, ClusterWatch, ShardId, ShardState};

use crate::cli::DrainArgs;

pub fn run(args: DrainArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let keys = ClusterKeys::new(&args.cluster.cluster);
        let shard = ShardId(args.shard.or(args.id).context("which shard? give its id")?);
        let mut client =
            meridian_cluster::connect(&args.cluster.etcd_access.etcd(&args.cluster.etcd))
                .await
                .with_context(|| {
                    format!("connecting to etcd at {}", args.cluster.etcd.join(","))
                })?;
        let watch = ClusterWatch::start(client.clone(), keys.clone()).await?;
        if !watch.current().shards.contains_key(&shard) {
            bail!("{shard} is not registered in cluster {:?}", args.cluster.cluster);
        }
        client
            .put(keys.drain(shard), "requested", None)
            .await
            .context("writing the drain request")?;
        println!("drain of {shard} requested");
        if !args.wait {
            return Ok(());
        }
        let started = Instant::now();
        let mut changes = watch.changes();
        let mut progress = Progress::default();
        loop {
            let view = changes.borrow_and_update().clone();
            match view.shards.get(&shard) {
                None => {
                    println!(
                        "{shard} drained and left after {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                Some(record) => {
                    if let Some(line) = progress.line(record.state, record.players) {
                        println!("{shard}: {line} ({:.0} s)", started.elapsed().as_secs_f64());
                    }
                }
            }
            if started.elapsed() > args.timeout {
                bail!("{shard} did not finish draining within {:?}", args.timeout);
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }
    })
}

/// What `--wait` last said of the shard. Its record changes far more often than its
/// progress (every load report, and the wait wakes every second besides): a line is due
/// only when the state or the players left change (issue 32: "0 players left" nine times in
/// a second).
#[derive(Default)]
struct Progress {
    said: Option<(ShardState, u64)>,
}

impl Progress {
    fn line(&mut self, state: ShardState, players: u64) -> Option<String> {
        if self.said == Some((state, players)) {
            return None;
        }
        self.said = Some((state, players));
        Some(format!("{state:?}, {players} players left"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_said_only_when_it_changes() {
        let mut progress = Progress::default();
        let said: Vec<_> = [
            (ShardState::Serving, 5),
            (ShardState::Draining, 5),
            (ShardState::Draining, 5),
            (ShardState::Draining, 0),
            (ShardState::Draining, 0),
            (ShardState::Draining, 0),
        ]
        .into_iter()
        .filter_map(|(state, players)| progress.line(state, players))
        .collect();
        assert_eq!(
            said,
            ["Serving, 5 players left", "Draining, 5 players left", "Draining, 0 players left"]
        );
    }
}
