//! What every worker's core shares: the read-mostly state it reads ([`Shared`]), session
//! ids, the mail the tasks beside the workers send a core ([`CoreMail`]) and the player store
//! requests it makes ([`AccountRequest`]). The channels that carry them are the shell's
//! (`meridian-gateway`'s `shared.rs`); here are only the values.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use meridian_cluster::ShardId;

use crate::ids::IdPool;
use crate::routing::Routing;
use crate::{CoreConfig, GatewayMetrics};

/// What every worker shares: read-mostly, nothing locked per message.
pub struct Shared {
    pub config: CoreConfig,
    /// Each worker's routing table, by worker index.
    pub routing: Routing,
    pub ids: Arc<IdPool>,
    pub metrics: Arc<GatewayMetrics>,
    pub stopping: Arc<AtomicBool>,
    /// Turn counter of the round-robin placement policy.
    pub round_robin: AtomicUsize,
    /// Caps on connections (per gateway, per address) and the per-connection limits.
    pub admission: crate::limits::Admission,
    /// Output queued per worker as of its last check, for the gateway-wide output budget.
    pub output_by_worker: Vec<AtomicUsize>,
    /// What login tokens are checked against.
    pub login_keys: crate::accounts::LoginKeys,
    /// Unix time for the core, from its `Instant`s (token expiries).
    pub clock: crate::accounts::UnixClock,
}

impl Shared {
    /// Records this worker's queued output; returns the gateway's total.
    pub fn report_output(&self, worker: usize, bytes: usize) -> usize {
        if let Some(mine) = self.output_by_worker.get(worker) {
            mine.store(bytes, Ordering::Relaxed);
        }
        self.output_by_worker.iter().map(|w| w.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl Shared {
    /// One worker's shared state without etcd or sockets, for the core's tests and the
    /// fuzzing harness: the config's limits and dev mode, routing by `table`, player ids
    /// from `ids`, no player store, metrics in a registry of its own.
    pub(crate) fn for_tests(
        config: CoreConfig,
        table: crate::routing::RoutingTable,
        ids: Vec<std::ops::Range<u64>>,
    ) -> Shared {
        let registry = meridian_observe::Registry::default();
        let metrics = GatewayMetrics::new(&registry, config.gateway, config.io);
        Shared {
            routing: Arc::new(vec![meridian_cluster::EpochCell::new(table)]),
            ids: crate::ids::IdPool::fixed(ids),
            metrics: Arc::new(metrics),
            stopping: Arc::new(AtomicBool::new(false)),
            round_robin: AtomicUsize::new(0),
            admission: crate::limits::Admission::new(config.limits.clone()),
            output_by_worker: vec![AtomicUsize::new(0)],
            login_keys: crate::accounts::LoginKeys::new(config.dev_mode),
            clock: crate::accounts::UnixClock::new(
                std::time::Instant::now(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            ),
            config,
        }
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl CoreConfig {
    /// A one-worker gateway's config for tests: round-robin placement, the given limits,
    /// resume tokens signed with `resume_key`, no player store.
    pub(crate) fn for_tests(
        limits: crate::limits::Limits,
        dev_mode: bool,
        resume_key: meridian_protocol::TokenKey,
    ) -> CoreConfig {
        CoreConfig {
            placement: crate::Placement::RoundRobin,
            gateway: meridian_cluster::GatewayId(1),
            io: crate::IoBackend::Epoll,
            max_frame: meridian_protocol::DEFAULT_MAX_FRAME,
            max_output_bytes: 1 << 20,
            limits,
            dev_mode,
            resume_keys: resume_key.into(),
            store: false,
        }
    }
}

/// A session id names one connection on one worker for its whole life:
/// `worker (16 bits) | slot (24 bits) | generation (24 bits)`.
pub fn session_id(worker: usize, slot: u32, generation: u32) -> u64 {
    ((worker as u64) << 48)
        | (u64::from(slot & 0x00ff_ffff) << 24)
        | u64::from(generation & 0x00ff_ffff)
}

pub fn session_parts(session: u64) -> (usize, u32, u32) {
    (
        (session >> 48) as usize,
        ((session >> 24) & 0x00ff_ffff) as u32,
        (session & 0x00ff_ffff) as u32,
    )
}

pub fn session_worker(session: u64) -> usize {
    session_parts(session).0
}

/// What a worker's core is told by the tasks beside it, through its event loop.
pub enum CoreMail {
    /// Shard output handed over directly, as if read from the shard's link: for the core's
    /// tests and the simulator's harness, which have no sockets.
    #[cfg(any(test, feature = "fuzzing"))]
    Deliveries { from: ShardId, deliveries: Vec<meridian_rpc::pb::Delivery> },
    /// This shard is gone and its region reassigned: restore its players elsewhere.
    Restore { dead: ShardId },
    /// The player store's answer to a login's [`AccountRequest`].
    Account { session: u64, answer: AccountAnswer },
}

/// A login waiting for its account's player from the player store.
#[derive(Debug, Clone)]
pub struct AccountRequest {
    pub worker: usize,
    pub session: u64,
    pub account: String,
    pub name: String,
    /// The id the player gets if the account is new (from the worker's id block).
    pub new_id: u64,
}

#[derive(Debug)]
pub enum AccountAnswer {
    Player(crate::accounts::AccountPlayer),
    /// The id offered belongs to another account: ask again with another.
    IdTaken,
    Unavailable(String),
    /// The request never reached the store: its queue was full. The login is refused
    /// `UNAVAILABLE` and may be tried again.
    Busy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_round_trip() {
        let id = session_id(3, 0x00ab_cdef, 0x0012_3456);
        assert_eq!(session_parts(id), (3, 0x00ab_cdef, 0x0012_3456));
        assert_ne!(session_id(0, 1, 0), 0, "session ids are never zero for slot > 0");
    }
}
