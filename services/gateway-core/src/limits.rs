//! What one client, one address and all clients together may cost a gateway.
//!
//! Everything here is sans-IO: token buckets that take `now` from the caller, the
//! per-connection input budget, and the admission decision for a new connection (caps on
//! connections per gateway and per address, a connection rate per address). The event
//! loops ask; they never decide. Every limit is documented in README.md ("Limits") with
//! its flag, what the client sees and the metric that counts it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use meridian_protocol::encode_frame;
use meridian_protocol::pb::ErrorCode;
use meridian_protocol::server;

/// What one token costs, in credit units: integer credit keeps "the 21st move is refused"
/// exact and the same on every machine.
const UNITS: u128 = 1_000_000_000;

/// A rate with a burst: `per_second` tokens come back each second, at most `burst` are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

impl Rate {
    pub const fn new(per_second: u32, burst: u32) -> Rate {
        Rate { per_second, burst }
    }

    fn capacity(self) -> u128 {
        u128::from(self.burst) * UNITS
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/s (burst {})", self.per_second, self.burst)
    }
}

/// A token bucket refilled continuously by the `now` its caller passes.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    credit: u128,
    at: Instant,
}

impl Bucket {
    /// A bucket holding its whole burst.
    pub fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket { credit: rate.capacity(), at: now }
    }

    /// Takes `cost` tokens if the bucket holds them at `now`; a refusal takes nothing.
    pub fn try_take(&mut self, rate: Rate, cost: u32, now: Instant) -> bool {
        self.refill(rate, now);
        let cost = u128::from(cost) * UNITS;
        if self.credit >= cost {
            self.credit -= cost;
            true
        } else {
            false
        }
    }

    /// Takes `cost` tokens that [`Bucket::has`] just found there (no second refill).
    pub fn spend(&mut self, cost: u32) {
        self.credit = self.credit.saturating_sub(u128::from(cost) * UNITS);
    }

    /// Whether `cost` tokens are there at `now`, without taking them.
    pub fn has(&mut self, rate: Rate, cost: u32, now: Instant) -> bool {
        self.refill(rate, now);
        self.credit >= u128::from(cost) * UNITS
    }

    /// What the bucket holds at `now`, in billionths of a token: what travels in
    /// `Budgets` when its connection closes.
    pub fn credit_at(mut self, rate: Rate, now: Instant) -> u64 {
        self.refill(rate, now);
        u64::try_from(self.credit).unwrap_or(u64::MAX)
    }

    /// Lowers the bucket to what one that held `credit` (billionths of a token, as
    /// [`Bucket::credit_at`] gives) at `at` holds at `now`, if that is less: told of a
    /// budget spent elsewhere, a bucket only ever goes down.
    pub fn lower_to(&mut self, rate: Rate, credit: u64, at: Instant, now: Instant) {
        let mut other = Bucket { credit: u128::from(credit).min(rate.capacity()), at };
        other.refill(rate, now);
        self.refill(rate, now);
        self.credit = self.credit.min(other.credit);
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        // A clock that does not move forward refills nothing.
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let gained = elapsed.saturating_mul(u128::from(rate.per_second));
        self.credit = (self.credit + gained).min(rate.capacity());
        self.at = self.at.max(now);
    }
}

/// A connection's input budget over every kind of input: each frame it sends (a TCP frame;
/// over WebSocket every frame: whole messages, fragments, pings, pongs, the close) costs
/// one frame token and its size in byte tokens, paid before the frame is read.
#[derive(Debug, Clone, Copy)]
pub struct InputBudget {
    frames: Bucket,
    bytes: Bucket,
}

impl InputBudget {
    /// A budget holding both bursts.
    pub fn full(limits: &Limits, now: Instant) -> InputBudget {
        InputBudget {
            frames: Bucket::full(limits.input_frames, now),
            bytes: Bucket::full(limits.input_bytes, now),
        }
    }

    /// Pays for one frame of `size` bytes read at `now` if the budget holds a frame and
    /// that many bytes (at the rates of `Limits::input_frames` and `input_bytes`); a
    /// refusal takes nothing (the frame waits, unread).
    pub fn pay(&mut self, frame_rate: Rate, byte_rate: Rate, size: usize, now: Instant) -> bool {
        let cost = u32::try_from(size).unwrap_or(u32::MAX);
        if self.frames.has(frame_rate, 1, now) && self.bytes.has(byte_rate, cost, now) {
            self.frames.spend(1);
            self.bytes.spend(cost);
            true
        } else {
            false
        }
    }
}

