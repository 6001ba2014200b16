//! The gateway's metrics are the core's ([`GatewayMetrics`]); here, the gauges read at
//! scrape time from etcd's side of things (the registration and the cluster view).

use std::sync::Arc;

use meridian_cluster::{ClusterView, EpochCell, GatewayId, RegistrationStatus};
use meridian_observe::Registry;

/// etcd status and the partition epoch, read at scrape time from the registration and
/// the cluster view.
pub fn watch_cluster(
    registry: &Registry,
    id: GatewayId,
    status: RegistrationStatus,
    view: Arc<EpochCell<ClusterView>>,
) {
    let gateway = id.0.to_string();
    let l: &[(&str, &str)] = &[("gateway", gateway.as_str())];
    let registered = status.clone();
    registry.gauge_fn(
        "meridian_gateway_etcd_registered",
        "1 while this gateway's key is held in etcd on a live lease, else 0.",
        l,
        move || i64::from(registered.is_registered()),
    );
    registry.counter_fn(
        "meridian_gateway_etcd_lease_expirations_total",
        "Times etcd let this gateway's lease expire.",
        l,
        move || status.expirations(),
    );
    let epoch_view = Arc::clone(&view);
    registry.gauge_fn(
        "meridian_gateway_partition_epoch",
        "The partition epoch this gateway routes by (0 before the first).",
        l,
        move || epoch_view.read(|v| v.partition.as_ref().map_or(0, |p| p.epoch as i64)),
    );
    registry.gauge_fn(
        "meridian_gateway_shards_known",
        "Shards registered in etcd as this gateway sees them.",
        l,
        move || view.read(|v| v.shards.len() as i64),
    );
}
