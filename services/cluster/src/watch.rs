//! Keeps a node's [`ClusterView`] in step with etcd: one prefix read, then a watch.
//!
//! If etcd goes away the last view stays in place (the cluster keeps serving with the last
//! known map) and the watcher reconnects with backoff, starting over with a full read.
//!
//! **Lapsed records.** A member's record that disappears while this node itself could not
//! reach etcd in time (its [`EtcdContact`] says so: a lost watch, a keep-alive unanswered),
//! or that is missing from the full read after such trouble, is not taken for a death: a
//! stalled etcd expires every lease that fell due while it was stopped the moment it
//! resumes, live members included. The record stays in the view, *lapsed*, for the
//! contact's grace period, in which a live member re-registers (its record is then simply
//! current again). Only a record still missing after the grace is removed, and then
//! everyone reacts as to a death (the coordinator reassigns the region, gateways restore
//! the players). Without this, every gateway would close its relay links to every shard
//! (players parked, moves in flight lost) and the coordinator would redraw the map around
//! whichever shards re-registered first. Deaths while etcd is healthy are seen at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::keys::ClusterKeys;
use crate::model::{
    ClusterView, GatewayId, GatewayRecord, PartitionMap, PlayerOrder, ShardId, ShardRecord,
};
use crate::{ClusterError, EpochCell, EtcdContact};

/// A running watch of the cluster prefix.
pub struct ClusterWatch {
    view: Arc<EpochCell<ClusterView>>,
    changes: watch::Receiver<ClusterView>,
}

impl ClusterWatch {
    /// Reads the whole prefix once (so the caller starts with a real view), then follows it,
    /// with a contact of its own (for one-shot readers such as `meridian status`).
    pub async fn start(client: Client, keys: ClusterKeys) -> Result<Self, ClusterError> {
        ClusterWatch::start_with(client, keys, EtcdContact::default()).await
    }

    /// [`Self::start`] for a member: `contact` is shared with its registration, so that
    /// records lapse (rather than vanish) after trouble either of them had with etcd.
    pub async fn start_with(
        client: Client,
        keys: ClusterKeys,
        contact: EtcdContact,
    ) -> Result<Self, ClusterError> {
        let mut client = client;
        let initial = read_all(&mut client, &keys).await?;
        let view = Arc::new(EpochCell::new(initial.clone()));
        let (sender, changes) = watch::channel(initial);
        let publisher =
            Publisher { cell: Arc::clone(&view), sender, contact, lapsed: Default::default() };
        tokio::spawn(follow(client, keys, publisher));
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
    } else if let Some(player) = key.strip_prefix(&keys.orders_prefix()) {
        match player.parse::<u64>() {
            Ok(player) => serde_json::from_slice::<PlayerOrder>(kv.value()).map(|order| {
                view.orders.insert(player, order);
            }),
            Err(_) => Ok(()),
        }
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

/// A member's record by its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Member {
    Shard(ShardId),
    Gateway(GatewayId),
}

fn member_of(keys: &ClusterKeys, key: &[u8]) -> Option<Member> {
    let key = String::from_utf8_lossy(key);
    let id_after = |prefix: String| key.strip_prefix(&prefix).and_then(|s| s.parse::<u32>().ok());
    if let Some(id) = id_after(keys.shards_prefix()) {
        Some(Member::Shard(ShardId(id)))
    } else {
        id_after(keys.gateways_prefix()).map(|id| Member::Gateway(GatewayId(id)))
    }
}

fn remove_member(view: &mut ClusterView, member: Member) {
    match member {
        Member::Shard(id) => {
            view.shards.remove(&id);
        }
        Member::Gateway(id) => {
            view.gateways.remove(&id);
        }
    }
}

/// A deleted key that is not a member's record (those go through [`Publisher::deleted`]).
fn apply_delete(view: &mut ClusterView, keys: &ClusterKeys, key: &[u8]) {
    let key = String::from_utf8_lossy(key);
    if let Some(id) = key.strip_prefix(&keys.drains_prefix()).and_then(|s| s.parse::<u32>().ok()) {
        view.drains.remove(&ShardId(id));
    }
    if let Some(player) =
        key.strip_prefix(&keys.orders_prefix()).and_then(|s| s.parse::<u64>().ok())
    {
        view.orders.remove(&player);
    }
}

/// Publishes the view, and keeps the records that lapsed after trouble with etcd (see the
/// module comment) until their members re-register or the grace runs out.
struct Publisher {
    cell: Arc<EpochCell<ClusterView>>,
    sender: watch::Sender<ClusterView>,
    contact: EtcdContact,
    /// Lapsed records, kept in the published view until the instant given.
    lapsed: BTreeMap<Member, tokio::time::Instant>,
}

impl Publisher {
    fn publish(&self, view: &ClusterView) {
        self.cell.store(view.clone());
        self.sender.send_replace(view.clone());
    }