/// An address block that the per-address caps do not apply to (load generators, a local
/// dev cluster, a trusted proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressBlock {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl AddressBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix.min(32))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix.min(128))
            }
            (IpAddr::V6(_), IpAddr::V4(ip)) => self.contains(IpAddr::V6(ip.to_ipv6_mapped())),
            (IpAddr::V4(_), IpAddr::V6(ip)) => {
                ip.to_ipv4_mapped().is_some_and(|ip| self.contains(IpAddr::V4(ip)))
            }
        }
    }

    /// The loopback blocks, `127.0.0.0/8` and `::1/128`.
    pub fn loopback() -> Vec<AddressBlock> {
        vec![
            AddressBlock { addr: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)), prefix: 8 },
            AddressBlock { addr: IpAddr::V6(Ipv6Addr::LOCALHOST), prefix: 128 },
        ]
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let whole = usize::from(bits / 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

impl std::str::FromStr for AddressBlock {
    type Err = String;

    /// `10.0.0.0/8`, `2001:db8::/32`, or a single address.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|e| format!("{text:?}: {e}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|e| format!("{text:?}: {e}"))?,
            None => max,
        };
        if prefix > max {
            return Err(format!("{text:?}: prefix longer than {max} bits"));
        }
        Ok(AddressBlock { addr, prefix })
    }
}

impl std::fmt::Display for AddressBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Every limit a gateway enforces. Defaults are DESIGN.md section 2b's.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Moves per player (burst = rate, like the shard's own budget).
    pub moves: Rate,
    /// Chats per player.
    pub chats: Rate,
    /// Game actions per player.
    pub actions: Rate,
    /// Frames of any kind per connection; past it the gateway stops reading the connection
    /// until the budget refills (TCP flow control slows the client).
    pub input_frames: Rate,
    /// Bytes per connection, the same way.
    pub input_bytes: Rate,
    /// A connection that has not logged in or resumed by then is closed.
    pub login_timeout: Duration,
    /// A logged-in connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Open client connections on this gateway (TCP and QUIC).
    pub max_connections: usize,
    /// Open connections from one address (an IPv6 /64 counts as one address).
    pub max_connections_per_address: usize,
    /// New connections per second from one address.
    pub connect_rate: Rate,
    /// Addresses the per-address caps do not apply to.
    pub exempt: Vec<AddressBlock>,
    /// Output queued for all clients of the gateway together; past it the clients with
    /// the most queued are cut first and no connection is accepted until it drains.
    pub max_output_total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            moves: Rate::new(20, 20),
            chats: Rate::new(2, 5),
            actions: Rate::new(10, 20),
            input_frames: Rate::new(100, 200),
            input_bytes: Rate::new(64 * 1024, 128 * 1024),
            login_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 100_000,
            max_connections_per_address: 256,
            connect_rate: Rate::new(20, 100),
            exempt: Vec::new(),
            max_output_total: 512 << 20,
        }
    }
}

/// Why a new connection was refused; the client reads it as an `UNAVAILABLE` error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The gateway holds `max_connections`.
    Full,
    /// The gateway's output budget is spent; it takes nobody until that drains.
    Overloaded,
    /// The address holds `max_connections_per_address`.
    TooManyFromAddress,
    /// The address connects faster than `connect_rate`.
    TooFastFromAddress,
}

impl Refusal {
    pub fn detail(self) -> &'static str {
        match self {
            Refusal::Full => "server full",
            Refusal::Overloaded => "server full: overloaded, try again shortly",
            Refusal::TooManyFromAddress => "too many connections from your address",
            Refusal::TooFastFromAddress => "too many connections from your address per second",
        }
    }

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::Overloaded => "overloaded",
            Refusal::TooManyFromAddress => "per_address",
            Refusal::TooFastFromAddress => "address_rate",
        }
    }

    pub const REASONS: [&'static str; 4] = ["full", "overloaded", "per_address", "address_rate"];

    /// The frame the client gets before the close.
    pub fn frame(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        encode_frame(&server::error(ErrorCode::Unavailable, self.detail(), 0), &mut out);
        out
    }
}

struct Address {
    open: usize,
    connects: Bucket,
}

/// Addresses remembered at most; past this, idle ones are forgotten first, and if none is
/// idle new addresses are refused as if the gateway were full.
const ADDRESSES_KEPT: usize = 65_536;

/// How long a closed connection's chat and action budgets are kept for its player: longer
/// than the resume window (30 s by default), so a client that drops and comes back, by
/// resuming or by logging in again, finds them as it left them.
pub const BUDGETS_KEPT_FOR: Duration = Duration::from_secs(60);
/// Players whose budgets are kept at most; past it, those kept longer than
/// [`BUDGETS_KEPT_FOR`] are dropped, and if none are, the new ones are not kept.
pub const MAX_KEPT_BUDGETS: usize = 100_000;

/// A player's chat and action budgets as its last connection left them.
#[derive(Debug, Clone, Copy)]
pub struct KeptBudgets {
    pub chats: Bucket,
    pub actions: Bucket,
    pub since: Instant,
}

