//! The door before trust: connections a port has accepted but cannot yet tell from a
//! stranger's (no certificate shown, no request head, no session stream), bounded per
//! source address and in all, so that strangers holding connections open cannot keep a
//! genuine peer out.
//!
//! A port asks [`Gate::admit`] for a [`Pass`] for each connection it accepts, and drops
//! the pass once the connection has shown what it is. Two bounds:
//!
//! - **Per address** (an IPv6 /64 counts as one address): past [`GateLimits::per_address`]
//!   passes held from one address, the next connection from it is refused at once, so one
//!   address cannot fill the port.
//! - **In all**: past [`GateLimits::max`], the newcomer takes the place of the *oldest*
//!   pass that has not [`Pass::spoke`] (sent its first byte), or failing one the oldest
//!   not [`Pass::busy`]; that one is told to close ([`Pass::evicted`]). A genuine peer
//!   speaks as soon as it is connected and holds its pass for a round trip or two; a
//!   connection held open in silence, or dribbling, grows old, so it is the one that goes.
//!   Strangers from many addresses can then keep a peer out only by opening connections
//!   faster than `max` per peer round trip, not by holding them.
//!
//! Beside both, every port gives a pass a short deadline ([`Pass::within`]). Everything is
//! counted in `/metrics`: `meridian_untrusted_connections{port}` (passes held) and
//! `meridian_untrusted_connections_closed_total{port,reason}` with `reason` one of
//! `per_address`, `evicted`, `deadline`, `full` (every pass was busy).
//!
//! This lives in `meridian-observe` because its admin port needs it and it is the one
//! crate that port and the other gated ports (`meridian-tls`, the shard's plain port, the
//! gateway's QUIC front) all depend on.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::{CounterFamily, Registry};

/// How many connections a [`Gate`] lets wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateLimits {
    /// Passes held from one address (an IPv6 /64) at most.
    pub per_address: usize,
    /// Passes held in all at most; past it the oldest not busy is evicted.
    pub max: usize,
}

/// Why a connection was closed before it showed what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// A newcomer took its place (the port was full and it was the oldest).
    Evicted,
    /// It did not finish within its deadline.
    Deadline,
}

struct Waiting {
    address: IpAddr,
    evict: Arc<Notify>,
    busy: Arc<AtomicBool>,
    spoke: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    /// By admission order: the first is the oldest.
    next: u64,
    waiting: BTreeMap<u64, Waiting>,
    per_address: HashMap<IpAddr, usize>,
}

impl State {
    /// Forgets pass `id`; false if it was not held (already evicted).
    fn remove(&mut self, id: u64) -> bool {
        let Some(gone) = self.waiting.remove(&id) else { return false };
        if let Some(n) = self.per_address.get_mut(&gone.address) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&gone.address);
            }
        }
        true
    }
}

/// The passes of one port. See the module documentation.
pub struct Gate {
    limits: GateLimits,
    state: Mutex<State>,
    closed: CounterFamily,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// The reasons of `meridian_untrusted_connections_closed_total`.
const REASONS: [&str; 4] = ["per_address", "evicted", "deadline", "full"];

impl Gate {
    /// A gate for the port named `port` (`grpc`, `admin`, `quic`), its gauge and counters
    /// registered in `registry` with the label `port`.
    pub fn new(port: &'static str, limits: GateLimits, registry: &Registry) -> Arc<Gate> {
        let labels = [("port", port)];
        let closed = registry.counter_family(
            "meridian_untrusted_connections_closed_total",
            "Connections closed before they showed what they are: refused because their \
             address held its share (per_address) or every place was busy (full), evicted by \
             a newcomer as the oldest waiting (evicted), or late (deadline).",
            &labels,
            "reason",
            REASONS,
        );
        let gate = Arc::new(Gate { limits, state: Mutex::new(State::default()), closed });
        let held = Arc::clone(&gate);
        registry.gauge_fn(
            "meridian_untrusted_connections",
            "Connections accepted that have not yet shown what they are (no certificate, \
             request or stream yet).",
            &labels,
            move || i64::try_from(held.waiting()).unwrap_or(i64::MAX),
        );
        gate
    }

    pub fn limits(&self) -> GateLimits {
        self.limits
    }