    /// Whether the record of a member whose key is gone stays for now, lapsed: it already
    /// is, or this node had trouble with etcd lately (then its grace starts now).
    fn keeps(&mut self, member: Member) -> bool {
        if self.lapsed.contains_key(&member) {
            return true;
        }
        if !self.contact.recently_lost() {
            return false;
        }
        info!(
            ?member,
            grace = ?self.contact.grace(),
            "lease lapsed after trouble with etcd; keeping the record while it re-registers"
        );
        self.lapsed.insert(member, tokio::time::Instant::now() + self.contact.grace());
        true
    }

    /// A member's key was deleted: its record goes, unless it lapses.
    fn deleted(&mut self, view: &mut ClusterView, member: Member) {
        let present = match member {
            Member::Shard(id) => view.shards.contains_key(&id),
            Member::Gateway(id) => view.gateways.contains_key(&id),
        };
        if !(present && self.keeps(member)) {
            self.lapsed.remove(&member);
            remove_member(view, member);
        }
    }

    /// A member's key was written: current again, not lapsed.
    fn written(&mut self, member: Member) {
        if self.lapsed.remove(&member).is_some() {
            info!(?member, "lapsed record re-registered");
        }
    }

    /// A full read after the watch was lost: `fresh` replaces `old`, except that records
    /// missing from it lapse (the watch was lost: this node had trouble with etcd).
    fn resynchronised(&mut self, old: &ClusterView, fresh: ClusterView) -> ClusterView {
        let partition = merge_partition(old, fresh.partition.clone());
        let mut view = ClusterView { partition, ..fresh };
        for (id, record) in &old.shards {
            if view.shards.contains_key(id) {
                self.written(Member::Shard(*id));
            } else if self.keeps(Member::Shard(*id)) {
                view.shards.insert(*id, record.clone());
            }
        }
        for (id, record) in &old.gateways {
            if view.gateways.contains_key(id) {
                self.written(Member::Gateway(*id));
            } else if self.keeps(Member::Gateway(*id)) {
                view.gateways.insert(*id, record.clone());
            }
        }
        view
    }

    /// When the next lapsed record runs out of grace, if any does.
    fn next_expiry(&self) -> Option<tokio::time::Instant> {
        self.lapsed.values().min().copied()
    }

