//! Keeps a node's [`ClusterView`] in step with etcd: one prefix read, then a watch.
//!
//! If etcd goes away the last view stays in place (the cluster keeps serving with the last
//! known map) and the watcher reconnects with backoff, starting over with a full read.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::keys::ClusterKeys;
use crate::model::{ClusterView, GatewayId, GatewayRecord, PartitionMap, ShardId, ShardRecord};
use crate::{ClusterError, EpochCell};

/// A running watch of the cluster prefix.
pub struct ClusterWatch {
    view: Arc<EpochCell<ClusterView>>,
    changes: watch::Receiver<ClusterView>,
}

impl ClusterWatch {
    /// Reads the whole prefix once (so the caller starts with a real view), then follows it.
    pub async fn start(client: Client, keys: ClusterKeys) -> Result<Self, ClusterError> {
        let mut client = client;
        let initial = read_all(&mut client, &keys).await?;
        let view = Arc::new(EpochCell::new(initial.clone()));
        let (sender, changes) = watch::channel(initial);
        tokio::spawn(follow(client, keys, Arc::clone(&view), sender));
        Ok(ClusterWatch { view, changes })
    }

    /// The lock-free view, for hot paths.
    pub fn view(&self) -> Arc<EpochCell<ClusterView>> {
        Arc::clone(&self.view)
    }

    /// A receiver that wakes on every change, for control loops.
    pub fn changes(&self) -> watch::Receiver<ClusterView> {
        self.changes.clone()
    }

    /// The current view, cloned.
    pub fn current(&self) -> ClusterView {
        self.changes.borrow().clone()
    }
}

async fn read_all(client: &mut Client, keys: &ClusterKeys) -> Result<ClusterView, ClusterError> {
    let response = client
        .get(keys.root(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(ClusterError::from_etcd)?;
    let mut view = ClusterView {
        revision: response.header().map(|h| h.revision()).unwrap_or(0),
        ..ClusterView::default()
    };
    for kv in response.kvs() {
        apply_put(&mut view, keys, kv);
    }
    Ok(view)
}

fn apply_put(view: &mut ClusterView, keys: &ClusterKeys, kv: &KeyValue) {
    let key = String::from_utf8_lossy(kv.key());
    let result = if key.starts_with(&keys.shards_prefix()) {
        serde_json::from_slice::<ShardRecord>(kv.value()).map(|record| {
            view.shards.insert(record.id, record);
        })
    } else if key.starts_with(&keys.gateways_prefix()) {
        serde_json::from_slice::<GatewayRecord>(kv.value()).map(|record| {
            view.gateways.insert(record.id, record);
        })
    } else if let Some(id) = key.strip_prefix(&keys.drains_prefix()) {
        if let Ok(id) = id.parse::<u32>() {
            view.drains.insert(ShardId(id));
        }
        Ok(())
    } else if *key == keys.partition() {
        serde_json::from_slice::<PartitionMap>(kv.value()).map(|map| {
            // Never step back to an older epoch, whatever order events come in.
            if view.partition.as_ref().is_none_or(|old| old.epoch < map.epoch) {
                view.partition = Some(map);
            }
        })
    } else {
        Ok(())
    };
    if let Err(source) = result {
        warn!(error = %ClusterError::BadValue { key: key.to_string(), source }, "skipping key");
    }
}

fn apply_delete(view: &mut ClusterView, keys: &ClusterKeys, key: &[u8]) {
    let key = String::from_utf8_lossy(key);
    let id_after = |prefix: String| key.strip_prefix(&prefix).and_then(|s| s.parse::<u32>().ok());
    if let Some(id) = id_after(keys.shards_prefix()) {
        view.shards.remove(&ShardId(id));
    } else if let Some(id) = id_after(keys.gateways_prefix()) {
        view.gateways.remove(&GatewayId(id));
    } else if let Some(id) = id_after(keys.drains_prefix()) {
        view.drains.remove(&ShardId(id));
    }
}

async fn follow(
    mut client: Client,
    keys: ClusterKeys,
    cell: Arc<EpochCell<ClusterView>>,
    sender: watch::Sender<ClusterView>,
) {
    let mut view = sender.borrow().clone();
    let mut backoff = Duration::from_millis(100);
    // Warn when the watch is lost, not at every failed retry while etcd stays away.
    let mut healthy = true;
    loop {
        match follow_once(&mut client, &keys, &cell, &sender, &mut view).await {
            Ok(()) => debug!("watch stream ended; restarting"),
            Err(error) if healthy => {
                warn!(%error, "cluster watch lost; keeping the last view");
                healthy = false;
            }
            Err(error) => debug!(%error, "etcd still unreachable"),
        }
        if sender.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        match read_all(&mut client, &keys).await {
            Ok(fresh) => {
                backoff = Duration::from_millis(100);
                let partition = merge_partition(&view, fresh.partition.clone());
                view = ClusterView { partition, ..fresh };
                publish(&cell, &sender, &view);
                if !healthy {
                    info!(revision = view.revision, "cluster watch resynchronised");
                }
                healthy = true;
            }
            Err(error) => debug!(%error, "etcd still unreachable"),
        }
    }
}

fn merge_partition(old: &ClusterView, fresh: Option<PartitionMap>) -> Option<PartitionMap> {
    match (old.partition.clone(), fresh) {
        (Some(old), Some(new)) if old.epoch > new.epoch => Some(old),
        (old, None) => old,
        (_, new) => new,
    }
}

fn publish(cell: &EpochCell<ClusterView>, sender: &watch::Sender<ClusterView>, view: &ClusterView) {
    cell.store(view.clone());
    sender.send_replace(view.clone());
}

async fn follow_once(
    client: &mut Client,
    keys: &ClusterKeys,
    cell: &EpochCell<ClusterView>,
    sender: &watch::Sender<ClusterView>,
    view: &mut ClusterView,
) -> Result<(), ClusterError> {
    let options = WatchOptions::new().with_prefix().with_start_revision(view.revision + 1);
    let mut stream =
        client.watch(keys.root(), Some(options)).await.map_err(ClusterError::from_etcd)?;
    while let Some(response) = stream.message().await.map_err(ClusterError::from_etcd)? {
        if response.canceled() {
            return Ok(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => apply_put(view, keys, kv),
                EventType::Delete => apply_delete(view, keys, kv.key()),
            }
            view.revision = view.revision.max(kv.mod_revision());
        }
        if let Some(header) = response.header() {
            view.revision = view.revision.max(header.revision());
        }
        publish(cell, sender, view);
    }
    Ok(())
}