    /// Connections holding a pass now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The closes counted for `reason` (one of `per_address`, `evicted`, `deadline`, `full`).
    pub fn closed(&self, reason: &str) -> u64 {
        self.closed.get(reason)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("invariant: the gate's lock is never poisoned")
    }

    /// A pass for a connection from `peer`, or `None` (counted) if the connection should be
    /// closed at once: its address holds its share, or every pass is busy. When the gate is
    /// full, the oldest pass not busy is evicted to make room.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Pass> {
        self.admit_as(peer, false)
    }

    /// [`Gate::admit`], without the per-address share when `exempt` (an address the node
    /// is told to trust with more, such as loopback under `meridian up`).
    pub fn admit_as(self: &Arc<Self>, peer: IpAddr, exempt: bool) -> Option<Pass> {
        let address = address_key(peer);
        let mut state = self.lock();
        let held = state.per_address.get(&address).copied().unwrap_or(0);
        if !exempt && held >= self.limits.per_address {
            drop(state);
            self.closed.inc("per_address");
            return None;
        }
        if state.waiting.len() >= self.limits.max {
            let idle = |w: &&Waiting| !w.busy.load(Ordering::Relaxed);
            let silent = |w: &&Waiting| idle(w) && !w.spoke.load(Ordering::Relaxed);
            let oldest = |keep: &dyn Fn(&&Waiting) -> bool| {
                state
                    .waiting
                    .iter()
                    .find(|(_, w)| keep(w))
                    .map(|(&id, w)| (id, Arc::clone(&w.evict)))
            };
            let oldest = oldest(&silent).or_else(|| oldest(&idle));
            let Some((id, evict)) = oldest else {
                drop(state);
                self.closed.inc("full");
                return None;
            };
            state.remove(id);
            // A permit is kept if its holder is not waiting yet: it sees it when it does.
            evict.notify_one();
            self.closed.inc("evicted");
        }
        let id = state.next;
        state.next += 1;
        let evict = Arc::new(Notify::new());
        let (busy, spoke) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let waiting = Waiting {
            address,
            evict: Arc::clone(&evict),
            busy: Arc::clone(&busy),
            spoke: Arc::clone(&spoke),
        };
        state.waiting.insert(id, waiting);
        *state.per_address.entry(address).or_insert(0) += 1;
        Some(Pass { gate: Arc::clone(self), id, evict, busy, spoke })
    }
}

