//! `meridian drain <shard>`: asks a shard, through etcd, to hand off its players and exit.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use meridian_cluster::{ClusterKeys, ClusterWatch, ShardId};

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
        // The record changes far more often than its progress (every load report): a line
        // is printed only when what it says changes.
        let mut last_said = None;
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
                    let progress = (record.state, record.players);
                    if last_said != Some(progress) {
                        last_said = Some(progress);
                        println!(
                            "{shard}: {:?}, {} players left ({:.0} s)",
                            record.state,
                            record.players,
                            started.elapsed().as_secs_f64()
                        );
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