/// The admission decision for new connections, shared by every worker of a gateway. Its
/// lock is taken once per accept and once per close, never per message.
pub struct Admission {
    limits: Limits,
    open: AtomicUsize,
    overloaded: AtomicBool,
    addresses: Mutex<HashMap<IpAddr, Address>>,
    /// The chat and action budgets of players whose connection closed lately, by player:
    /// the budgets belong to the player, so reconnecting buys nothing. Taken once per close
    /// and once per login or resume, never per message.
    budgets: Mutex<HashMap<u64, KeptBudgets>>,
}

impl Admission {
    pub fn new(limits: Limits) -> Admission {
        Admission {
            limits,
            open: AtomicUsize::new(0),
            overloaded: AtomicBool::new(false),
            addresses: Mutex::new(HashMap::new()),
            budgets: Mutex::new(HashMap::new()),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Set by the output budget's check while the gateway's queued output is over budget.
    pub fn set_overloaded(&self, overloaded: bool) {
        self.overloaded.store(overloaded, Ordering::Relaxed);
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Relaxed)
    }

    /// Takes a place for a connection from `peer` (None: no address, e.g. a test), or says
    /// why not. Every `Ok` must be matched by one [`Admission::release`].
    pub fn admit(&self, peer: Option<IpAddr>, now: Instant) -> Result<(), Refusal> {
        if self.overloaded() {
            return Err(Refusal::Overloaded);
        }
        let open = self.open.fetch_add(1, Ordering::Relaxed);
        if open >= self.limits.max_connections {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Full);
        }
        let Some(key) = peer.filter(|ip| !self.exempt(*ip)).map(address_key) else {
            return Ok(());
        };
        let mut addresses = self.addresses.lock().unwrap_or_else(|e| e.into_inner());
        if addresses.len() >= ADDRESSES_KEPT && !addresses.contains_key(&key) {
            let rate = self.limits.connect_rate;
            addresses.retain(|_, a| a.open > 0 || !a.connects.has(rate, rate.burst, now));
            if addresses.len() >= ADDRESSES_KEPT {
                drop(addresses);
                self.open.fetch_sub(1, Ordering::Relaxed);
                return Err(Refusal::Full);
            }
        }
        let address = addresses.entry(key).or_insert_with(|| Address {
            open: 0,
            connects: Bucket::full(self.limits.connect_rate, now),
        });
        let refusal = if address.open >= self.limits.max_connections_per_address {
            Some(Refusal::TooManyFromAddress)
        } else if !address.connects.try_take(self.limits.connect_rate, 1, now) {
            Some(Refusal::TooFastFromAddress)
        } else {
            address.open += 1;
            None
        };
        drop(addresses);
        match refusal {
            Some(refusal) => {
                self.open.fetch_sub(1, Ordering::Relaxed);
                Err(refusal)
            }
            None => Ok(()),
        }
    }

    /// Gives back the place of a closed connection admitted for `peer`.
    pub fn release(&self, peer: Option<IpAddr>) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        let Some(key) = peer.filter(|ip| !self.exempt(*ip)).map(address_key) else {
            return;
        };
        let mut addresses = self.addresses.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(address) = addresses.get_mut(&key) {
            address.open = address.open.saturating_sub(1);
        }
    }

    /// Keeps a closing connection's budgets for its player.
    pub fn keep_budgets(&self, player: u64, chats: Bucket, actions: Bucket, now: Instant) {
        let mut kept = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= MAX_KEPT_BUDGETS {
            kept.retain(|_, k| now.saturating_duration_since(k.since) < BUDGETS_KEPT_FOR);
            if kept.len() >= MAX_KEPT_BUDGETS {
                return;
            }
        }
        kept.insert(player, KeptBudgets { chats, actions, since: now });
    }

    /// The budgets `player`'s last connection left with, if kept and recent.
    pub fn take_budgets(&self, player: u64, now: Instant) -> Option<KeptBudgets> {
        let mut kept = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        kept.remove(&player).filter(|k| now.saturating_duration_since(k.since) < BUDGETS_KEPT_FOR)
    }

    fn exempt(&self, ip: IpAddr) -> bool {
        self.limits.exempt.iter().any(|block| block.contains(ip))
    }
}