/// A connection's place at the [`Gate`]; dropping it frees the place.
pub struct Pass {
    gate: Arc<Gate>,
    id: u64,
    evict: Arc<Notify>,
    busy: Arc<AtomicBool>,
    spoke: Arc<AtomicBool>,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Pass {
    /// Resolves when a newcomer took this pass's place: close the connection.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Marks the connection as being answered (not to be evicted) or not.
    pub fn busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// Marks the connection as having sent its first byte: while silent ones wait, they
    /// are evicted before it.
    pub fn spoke(&self) {
        self.spoke.store(true, Ordering::Relaxed);
    }

    /// Counts the connection as closed at a deadline its port keeps itself (the admin
    /// port's request-head deadline, which hyper enforces).
    pub fn deadline_passed(&self) {
        self.gate.closed.inc("deadline");
    }

    /// Runs `work` until it is done, the pass is evicted or `within` passed (counted as
    /// `deadline`).
    pub async fn within<F: Future>(&self, within: Duration, work: F) -> Result<F::Output, Cut> {
        tokio::select! {
            done = tokio::time::timeout(within, work) => done.map_err(|_| {
                self.gate.closed.inc("deadline");
                Cut::Deadline
            }),
            () = self.evicted() => Err(Cut::Evicted),
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.lock().remove(self.id);
    }
}

/// The address a connection counts against: an IPv4 address (also when IPv4-mapped), or
/// the /64 of an IPv6 one (what one host is usually given).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(per_address: usize, max: usize) -> (Arc<Gate>, Registry) {
        let registry = Registry::default();
        (Gate::new("test", GateLimits { per_address, max }, &registry), registry)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_gets_its_share_and_no_more() {
        let (gate, registry) = gate(2, 10);
        let a = [gate.admit(ip("10.0.0.1")), gate.admit(ip("10.0.0.1"))];
        assert!(a.iter().all(Option::is_some));
        assert!(gate.admit(ip("10.0.0.1")).is_none(), "a third from one address");
        assert!(gate.admit(ip("::ffff:10.0.0.1")).is_none(), "the same address, IPv4-mapped");
        assert!(gate.admit(ip("10.0.0.2")).is_some(), "another address");
        let exempt = gate.admit_as(ip("10.0.0.1"), true);
        assert!(exempt.is_some(), "an exempt address has no share");
        drop(exempt);
        let v6 = [gate.admit(ip("2001:db8::1")), gate.admit(ip("2001:db8::2"))];
        assert!(v6.iter().all(Option::is_some));
        assert!(gate.admit(ip("2001:db8::3")).is_none(), "one /64 is one address");
        assert_eq!(gate.closed("per_address"), 3);
        drop(a);
        assert!(gate.admit(ip("10.0.0.1")).is_some(), "a dropped pass frees its place");
        let text = registry.render();
        assert!(
            text.contains("meridian_untrusted_connections_closed_total{port=\"test\",reason=\"per_address\"} 3"),
            "{text}"
        );
        assert!(text.contains("meridian_untrusted_connections{port=\"test\"} 2\n"), "{text}");
    }

    #[tokio::test]
    async fn a_full_gate_evicts_the_oldest_that_is_not_busy() {
        let (gate, _) = gate(10, 3);
        let first = gate.admit(ip("10.0.0.1")).unwrap();
        first.busy(true);
        let second = gate.admit(ip("10.0.0.2")).unwrap();
        let third = gate.admit(ip("10.0.0.3")).unwrap();
        let fourth = gate.admit(ip("10.0.0.4")).unwrap();
        assert_eq!(gate.waiting(), 3);
        assert_eq!(gate.closed("evicted"), 1);
        // The second, not the busy first: it is told at once, even before it waits.
        assert_eq!(
            second.within(Duration::from_secs(5), std::future::pending::<()>()).await,
            Err(Cut::Evicted)
        );
        drop(second);
        assert_eq!(gate.waiting(), 3, "an evicted pass dropped frees nothing twice");
        third.busy(true);
        fourth.busy(true);
        assert!(gate.admit(ip("10.0.0.5")).is_none(), "every place busy");
        assert_eq!(gate.closed("full"), 1);
        drop(third);
        assert!(gate.admit(ip("10.0.0.5")).is_some());
        drop(first);
    }

    /// A connection that spoke outlives silent ones older than it.
    #[tokio::test]
    async fn silent_passes_go_before_those_that_spoke() {
        let (gate, _) = gate(10, 3);
        let spoke = gate.admit(ip("10.0.0.1")).unwrap();
        spoke.spoke();
        let silent = [gate.admit(ip("10.0.0.2")).unwrap(), gate.admit(ip("10.0.0.3")).unwrap()];
        let new = gate.admit(ip("10.0.0.4")).unwrap();
        new.spoke();
        let cut = silent[0].within(Duration::from_secs(5), std::future::pending::<()>()).await;
        assert_eq!(cut, Err(Cut::Evicted), "the oldest silent one");
        let newer = gate.admit(ip("10.0.0.5")).unwrap();
        newer.spoke();
        let cut = silent[1].within(Duration::from_secs(5), std::future::pending::<()>()).await;
        assert_eq!(cut, Err(Cut::Evicted), "the next silent one, still before the one that spoke");
        let _newest = gate.admit(ip("10.0.0.6")).unwrap();
        let cut = spoke.within(Duration::from_secs(5), std::future::pending::<()>()).await;
        assert_eq!(cut, Err(Cut::Evicted), "with only speakers left, the oldest of them");
    }

    #[tokio::test]
    async fn a_late_pass_is_cut_and_counted() {
        let (gate, _) = gate(10, 10);
        let pass = gate.admit(ip("10.0.0.1")).unwrap();
        let slow = pass.within(Duration::from_millis(20), std::future::pending::<()>()).await;
        assert_eq!(slow, Err(Cut::Deadline));
        assert_eq!(gate.closed("deadline"), 1);
        assert_eq!(pass.within(Duration::from_secs(1), async { 7 }).await, Ok(7));
    }
}
