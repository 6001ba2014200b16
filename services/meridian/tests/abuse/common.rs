//! What the abuse scenarios share beyond the end-to-end tests' common module: timing
//! slack, and a lock that keeps the heaviest scenarios from running at once.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use meridian_testkit::{Cluster, ClusterOptions};

use crate::with_cluster;

/// How late a deadline may fire on a loaded machine beyond the gateway's 250 ms tick.
pub const SCHEDULING_SLACK: Duration = Duration::from_millis(500);

/// The gateway's periodic check (deadlines, paused reads): deadlines fire on it.
pub const GATEWAY_TICK: Duration = Duration::from_millis(250);

/// In-process, so it holds under `cargo test`; under cargo-nextest (deploy/test.sh), where
/// each test is a process of its own, the test group `abuse-alone` in .config/nextest.toml
/// does the same and must name every test that calls [`with_cluster_alone`].
static ALONE: Mutex<()> = Mutex::new(());

/// [`with_cluster`] with no other `alone` scenario running: the floods, which load both
/// cores, and the scenarios that time deadlines, which a flood next door would delay.
pub fn with_cluster_alone(
    opts: ClusterOptions,
    scenario: impl FnOnce(&Cluster) -> anyhow::Result<()>,
) {
    let _alone: MutexGuard<'_, ()> = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    with_cluster(opts, scenario);
}
