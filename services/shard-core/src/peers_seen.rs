//! The core's view of its peers: which shards are registered (alive as far as etcd
//! knows), each one's registration as of the last view, this shard's own incarnation, and
//! which peer streams from here are open, as the shell last said.
//!
//! Only `ShardCore` calls it: the views and the shell's reports come in through it, and
//! the core asks it whether a player may be handed to a peer and what registration a
//! handoff is made to.

use rustc_hash::{FxHashMap, FxHashSet};

use meridian_cluster::{ClusterView, ShardId};

pub(crate) struct PeersSeen {
    me: ShardId,
    /// Registered shards, from the last view.
    live: FxHashSet<ShardId>,
    /// Each live shard's registration as of the last view (see
    /// `ShardRecord::incarnation`): a change means it was replaced.
    incarnations: FxHashMap<ShardId, u64>,
    /// This shard's own incarnation: its record in etcd says it.
    incarnation: u64,
    /// Peers whose stream from here is open.
    up: FxHashSet<ShardId>,
    /// A registered peer left (or registered again: its old life left) since the last
    /// [`PeersSeen::take_departed`].
    departed: bool,
}

impl PeersSeen {
    /// As this shard `me` starts, in its `incarnation` (at least 1), knowing no peer.
    pub fn new(me: ShardId, incarnation: u64) -> PeersSeen {
        PeersSeen {
            me,
            live: FxHashSet::default(),
            incarnations: FxHashMap::default(),
            incarnation: incarnation.max(1),
            up: FxHashSet::default(),
            departed: false,
        }
    }

    /// A new cluster view: the peers it shows registered again since the last one (they
    /// were taken for dead and dropped what they held), in the view's order.
    pub fn view(&mut self, view: &ClusterView) -> Vec<ShardId> {
        let live: FxHashSet<ShardId> = view.shards.keys().copied().collect();
        self.departed |= self.live.iter().any(|s| *s != self.me && !live.contains(s));
        self.live = live;
        let replaced: Vec<ShardId> = view
            .shards
            .iter()
            .filter(|(id, record)| {
                **id != self.me
                    && self.incarnations.get(id).is_some_and(|old| *old != record.incarnation)
            })
            .map(|(id, _)| *id)
            .collect();
        self.incarnations = view.shards.iter().map(|(id, r)| (*id, r.incarnation)).collect();
        self.departed |= !replaced.is_empty();
        replaced
    }

    /// Whether a peer left (or was replaced) since the last call.
    pub fn take_departed(&mut self) -> bool {
        std::mem::take(&mut self.departed)
    }

    /// Every registered shard but this one, in id order.
    pub fn others(&self) -> Vec<ShardId> {
        let mut others: Vec<ShardId> =
            self.live.iter().copied().filter(|s| *s != self.me).collect();
        others.sort_unstable();
        others
    }

    /// The peer streams from here that are open now.
    pub fn streams_up(&mut self, up: Vec<ShardId>) {
        self.up = up.into_iter().collect();
    }

    /// Whether `shard` is this one or registered.
    pub fn live_or_me(&self, shard: ShardId) -> bool {
        shard == self.me || self.live.contains(&shard)
    }

    /// Whether another shard than this one is registered.
    pub fn others_live(&self) -> bool {
        self.live.iter().any(|s| *s != self.me)
    }

    /// Whether players may be handed to `to` now: it is registered and its peer stream is
    /// open.
    pub fn ready(&self, to: ShardId) -> bool {
        self.live.contains(&to) && self.up.contains(&to)
    }

    /// The registration of `shard` as of the last view (0: unknown).
    pub fn incarnation_of(&self, shard: ShardId) -> u64 {
        self.incarnations.get(&shard).copied().unwrap_or(0)
    }

    /// This shard's own incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This shard starts a new life (it was taken for dead): peers and gateways that see
    /// it in its record know that what they gave the old one is gone.
    pub fn new_life(&mut self) {
        self.incarnation = self.incarnation.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_cluster::ShardRecord;

    /// A view of these shards (id, incarnation), their records as etcd holds them.
    fn view(shards: &[(u32, u64)]) -> ClusterView {
        let mut view = ClusterView::default();
        for &(id, incarnation) in shards {
            let json = format!(
                r#"{{"id":{id},"grpc":"","admin":"","state":"serving","incarnation":{incarnation}}}"#
            );
            let record: ShardRecord = serde_json::from_str(&json).expect("a shard record");
            view.shards.insert(ShardId(id), record);
        }
        view
    }

    #[test]
    fn a_peer_registered_again_is_told_as_replaced_once() {
        let mut peers = PeersSeen::new(ShardId(1), 1);
        assert!(peers.view(&view(&[(1, 1), (2, 1)])).is_empty(), "first seen");
        assert_eq!(peers.view(&view(&[(1, 5), (2, 2), (3, 1)])), [ShardId(2)], "not itself");
        assert!(peers.view(&view(&[(1, 5), (2, 2), (3, 1)])).is_empty());
        assert_eq!(peers.incarnation_of(ShardId(2)), 2);
        assert_eq!(peers.incarnation_of(ShardId(9)), 0);
    }

    #[test]
    fn a_peer_is_ready_when_registered_and_its_stream_is_open() {
        let mut peers = PeersSeen::new(ShardId(1), 0);
        peers.view(&view(&[(1, 1), (2, 1)]));
        assert!(!peers.ready(ShardId(2)), "no stream yet");
        peers.streams_up(vec![ShardId(2), ShardId(3)]);
        assert!(peers.ready(ShardId(2)));
        assert!(!peers.ready(ShardId(3)), "not registered");
        assert!(
            peers.others_live() && peers.live_or_me(ShardId(1)) && !peers.live_or_me(ShardId(3))
        );
        assert_eq!(peers.incarnation(), 1, "at least 1");
        peers.new_life();
        assert_eq!(peers.incarnation(), 2);
    }
}
