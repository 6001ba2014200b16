//! The etcd model: members with leases, the partition map with epochs as the coordinator
//! writes it, and every version of the view, so each node's watch can lag on its own.

use std::collections::BTreeSet;

use meridian_cluster::{
    compute_partition, Bounds, ClusterView, LoadProfile, PartitionMap, Region, ShardId,
    ShardRecord, ShardState,
};
use meridian_rpc::pb::{peer_message::Kind as Peer, player_input::Kind as Input};
use meridian_rpc::pb::{PeerMessage, PlayerInput};

/// Narrowest a region may become when a border moves (the coordinator's balancer's
/// `MIN_SPAN`).
const MIN_SPAN: u32 = 20;

pub struct Etcd {
    /// Every view written, by version (0: nothing yet).
    versions: Vec<ClusterView>,
    map: u32,
    members: BTreeSet<u32>,
    /// Each member's incarnation (`ShardRecord::incarnation`).
    incarnations: std::collections::BTreeMap<u32, u64>,
    epoch: u64,
}

impl Etcd {
    pub fn new(map: u32, shards: Vec<u32>) -> Etcd {
        let mut etcd = Etcd {
            versions: vec![ClusterView::default()],
            map,
            incarnations: shards.iter().map(|&s| (s, 1)).collect(),
            members: shards.into_iter().collect(),
            epoch: 0,
        };
        etcd.repartition();
        etcd
    }

    pub fn version(&self) -> usize {
        self.versions.len() - 1
    }

    pub fn view(&self, version: usize) -> &ClusterView {
        &self.versions[version.min(self.version())]
    }

    pub fn current(&self) -> &ClusterView {
        self.view(self.version())
    }

    pub fn has(&self, shard: u32) -> bool {
        self.members.contains(&shard)
    }

    /// A shard registered (its record saying which incarnation it is): the coordinator
    /// lays the map out again.
    pub fn add(&mut self, shard: u32, incarnation: u64) {
        self.members.insert(shard);
        self.incarnations.insert(shard, incarnation);
        self.repartition();
    }

    /// A shard's lease expired: it leaves, and its region is given to the others.
    pub fn remove(&mut self, shard: u32) -> bool {
        if self.members.len() < 2 || !self.members.remove(&shard) {
            return false;
        }
        self.repartition();
        true
    }

