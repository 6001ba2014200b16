//! Every node's `/metrics` has the standard process metrics, read from its own `/proc`
//! (the gateway's open descriptors against their limit are its saturation signal), and
//! `meridian_build_info{version, commit}`; every info-style gauge is named `_info`.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::{deadline, http_get, wait_until, ClusterOptions, Exposition, Io};

use crate::{admin_ports, with_cluster};

/// The one sample of a family without labels, checked to be of `kind`.
fn value(metrics: &Exposition, name: &str, kind: &str) -> anyhow::Result<f64> {
    let family = metrics.family(name).with_context(|| format!("no {name}"))?;
    ensure!(family.kind == kind, "{name} is a {}, expected a {kind}", family.kind);
    ensure!(family.samples.len() == 1, "{name}: one sample: {family:?}");
    Ok(family.samples[0].value)
}

/// The commit the test binary was built from, as the build script names it.
fn head_commit() -> Option<String> {
    let output = Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

pub fn process_and_build_metrics_on_every_node() {
    with_cluster("process metrics", ClusterOptions::new(Io::Epoll), |cluster| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        for (node, admin) in admin_ports(cluster) {
            // CPU time moves in clock ticks (10 ms): wait until the node has spent one.
            let mut metrics = None;
            let spent = wait_until(deadline(Duration::from_secs(10)), "CPU time above 0", || {
                let (code, body) = match http_get(admin, "/metrics") {
                    Ok(answer) => answer,
                    Err(_) => return false,
                };
                metrics =
                    (code == 200).then(|| Exposition::parse(&body)).transpose().ok().flatten();
                metrics.as_ref().is_some_and(|m| m.total("process_cpu_seconds_total") > Some(0.0))
            });
            let metrics = metrics.with_context(|| format!("{node}: no valid /metrics"))?;
            spent.with_context(|| {
                format!("{node}: {:?}", metrics.family("process_cpu_seconds_total"))
            })?;
            let rss = value(&metrics, "process_resident_memory_bytes", "gauge")?;
            let virt = value(&metrics, "process_virtual_memory_bytes", "gauge")?;
            let open = value(&metrics, "process_open_fds", "gauge")?;
            let max = value(&metrics, "process_max_fds", "gauge")?;
            let start = value(&metrics, "process_start_time_seconds", "gauge")?;
            value(&metrics, "process_cpu_seconds_total", "counter")?;
            ensure!(rss > 1e6 && virt >= rss, "{node}: rss {rss}, virtual {virt}");
            // Listeners, etcd and peer connections at least; never past the limit.
            ensure!(open >= 5.0 && open <= max, "{node}: {open} descriptors open of {max}");
            let started_ago = now.as_secs_f64() - start;
            ensure!((-5.0..600.0).contains(&started_ago), "{node}: started {started_ago} s ago");

            let build = metrics.family("meridian_build_info").context("no meridian_build_info")?;
            ensure!(build.kind == "gauge" && build.samples.len() == 1, "{node}: {build:?}");
            let sample = &build.samples[0];
            ensure!(sample.value == 1.0, "{node}: {sample:?}");
            ensure!(
                sample.labels.get("version").map(String::as_str) == Some("0.1.0"),
                "{sample:?}"
            );
            let commit = sample.labels.get("commit").context("no commit label")?;
            if let Some(head) = head_commit() {
                ensure!(*commit == head, "{node}: commit {commit}, the checkout is at {head}");
            }
            // Info-style gauges (labels carry the facts, the value is 1) are named _info.
            for (name, family) in &metrics.families {
                let info_style = family.kind == "gauge"
                    && family.help.as_deref().is_some_and(|h| h.contains("(value 1)"));
                ensure!(info_style == name.ends_with("_info"), "{node}: {name}: {family:?}");
            }
        }
        Ok(())
    });
}