/// Connections are counted per IPv4 address and per IPv6 /64 (one subscriber's share).
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let rate = Rate::new(2, 5);
        let mut bucket = Bucket::full(rate, t0);
        for _ in 0..5 {
            assert!(bucket.try_take(rate, 1, t0));
        }
        assert!(!bucket.try_take(rate, 1, t0), "the sixth at once is refused");
        assert!(!bucket.try_take(rate, 1, t0 + ms(499)));
        assert!(bucket.try_take(rate, 1, t0 + ms(500)), "one token per 500 ms at 2/s");
        assert!(!bucket.try_take(rate, 1, t0 + ms(500)));
        // Refills stop at the burst.
        for _ in 0..5 {
            assert!(bucket.try_take(rate, 1, t0 + ms(60_000)));
        }
        assert!(!bucket.try_take(rate, 1, t0 + ms(60_000)));
    }

    #[test]
    fn the_input_budget_pays_frames_and_bytes_together_and_a_refusal_takes_nothing() {
        let t0 = Instant::now();
        let limits = Limits {
            input_frames: Rate::new(2, 3),
            input_bytes: Rate::new(10, 20),
            ..Limits::default()
        };
        let mut budget = InputBudget::full(&limits, t0);
        let rates = (limits.input_frames, limits.input_bytes);
        assert!(budget.pay(rates.0, rates.1, 6, t0));
        assert!(budget.pay(rates.0, rates.1, 6, t0));
        assert!(!budget.pay(rates.0, rates.1, 9, t0), "8 bytes left");
        assert!(budget.pay(rates.0, rates.1, 8, t0), "the refusal took no frame");
        assert!(!budget.pay(rates.0, rates.1, 0, t0), "no frame left, however small");
        assert!(
            budget.pay(rates.0, rates.1, 0, t0 + ms(500)),
            "one frame back after 500 ms at 2/s"
        );
        assert!(
            !budget.pay(rates.0, rates.1, 11, t0 + ms(1000)),
            "10 bytes back in a second, 11 asked"
        );
        assert!(budget.pay(rates.0, rates.1, 10, t0 + ms(1000)));
    }

    #[test]
    fn address_blocks_match_by_prefix() {
        let block: AddressBlock = "10.1.0.0/16".parse().unwrap();
        assert!(block.contains("10.1.200.3".parse().unwrap()));
        assert!(!block.contains("10.2.0.1".parse().unwrap()));
        assert!(block.contains("::ffff:10.1.0.9".parse().unwrap()), "v4-mapped v6");
        let one: AddressBlock = "192.0.2.7".parse().unwrap();
        assert_eq!(one.prefix, 32);
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let odd: AddressBlock = "2001:db8::/33".parse().unwrap();
        assert!(odd.contains("2001:db8:7fff::1".parse().unwrap()));
        assert!(!odd.contains("2001:db8:8000::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<AddressBlock>().is_err());
        assert!("nonsense".parse::<AddressBlock>().is_err());
    }

    fn admission(limits: Limits) -> Admission {
        Admission::new(limits)
    }

    #[test]
    fn admission_caps_per_address_and_per_gateway() {
        let t0 = Instant::now();
        let limits = Limits {
            max_connections: 5,
            max_connections_per_address: 2,
            connect_rate: Rate::new(100, 100),
            exempt: AddressBlock::loopback(),
            ..Limits::default()
        };
        let gate = admission(limits);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "198.51.100.2".parse().unwrap();
        assert_eq!(gate.admit(Some(a), t0), Ok(()));
        assert_eq!(gate.admit(Some(a), t0), Ok(()));
        assert_eq!(gate.admit(Some(a), t0), Err(Refusal::TooManyFromAddress));
        gate.release(Some(a));
        assert_eq!(gate.admit(Some(a), t0), Ok(()), "a closed connection frees its place");
        // Loopback is exempt from the per-address cap, not from the gateway's.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(gate.admit(Some(lo), t0), Ok(()));
        assert_eq!(gate.admit(Some(lo), t0), Ok(()));
        assert_eq!(gate.admit(Some(lo), t0), Ok(()));
        assert_eq!(gate.admit(Some(b), t0), Err(Refusal::Full));
        assert_eq!(gate.open(), 5);
    }

    #[test]
    fn admission_limits_the_connection_rate_per_address() {
        let t0 = Instant::now();
        let limits = Limits { connect_rate: Rate::new(1, 3), ..Limits::default() };
        let gate = admission(limits);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8::ffff".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(gate.admit(Some(a), t0), Ok(()));
            gate.release(Some(a));
        }
        assert_eq!(gate.admit(Some(same_64), t0), Err(Refusal::TooFastFromAddress));
        assert_eq!(gate.admit(Some(a), t0 + ms(1000)), Ok(()));
        assert_eq!(gate.open(), 1, "refusals hold no place");
    }

    #[test]
    fn an_overloaded_gateway_admits_nobody() {
        let gate = admission(Limits::default());
        gate.set_overloaded(true);
        assert_eq!(gate.admit(None, Instant::now()), Err(Refusal::Overloaded));
        gate.set_overloaded(false);
        assert_eq!(gate.admit(None, Instant::now()), Ok(()));
    }
}
