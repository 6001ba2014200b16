//! A node whose gRPC links the cluster cannot speak is refused before it joins (issue 32):
//! a shard started by hand with `--dev` (no TLS) on a cluster of `meridian up` (mutual TLS)
//! used to be given a third of the map, where no gateway could reach it. Now it exits
//! non-zero with a message saying what to start it with, and gets no cells; the same for a
//! gateway, and for a node whose certificate is from another CA.

use anyhow::{ensure, Context};
use meridian_testkit::{ClusterOptions, CommandRun};

use crate::with_cluster;

/// The shard ids the partition gives regions to, and its epoch.
fn owners(status: &serde_json::Value) -> anyhow::Result<(u64, Vec<u64>)> {
    let partition = &status["partition"];
    let epoch = partition["epoch"].as_u64().with_context(|| format!("an epoch: {partition}"))?;
    let regions =
        partition["regions"].as_array().with_context(|| format!("regions: {partition}"))?;
    let mut owners: Vec<u64> = regions.iter().filter_map(|r| r["shard"].as_u64()).collect();
    owners.sort_unstable();
    owners.dedup();
    Ok((epoch, owners))
}

/// The node `meridian <args>` exited non-zero and said `expected` on stderr.
fn refused(run: &CommandRun, what: &str, expected: &[&str]) -> anyhow::Result<()> {
    ensure!(
        !run.status.success(),
        "{what} exited with {}, expected a refusal: {run:?}",
        run.status
    );
    for words in expected {
        ensure!(
            run.stderr.contains(words),
            "{what} should say {words:?}; its stderr:\n{}",
            run.stderr
        );
    }
    Ok(())
}

pub fn a_node_of_another_transport_is_refused_and_given_no_cells() {
    with_cluster(ClusterOptions::new(meridian_testkit::Io::Epoll).shards(2), |cluster| {
        let before = cluster.status_json()?;
        let (epoch, shards) = owners(&before)?;
        ensure!(shards == [1, 2], "the two shards of `up` own the map: {before}");
        let etcd = ["--etcd", cluster.etcd_url(), "--cluster", cluster.cluster_name()];
        let ports = ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];

        // The issue's shard: by hand, with --dev and no TLS.
        let args = [&["shard", "--id", "7", "--dev"][..], &etcd, &ports].concat();
        let run = cluster.run_meridian(&args)?;
        refused(
            &run,
            "a --dev shard without TLS",
            &[
                "this cluster uses mutual TLS",
                "start the shard with --tls-ca, --tls-cert and --tls-key",
            ],
        )?;

        // A gateway without TLS, the same.
        let args =
            [&["gateway", "--id", "7", "--dev", "--io", "epoll"][..], &etcd, &ports].concat();
        let run = cluster.run_meridian(&args)?;
        refused(&run, "a --dev gateway without TLS", &["start the gateway with --tls-ca"])?;

        // A shard with mutual TLS, but a certificate from a CA of its own.
        let other = meridian_tls::DevCa::open_or_create(&cluster.dir().join("another-ca"))?
            .issue("shard-8")?;
        let tls = [
            "--tls-ca",
            other.ca.to_str().context("a UTF-8 path")?,
            "--tls-cert",
            other.cert.to_str().context("a UTF-8 path")?,
            "--tls-key",
            other.key.to_str().context("a UTF-8 path")?,
        ];
        let args = [&["shard", "--id", "8", "--dev"][..], &etcd, &ports, &tls].concat();
        let run = cluster.run_meridian(&args)?;
        refused(&run, "a shard of another CA", &["under another CA", "--tls-ca"])?;

        // None of them registered or was given a cell: the map is the one from before.
        let after = cluster.status_json()?;
        ensure!(owners(&after)? == (epoch, shards), "the partition did not change: {after}");
        let members = after["shards"].as_array().map_or(0, Vec::len);
        let gateways = after["gateways"].as_array().map_or(0, Vec::len);
        ensure!(members == 2 && gateways == 1, "only `up`'s nodes are members: {after}");
        Ok(())
    })
}

/// Past the check at start (two nodes of different transports starting at the same moment
/// into an empty cluster both pass it), the coordinator is the guard: it gives cells only
/// to shards of its own transport. A record in the clear appears, then one that matches:
/// the matching one is given cells, the other still none.
pub fn the_coordinator_gives_no_cells_to_a_shard_of_another_transport() {
    with_cluster(ClusterOptions::new(meridian_testkit::Io::Epoll), |cluster| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let etcd = meridian_cluster::Etcd::plain(vec![cluster.etcd_url().to_string()]);
        let mut client = runtime.block_on(meridian_cluster::connect(&etcd))?;
        let keys = meridian_cluster::ClusterKeys::new(cluster.cluster_name());
        let ca = meridian_tls::NodeTls::load(cluster.tls_files("shard-8")?)?.ca_sha256();
        let record =
            |id: u32, transport: meridian_cluster::Transport| meridian_cluster::ShardRecord {
                id: meridian_cluster::ShardId(id),
                grpc: "127.0.0.1:9".into(),
                admin: "127.0.0.1:9".into(),
                state: meridian_cluster::ShardState::Serving,
                players: 0,
                load: Default::default(),
                incarnation: 1,
                transport: Some(transport),
            };
        let plain = record(9, meridian_cluster::Transport::of(None));
        let matching = record(8, meridian_cluster::Transport::of(Some(ca)));
        for shard in [&plain, &matching] {
            runtime.block_on(client.put(keys.shard(shard.id), shard.to_json(), None))?;
        }
        let mut status = serde_json::Value::Null;
        let seen = meridian_testkit::wait_until(
            meridian_testkit::deadline(std::time::Duration::from_secs(20)),
            "the coordinator to give the matching shard 8 cells",
            || {
                status = cluster.status_json().unwrap_or_default();
                owners(&status).is_ok_and(|(_, owners)| owners.contains(&8))
            },
        );
        for shard in [&plain, &matching] {
            runtime.block_on(client.delete(keys.shard(shard.id), None))?;
        }
        seen.with_context(|| format!("last partition: {}", status["partition"]))?;
        let (_, owners) = owners(&status)?;
        let partition = &status["partition"];
        ensure!(owners == [1, 8], "shard 9, in the clear, should have no cells: {partition}");
        Ok(())
    })
}