    /// Moves one border (picked by `pick`) by `shift` cells, as the load balancer does;
    /// false if that would make a region narrower than the balancer allows.
    pub fn move_border(&mut self, pick: u64, shift: i32) -> bool {
        let Some(partition) = self.current().partition.clone() else { return false };
        let mut regions = partition.regions.clone();
        // Interior cuts: vertical ones (x) across the map, horizontal ones (y) within a
        // column (regions sharing x0..x1).
        let mut cuts: Vec<(bool, u32, u32, u32)> = Vec::new();
        for r in &regions {
            if r.x0 > 0 {
                cuts.push((true, r.x0, 0, 0));
            }
            if r.y0 > 0 {
                cuts.push((false, r.y0, r.x0, r.x1));
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        if cuts.is_empty() || shift == 0 {
            return false;
        }
        let (vertical, at, x0, x1) = cuts[(pick % cuts.len() as u64) as usize];
        let Some(to) = at.checked_add_signed(shift) else { return false };
        let fits = regions.iter().all(|r| {
            if vertical {
                (r.x1 != at || to >= r.x0 + MIN_SPAN) && (r.x0 != at || r.x1 >= to + MIN_SPAN)
            } else if (r.x0, r.x1) == (x0, x1) {
                (r.y1 != at || to >= r.y0 + MIN_SPAN) && (r.y0 != at || r.y1 >= to + MIN_SPAN)
            } else {
                true
            }
        });
        if !fits {
            return false;
        }
        for r in regions.iter_mut() {
            if vertical {
                if r.x1 == at {
                    r.x1 = to;
                }
                if r.x0 == at {
                    r.x0 = to;
                }
            } else if (r.x0, r.x1) == (x0, x1) {
                if r.y1 == at {
                    r.y1 = to;
                }
                if r.y0 == at {
                    r.y0 = to;
                }
            }
        }
        self.write(regions);
        true
    }

    /// One round of the coordinator's balancer on the shards' reported `loads`, with sight
    /// `sight`: true if it moved a border (a new epoch).
    pub fn rebalance(
        &mut self,
        loads: &std::collections::BTreeMap<u32, LoadProfile>,
        sight: u32,
    ) -> bool {
        let mut view = self.current().clone();
        let Some(partition) = view.partition.clone() else { return false };
        for (id, record) in view.shards.iter_mut() {
            let load = loads.get(&id.0).cloned().unwrap_or_default();
            record.players = load.x.iter().map(|&n| u64::from(n)).sum();
            record.load = load;
        }
        let bounds = Bounds { width: self.map, height: self.map, sight };
        match meridian_cluster::rebalance(&partition.regions, &view, bounds) {
            Some(regions) if regions != partition.regions => {
                self.write(regions);
                true
            }
            _ => false,
        }
    }

    fn repartition(&mut self) {
        let shards: Vec<ShardId> = self.members.iter().map(|s| ShardId(*s)).collect();
        let regions = compute_partition(&shards, self.map, self.map);
        self.write(regions);
    }

    fn write(&mut self, regions: Vec<Region>) {
        self.epoch += 1;
        let shards = self
            .members
            .iter()
            .map(|&s| {
                let record = ShardRecord {
                    id: ShardId(s),
                    grpc: String::new(),
                    admin: String::new(),
                    state: ShardState::Serving,
                    players: 0,
                    load: Default::default(),
                    incarnation: self.incarnations.get(&s).copied().unwrap_or(1),
                    transport: None,
                };
                (ShardId(s), record)
            })
            .collect();
        let partition =
            PartitionMap { epoch: self.epoch, width: self.map, height: self.map, regions };
        let revision = self.versions.len() as i64;
        let view =
            ClusterView { shards, partition: Some(partition), revision, ..Default::default() };
        self.versions.push(view);
    }
}

/// A peer message, briefly, for traces.
pub fn describe(m: &PeerMessage) -> String {
    let version = format!("player {} v{}.{}", m.player_id, m.generation, m.subject_seq);
    match &m.kind {
        Some(Peer::Upsert(u)) => format!("{version} Upsert {:?}", u.position.map(|p| (p.x, p.y))),
        Some(Peer::Moved(p)) => format!("{version} Moved ({}, {})", p.x, p.y),
        Some(Peer::Chat(_)) => format!("{version} Chat"),
        Some(Peer::Remove(r)) => format!(
            "{version} Remove left_world={} {:?}",
            r.left_world,
            r.position.map(|p| (p.x, p.y))
        ),
        Some(Peer::Released(r)) => format!("{version} Released to {}", r.new_owner),
        Some(Peer::Handoff(h)) => format!(
            "{version} Handoff at {:?} next_seq {} view of {}",
            h.position.map(|p| (p.x, p.y)),
            h.next_seq,
            h.view.len()
        ),
        Some(Peer::Forwarded(input)) => format!("{version} Forwarded {}", describe_input(input)),
        Some(Peer::HandoffAck(_)) => format!("{version} HandoffAck"),
        Some(Peer::Needed(n)) => format!("{version} Needed by {}", n.holder),
        Some(Peer::State(_)) => format!("{version} State"),
        Some(Peer::Action(a)) => format!("{version} Action from {}", a.actor),
        Some(Peer::Answer(a)) => format!("{version} Answer t{}", a.client_time),
        Some(Peer::EntityMessage(m)) => format!("{version} EntityMessage from {}", m.from),
        Some(Peer::Event(e)) => format!("{version} Event to {}", e.to),
        Some(Peer::Claim(c)) => format!("{version} Claim stamp {}", c.login_stamp),
        None => format!("{version} (empty)"),
    }
}

/// A relayed input, briefly, for traces.
pub fn describe_input(input: &PlayerInput) -> String {
    let kind = match &input.kind {
        Some(Input::Join(j)) => format!(
            "Join {:?} restore={} gen {}",
            j.spawn.map(|p| (p.x, p.y)),
            j.restore,
            j.generation
        ),
        Some(Input::Move(m)) => format!("Move dir {} t{}", m.direction, m.client_time),
        Some(Input::Chat(_)) => "Chat".into(),
        Some(Input::Ping(_)) => "Ping".into(),
        Some(Input::Leave(l)) => format!("Leave logout={}", l.logout),
        Some(Input::Resume(_)) => "Resume".into(),
        Some(Input::Refused(r)) => format!("Refused t{}", r.client_time),
        Some(Input::Action(a)) => format!("Action {} t{}", a.kind, a.client_time),
        None => "(empty)".into(),
    };
    format!("player {} seq {} {kind}", input.player_id, input.seq)
}

/// A shard's delivery for one connection, briefly, for traces: its frames decoded.
pub fn describe_delivery(delivery: &meridian_rpc::pb::Delivery) -> String {
    use meridian_protocol::pb::{server_message::Kind as S, ServerMessage};
    use prost::Message;
    let mut frames = &delivery.frames[..];
    let mut shown = Vec::new();
    while let Ok(Some(header)) = meridian_protocol::next_frame(frames, usize::MAX) {
        let text = match ServerMessage::decode(header.body(frames)).ok().and_then(|m| m.kind) {
            Some(S::Entered(e)) => format!("Entered {}", e.player_id),
            Some(S::Moved(m)) => format!("Moved {} t{}", m.player_id, m.client_time),
            Some(S::Left(l)) => format!("Left {}", l.player_id),
            Some(S::ViewReset(_)) => "ViewReset".into(),
            Some(S::LoginOk(_)) => "LoginOk".into(),
            Some(S::Error(e)) => format!("Error t{}", e.client_time),
            Some(other) => format!("{other:?}").chars().take(20).collect(),
            None => "?".into(),
        };
        shown.push(text);
        frames = &frames[header.total_len()..];
    }
    format!(
        "[{}] answers {} released_to {} close {}",
        shown.join(", "),
        delivery.move_answers,
        delivery.released_to,
        delivery.close
    )
}
