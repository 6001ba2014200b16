//! One default cluster name: `meridian up` names its cluster what `status`, `drain`,
//! `player` and the nodes look at, and prints the `status` command that shows it.

use anyhow::{ensure, Context};
use meridian_testkit::{Cluster, ClusterOptions, Io, DEFAULT_CLUSTER};

use crate::meridian_bin;

#[test]
fn every_command_defaults_to_one_cluster_name() {
    let mut root = meridian::command();
    root.build();
    let mut seen = Vec::new();
    let mut stack = vec![root];
    while let Some(command) = stack.pop() {
        for arg in command.get_arguments().filter(|a| a.get_id() == "cluster") {
            let defaults: Vec<_> = arg.get_default_values().iter().collect();
            assert_eq!(defaults, [DEFAULT_CLUSTER], "meridian {} --cluster", command.get_name());
            seen.push(command.get_name().to_string());
        }
        stack.extend(command.get_subcommands().cloned());
    }
    for command in ["up", "gateway", "shard", "status", "drain", "player", "etcd-auth"] {
        assert!(seen.iter().any(|s| s == command), "{command} has --cluster: {seen:?}");
    }
}

/// After `meridian up` with no `--cluster`, the `status` line it prints names no cluster,
/// and running it (and `status --check`) shows the cluster `up` started.
#[test]
fn status_after_up_shows_the_cluster_without_naming_it() {
    let opts = ClusterOptions::new(Io::Epoll).default_name();
    let cluster = Cluster::start(meridian_bin(), opts).expect("meridian up");
    let checked = (|| {
        ensure!(cluster.cluster_name() == DEFAULT_CLUSTER, "{}", cluster.cluster_name());
        let log = std::fs::read_to_string(cluster.log_path())?;
        let line = log
            .lines()
            .find_map(|l| l.trim().strip_prefix("status:"))
            .with_context(|| format!("no status line in up's output:\n{log}"))?;
        let printed: Vec<&str> = line.split_whitespace().collect();
        // Tests start etcd on a free port, so --etcd is there; --cluster must not be.
        let expected = ["meridian", "status", "--etcd", cluster.etcd_url()];
        ensure!(printed == expected, "up printed {printed:?}, expected {expected:?}");
        let run = cluster.run_meridian(&printed[1..])?;
        ensure!(run.status.success(), "{line}: {run:?}");
        // It says which cluster and which etcd it read (issue 32).
        let read = format!("cluster meridian in etcd at {} (", cluster.etcd_url());
        ensure!(run.stdout.starts_with(&read), "{run:?}");
        ensure!(!run.stdout.contains("nothing is registered"), "{run:?}");
        ensure!(run.stdout.contains("shards (1):") && run.stdout.contains("shard-1"), "{run:?}");
        ensure!(run.stdout.contains("gateways (1):"), "{run:?}");
        // Another name in the same etcd: nothing there, and it says what to check.
        let run = cluster.run_meridian(&[
            "status",
            "--etcd",
            cluster.etcd_url(),
            "--cluster",
            "not-this-one",
        ])?;
        ensure!(run.status.success(), "{run:?}");
        ensure!(run.stdout.contains("nothing is registered under this name"), "{run:?}");
        let run = cluster.run_meridian(&["status", "--check", "--etcd", cluster.etcd_url()])?;
        ensure!(run.status.code() == Some(0), "status --check: {run:?}");
        ensure!(
            run.stdout.starts_with("ok: cluster \"meridian\", 1 shard and 1 gateway ready"),
            "{run:?}"
        );
        Ok(())
    })();
    if let Err(error) = checked {
        panic!("{error:#}");
    }
    cluster.stop().expect("stopping the cluster");
}