    /// Removes the records whose grace has run out; whether any was.
    fn expire(&mut self, view: &mut ClusterView) -> bool {
        let now = tokio::time::Instant::now();
        let expired: Vec<Member> =
            self.lapsed.iter().filter(|(_, until)| **until <= now).map(|(m, _)| *m).collect();
        for member in &expired {
            warn!(?member, "lapsed record not renewed within the grace; the member is gone");
            self.lapsed.remove(member);
            remove_member(view, *member);
        }
        !expired.is_empty()
    }
}

async fn follow(mut client: Client, keys: ClusterKeys, mut publisher: Publisher) {
    let mut view = publisher.sender.borrow().clone();
    let mut backoff = Duration::from_millis(100);
    // Warn when the watch is lost, not at every failed retry while etcd stays away.
    let mut healthy = true;
    loop {
        match follow_once(&mut client, &keys, &mut publisher, &mut view).await {
            Ok(()) => debug!("watch stream ended; restarting"),
            Err(error) if healthy => {
                publisher.contact.lost();
                warn!(%error, "cluster watch lost; keeping the last view");
                healthy = false;
            }
            Err(error) => {
                publisher.contact.lost();
                debug!(%error, "etcd still unreachable");
            }
        }
        if publisher.sender.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        match read_all(&mut client, &keys).await {
            Ok(fresh) => {
                backoff = Duration::from_millis(100);
                view = publisher.resynchronised(&view, fresh);
                publisher.publish(&view);
                if !healthy {
                    info!(
                        revision = view.revision,
                        lapsed = publisher.lapsed.len(),
                        "cluster watch resynchronised"
                    );
                }
                healthy = true;
            }
            Err(error) => {
                publisher.contact.lost();
                debug!(%error, "etcd still unreachable");
            }
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

/// Follows the watch until it ends or fails; meanwhile removes lapsed records whose grace
/// has run out (only while etcd answers: during an outage nothing is taken for dead).
async fn follow_once(
    client: &mut Client,
    keys: &ClusterKeys,
    publisher: &mut Publisher,
    view: &mut ClusterView,
) -> Result<(), ClusterError> {
    let options = WatchOptions::new().with_prefix().with_start_revision(view.revision + 1);
    let mut stream =
        client.watch(keys.root(), Some(options)).await.map_err(ClusterError::from_etcd)?;
    loop {
        let expiry = publisher.next_expiry();
        let message = tokio::select! {
            message = stream.message() => message.map_err(ClusterError::from_etcd)?,
            () = sleep_until(expiry) => {
                if publisher.expire(view) {
                    publisher.publish(view);
                }
                continue;
            }
        };
        let Some(response) = message else { return Ok(()) };
        if response.canceled() {
            return Ok(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let member = member_of(keys, kv.key());
            match (event.event_type(), member) {
                (EventType::Put, member) => {
                    if let Some(member) = member {
                        publisher.written(member);
                    }
                    apply_put(view, keys, kv);
                }
                (EventType::Delete, Some(member)) => publisher.deleted(view, member),
                (EventType::Delete, None) => apply_delete(view, keys, kv.key()),
            }
            view.revision = view.revision.max(kv.mod_revision());
        }
        if let Some(header) = response.header() {
            view.revision = view.revision.max(header.revision());
        }
        publisher.expire(view);
        publisher.publish(view);
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ShardState;

    fn record(id: u32) -> ShardRecord {
        ShardRecord {
            id: ShardId(id),
            grpc: format!("127.0.0.1:{}", 7000 + id),
            admin: format!("127.0.0.1:{}", 8000 + id),
            state: ShardState::Serving,
            players: 0,
            load: Default::default(),
            incarnation: 1,
            transport: None,
        }
    }

    /// A view with shards 1 and 2, and its publisher with the given grace.
    fn setup(grace: Duration) -> (Publisher, ClusterView) {
        let mut view = ClusterView::default();
        for id in [1, 2] {
            view.shards.insert(ShardId(id), record(id));
        }
        let (sender, _) = watch::channel(view.clone());
        let publisher = Publisher {
            cell: Arc::new(EpochCell::new(view.clone())),
            sender,
            contact: EtcdContact::new(grace),
            lapsed: Default::default(),
        };
        (publisher, view)
    }

    #[test]
    fn a_deletion_while_etcd_answers_is_a_death() {
        let (mut publisher, mut view) = setup(Duration::from_secs(60));
        publisher.deleted(&mut view, Member::Shard(ShardId(2)));
        assert!(!view.shards.contains_key(&ShardId(2)));
        assert!(publisher.lapsed.is_empty());
    }

    #[test]
    fn a_deletion_after_trouble_lapses_until_the_member_writes_again() {
        let (mut publisher, mut view) = setup(Duration::from_secs(60));
        publisher.contact.lost();
        publisher.deleted(&mut view, Member::Shard(ShardId(2)));
        assert_eq!(view.shards.get(&ShardId(2)), Some(&record(2)), "kept while it lapses");
        assert!(!publisher.expire(&mut view), "the grace has not run out");
        publisher.written(Member::Shard(ShardId(2)));
        assert!(publisher.lapsed.is_empty(), "current again");
        // Deleted again while the trouble is still recent: a new lapse, with a new grace.
        publisher.deleted(&mut view, Member::Shard(ShardId(2)));
        assert!(publisher.lapsed.contains_key(&Member::Shard(ShardId(2))));
    }

    #[test]
    fn a_lapsed_record_goes_when_its_grace_runs_out() {
        let (mut publisher, mut view) = setup(Duration::from_millis(30));
        publisher.contact.lost();
        publisher.deleted(&mut view, Member::Shard(ShardId(1)));
        assert!(view.shards.contains_key(&ShardId(1)));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !publisher.expire(&mut view) {
            assert!(std::time::Instant::now() < deadline, "the grace should run out");
            std::thread::yield_now();
        }
        assert!(!view.shards.contains_key(&ShardId(1)), "gone after the grace");
        assert!(view.shards.contains_key(&ShardId(2)), "the other untouched");
        assert_eq!(publisher.next_expiry(), None);
    }

    #[test]
    fn a_full_read_after_a_lost_watch_keeps_missing_members_lapsed() {
        let (mut publisher, view) = setup(Duration::from_secs(60));
        // The watch was lost (etcd stalled), and when it answers again it has expired
        // every lease: shard 2 has re-registered already, shard 1 not yet.
        publisher.contact.lost();
        let mut fresh = ClusterView { revision: 40, ..ClusterView::default() };
        fresh.shards.insert(ShardId(2), ShardRecord { players: 5, ..record(2) });
        let merged = publisher.resynchronised(&view, fresh);
        assert_eq!(merged.revision, 40);
        assert_eq!(merged.shards.get(&ShardId(1)), Some(&record(1)), "lapsed, kept");
        assert_eq!(merged.shards[&ShardId(2)].players, 5, "the fresh record wins");
        assert_eq!(publisher.lapsed.keys().collect::<Vec<_>>(), [&Member::Shard(ShardId(1))]);
    }

    #[test]
    fn without_trouble_a_full_read_is_taken_as_it_is() {
        let (mut publisher, view) = setup(Duration::from_secs(60));
        let merged = publisher.resynchronised(&view, ClusterView::default());
        assert!(merged.shards.is_empty());
        assert!(publisher.lapsed.is_empty());
    }
}
