//! The shard's metrics are the core's ([`ShardMetrics`](meridian_shard_core::ShardMetrics));
//! here, the gauges read at scrape time from etcd's side (the registration).

use meridian_cluster::{RegistrationStatus, ShardId};
use meridian_observe::Registry;

/// etcd status, read from the registration at scrape time.
pub fn watch_registration(registry: &Registry, id: ShardId, status: RegistrationStatus) {
    let shard = id.0.to_string();
    let l: &[(&str, &str)] = &[("shard", shard.as_str())];
    let registered = status.clone();
    registry.gauge_fn(
        "meridian_shard_etcd_registered",
        "1 while this shard's key is held in etcd on a live lease, else 0.",
        l,
        move || i64::from(registered.is_registered()),
    );
    registry.counter_fn(
        "meridian_shard_etcd_lease_expirations_total",
        "Times etcd let this shard's lease expire (taken for dead).",
        l,
        move || status.expirations(),
    );
}
