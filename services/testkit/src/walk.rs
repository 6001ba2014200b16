//! Open-ended random walks: bots that keep playing while a test changes the cluster under
//! them (adds or drains shards, kills one, stops etcd), until the test says stop.
//!
//! A [`Fleet`](crate::Fleet) runs a script fixed in advance; these walkers run for as long
//! as the test needs, one thread each, every bot with its [`StreamCheck`] on. Each walker
//! moves at a fixed pace inside its own box of the map, one move in flight at a time: it
//! sends a move, waits for that move's one answer, and reads whatever else arrives in
//! between. What each walker has seen (acks, refusals, `ViewReset`s, with their instants)
//! can be read while they walk ([`Walkers::status`]), so a test can wait on conditions like
//! "every bot of the killed shard got its `ViewReset`". A broken stream rule, a lost ack, a
//! refusal the test did not allow, or a closed connection stops every walker at once and
//! is reported with the run's label (its seed), the bot's name and its last messages.
//! [`Walkers::stop`] lets every walker finish its move in flight and hands the bots back as
//! [`Player`]s, ready for [`settle`](crate::settle).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use meridian_protocol::pb::{server_message::Kind as S, Direction, ErrorCode, ServerMessage};

use crate::bot::Bot;
use crate::code::code_name;
use crate::failures::{Failures, Stop};
use crate::fleet::Player;
use crate::rng::Rng;
use crate::stream::{step_clamped, StreamCheck};
use crate::wait::{deadline, wait_until, DEFAULT_WAIT};

/// How often a walker that waits looks at the stop and abort flags.
const POLL: Duration = Duration::from_millis(100);

/// A box of cells, bounds included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

impl Area {
    /// The cells `x0..=x1` by `y0..=y1`.
    pub fn new(x: std::ops::RangeInclusive<u32>, y: std::ops::RangeInclusive<u32>) -> Area {
        Area { x0: *x.start(), y0: *y.start(), x1: *x.end(), y1: *y.end() }
    }

    pub fn contains(&self, (x, y): (u32, u32)) -> bool {
        self.x0 <= x && x <= self.x1 && self.y0 <= y && y <= self.y1
    }

    /// A uniformly random cell of the box.
    pub fn random_cell(&self, rng: &mut Rng) -> (u32, u32) {
        (rng.range_u32(self.x0, self.x1), rng.range_u32(self.y0, self.y1))
    }
}

/// One walker: who it is, where it starts, the box it walks in, its gateway.
#[derive(Debug, Clone)]
pub struct WalkerSpec {
    pub name: String,
    pub spawn: (u32, u32),
    pub area: Area,
    /// Index into [`WalkOptions::gateways`] (modulo their number).
    pub gateway: usize,
}

/// How the walkers walk.
#[derive(Debug, Clone)]
pub struct WalkOptions {
    pub gateways: Vec<SocketAddr>,
    /// From one move to the next (the first comes at a random instant within one interval
    /// of the login, so the walkers do not move in lockstep). At least 50 ms keeps a bot
    /// under the default limit of 20 moves a second.
    pub move_every: Duration,
    /// How long a move may wait for its answer before it counts as lost.
    pub answer_within: Duration,
    /// Refusals a move may get without failing the run (e.g. `UNAVAILABLE` while a shard is
    /// dead). Empty: every move must be acknowledged. When not empty, the walkers' stream
    /// checks also keep moves in flight across a `ViewReset` (see
    /// [`StreamCheck::answers_survive_view_reset`]).
    pub allowed_errors: Vec<ErrorCode>,
    /// The chance of keeping the previous direction when it stays in the box.
    pub momentum: f64,
    /// Seeds the walks (each walker forks its own stream by index).
    pub seed: u64,
    /// Names the run in every failure (e.g. "seed 7, scale 2-4-2").
    pub label: String,
}

impl WalkOptions {
    pub fn new(gateways: Vec<SocketAddr>, seed: u64, label: impl Into<String>) -> WalkOptions {
        WalkOptions {
            gateways,
            move_every: Duration::from_millis(100),
            answer_within: DEFAULT_WAIT,
            allowed_errors: Vec::new(),
            momentum: 0.5,
            seed,
            label: label.into(),
        }
    }
}

/// What one walker has seen so far.
#[derive(Debug, Clone, Default)]
pub struct WalkerStatus {
    pub name: String,
    /// The player id, once logged in.
    pub id: Option<u64>,
    pub moves: u64,
    pub acks: u64,
    /// Refusals answering its moves, by error code name.
    pub errors: BTreeMap<String, u64>,
    pub first_error: Option<Instant>,
    pub last_error: Option<Instant>,
    /// When each `ViewReset` arrived.
    pub view_resets: Vec<Instant>,
    /// When the first ack after the last `ViewReset` arrived.
    pub first_ack_after_reset: Option<Instant>,
    /// Moves in flight when a `ViewReset` arrived that were then acknowledged after it.
    pub acked_across_reset: u64,
    /// Moves in flight when a `ViewReset` arrived that were then refused after it.
    pub refused_across_reset: u64,
}

impl WalkerStatus {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    failures: Failures,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Walkers walking.
pub struct Walkers {
    shared: Arc<Shared>,
    statuses: Vec<Arc<Mutex<WalkerStatus>>>,
    threads: Vec<JoinHandle<Option<Player>>>,
    label: String,
}

impl Walkers {
    /// Starts one thread per walker; each logs in at its spawn and starts walking.
    pub fn start(specs: &[WalkerSpec], options: WalkOptions) -> anyhow::Result<Walkers> {
        if options.gateways.is_empty() {
            bail!("walkers need at least one gateway");
        }
        if options.move_every < Duration::from_millis(50) {
            bail!("walkers move at most 20 times a second, the default limit");
        }
        let shared = Arc::new(Shared::default());
        let mut walkers = Walkers {
            shared: Arc::clone(&shared),
            statuses: Vec::new(),
            threads: Vec::new(),
            label: options.label.clone(),
        };
        for (index, spec) in specs.iter().enumerate() {
            if !spec.area.contains(spec.spawn) {
                bail!("{}: spawn {:?} is outside its area {:?}", spec.name, spec.spawn, spec.area);
            }
            let status = Arc::new(Mutex::new(WalkerStatus {
                name: spec.name.clone(),
                ..Default::default()
            }));
            walkers.statuses.push(Arc::clone(&status));
            let name = spec.name.clone();
            let (spec, options, shared) = (spec.clone(), options.clone(), Arc::clone(&shared));
            let thread = std::thread::Builder::new()
                .name(format!("walker {name}"))
                .stack_size(256 * 1024)
                .spawn(move || {
                    let mut walker = Walker::new(index, &options, &shared, status);
                    match walker.run(&spec) {
                        Ok(player) => Some(player),
                        Err(Stop::Aborted) => None,
                        Err(Stop::Failed(e)) => {
                            shared
                                .failures
                                .fail(format!("{}, walker {}: {e:#}", options.label, spec.name));
                            None
                        }
                    }
                });
            match thread {
                Ok(handle) => walkers.threads.push(handle),
                Err(e) => bail!("starting the thread of walker {name}: {e}"),
            }
        }
        Ok(walkers)
    }

    /// Every walker's status, in the order of the specs.
    pub fn status(&self) -> Vec<WalkerStatus> {
        self.statuses
            .iter()
            .map(|s| s.lock().expect("invariant: the lock is never poisoned").clone())
            .collect()
    }

    /// The first failure, if a walker failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.failures.first()
    }

    /// An error with the first failure, if a walker failed.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.failure() {
            Some(failure) => bail!("{failure}"),
            None => Ok(()),
        }
    }

    /// Waits until `condition` holds for the walkers' statuses, failing at once if a walker
    /// fails; `what` says what was expected when the deadline passes, with `explain`'s
    /// account of the statuses that do not fit.
    pub fn wait_for(
        &self,
        within: Duration,
        what: &str,
        mut condition: impl FnMut(&[WalkerStatus]) -> bool,
        explain: impl Fn(&[WalkerStatus]) -> String,
    ) -> anyhow::Result<()> {
        let mut last = Vec::new();
        let waited = wait_until(deadline(within), &format!("{}: {what}", self.label), || {
            last = self.status();
            self.failure().is_some() || condition(&last)
        });
        self.check()?;
        waited.map_err(|e| anyhow!("{e:#}; {}", explain(&last)))
    }

    /// Waits until every walker is logged in.
    pub fn wait_logged_in(&self, within: Duration) -> anyhow::Result<()> {
        self.wait_for(
            within,
            &format!("all {} walkers to log in", self.statuses.len()),
            |all| all.iter().all(|s| s.id.is_some()),
            |all| {
                let missing: Vec<&str> =
                    all.iter().filter(|s| s.id.is_none()).map(|s| s.name.as_str()).collect();
                format!("not logged in: {missing:?}")
            },
        )
    }

    /// Waits until every walker has `more` acks beyond what it has now: everyone is playing.
    pub fn wait_for_acks(&self, more: u64, within: Duration) -> anyhow::Result<()> {
        let from: Vec<u64> = self.status().iter().map(|s| s.acks).collect();
        self.wait_for(
            within,
            &format!("every walker to get {more} more acks"),
            |all| all.iter().zip(&from).all(|(s, from)| s.acks >= from + more),
            |all| {
                let behind: Vec<String> = all
                    .iter()
                    .zip(&from)
                    .filter(|(s, from)| s.acks < *from + more)
                    .map(|(s, from)| {
                        format!("{} ({} of {more}, errors {:?})", s.name, s.acks - from, s.errors)
                    })
                    .take(20)
                    .collect();
                format!("behind: {behind:?}")
            },
        )
    }

    /// Lets the walkers walk for `duration`, failing at once if one of them fails.
    pub fn walk_for(&self, duration: Duration) -> anyhow::Result<()> {
        let until = deadline(duration);
        // The wait ending without a failure is the good outcome here.
        let _ = wait_until(until, "a walker to fail", || self.failure().is_some());
        self.check()
    }

    /// Stops every walker once its move in flight is answered and returns the bots, in the
    /// order of the specs, with what each walker saw in all; the first failure (with how
    /// many walkers failed) if any did.
    pub fn stop(mut self, within: Duration) -> anyhow::Result<(Vec<Player>, Vec<WalkerStatus>)> {
        self.shared.stop.store(true, Ordering::SeqCst);
        let waited =
            wait_until(deadline(within), &format!("{}: walkers to stop", self.label), || {
                self.threads.iter().all(|t| t.is_finished())
            });
        if waited.is_err() {
            self.shared.failures.abort();
        }
        let mut players = Vec::new();
        for thread in std::mem::take(&mut self.threads) {
            if !thread.is_finished() {
                // Leave it: it holds only a socket, closed when the cluster goes.
                continue;
            }
            match thread.join() {
                Ok(Some(player)) => players.push(player),
                Ok(None) => {}
                Err(_) => self.shared.failures.fail("a walker thread panicked".to_string()),
            }
        }
        self.shared.failures.check("walkers")?;
        waited?;
        players.sort_by_key(|p| p.slot);
        Ok((players, self.status()))
    }
}

impl Drop for Walkers {
    fn drop(&mut self) {
        self.shared.failures.abort();
    }
}

/// One walker's thread state.
struct Walker<'a> {
    index: usize,
    options: &'a WalkOptions,
    shared: &'a Shared,
    status: Arc<Mutex<WalkerStatus>>,
    rng: Rng,
    previous: Option<Direction>,
    next_client_time: u64,
    /// The move in flight, if any, and whether a `ViewReset` arrived while it was.
    in_flight: Option<(u64, bool)>,
}

impl<'a> Walker<'a> {
    fn new(
        index: usize,
        options: &'a WalkOptions,
        shared: &'a Shared,
        status: Arc<Mutex<WalkerStatus>>,
    ) -> Walker<'a> {
        Walker {
            index,
            options,
            shared,
            status,
            rng: Rng::new(options.seed).fork(index as u64),
            previous: None,
            next_client_time: 1,
            in_flight: None,
        }
    }

    fn update(&self, change: impl FnOnce(&mut WalkerStatus)) {
        change(&mut self.status.lock().expect("invariant: the lock is never poisoned"));
    }

    fn run(&mut self, spec: &WalkerSpec) -> Result<Player, Stop> {
        let gateway = self.options.gateways[spec.gateway % self.options.gateways.len()];
        let mut bot = Bot::connect(gateway)?;
        let mut check = StreamCheck::new();
        if !self.options.allowed_errors.is_empty() {
            check = check.allow_move_errors().answers_survive_view_reset();
        }
        bot.check_streams_with(check);
        let login = bot.login(&spec.name, Some(spec.spawn))?;
        let at = login.ok.position.as_ref().map(|p| (p.x, p.y));
        if at != Some(spec.spawn) {
            return Err(bot
                .report(&format!(
                    "logged in at {at:?}, asked for {:?} (dev mode honours spawn)",
                    spec.spawn
                ))
                .into());
        }
        let id = login.player_id();
        self.update(|s| s.id = Some(id));
        let every = self.options.move_every;
        let mut next_move =
            Instant::now() + Duration::from_millis(self.rng.below(every.as_millis() as u64 + 1));
        loop {
            if self.shared.failures.aborted() {
                return Err(Stop::Aborted);
            }
            if self.shared.stopping() {
                break;
            }
            let now = Instant::now();
            if now < next_move {
                self.read(&mut bot, next_move.min(now + POLL))?;
                continue;
            }
            let from = bot.view().own_position().expect("invariant: logged in");
            let direction = self.next_direction(spec.area, from);
            let client_time = self.next_client_time;
            self.next_client_time += 1;
            self.in_flight = Some((client_time, false));
            bot.send_move(direction, client_time)?;
            let sent = Instant::now();
            self.update(|s| s.moves += 1);
            next_move = sent + every;
            self.await_answer(&mut bot, sent + self.options.answer_within)?;
        }
        Ok(Player { slot: self.index, name: spec.name.clone(), bot, chats_sent: Vec::new() })
    }

    /// A random step that keeps the walker in its box; keeps the previous direction with
    /// probability `momentum` when it can. Outside its box (a restore may put it back a
    /// step), any step back toward the box.
    fn next_direction(&mut self, area: Area, at: (u32, u32)) -> Direction {
        const ALL: [Direction; 4] =
            [Direction::Up, Direction::Down, Direction::Left, Direction::Right];
        // The map is only bounded by the box here; clamping at the map edge is the box's.
        let map = (u32::MAX, u32::MAX);
        let stays = |d: Direction| area.contains(step_clamped(at, d, map));
        if let Some(previous) = self.previous {
            if stays(previous) && self.rng.chance(self.options.momentum) {
                return previous;
            }
        }
        let allowed: Vec<Direction> = ALL.into_iter().filter(|d| stays(*d)).collect();
        let direction = if allowed.is_empty() {
            // Outside the box: head back in.
            if at.0 < area.x0 {
                Direction::Right
            } else if at.0 > area.x1 {
                Direction::Left
            } else if at.1 < area.y0 {
                Direction::Down
            } else {
                Direction::Up
            }
        } else {
            *self.rng.pick(&allowed)
        };
        self.previous = Some(direction);
        direction
    }

    /// Reads whatever arrives until `until`.
    fn read(&mut self, bot: &mut Bot, until: Instant) -> Result<(), Stop> {
        while let Some(message) = bot.recv_timeout(until)? {
            self.observe(bot, &message)?;
        }
        Ok(())
    }

    /// Reads until the move in flight is answered; a move unanswered by `by` is lost.
    fn await_answer(&mut self, bot: &mut Bot, by: Instant) -> Result<(), Stop> {
        while self.in_flight.is_some() {
            if self.shared.failures.aborted() {
                return Err(Stop::Aborted);
            }
            let now = Instant::now();
            if now >= by {
                let (client_time, _) = self.in_flight.expect("invariant: checked above");
                return Err(bot
                    .report(&format!(
                        "lost ack: move {client_time} unanswered after {:.1} s (every move \
                         gets exactly one answer)",
                        self.options.answer_within.as_secs_f64()
                    ))
                    .into());
            }
            if let Some(message) = bot.recv_timeout(by.min(now + POLL))? {
                self.observe(bot, &message)?;
            }
        }
        Ok(())
    }

    /// Records what a message means for this walker's status. The bot's view and stream
    /// check have already accepted it (order, one answer per move, positions).
    fn observe(&mut self, bot: &Bot, message: &ServerMessage) -> Result<(), Stop> {
        let now = Instant::now();
        let own = bot.view().own_id();
        match &message.kind {
            Some(S::ViewReset(_)) => {
                if let Some((_, across)) = &mut self.in_flight {
                    *across = true;
                }
                self.update(|s| {
                    s.view_resets.push(now);
                    s.first_ack_after_reset = None;
                });
            }
            Some(S::Moved(moved)) if Some(moved.player_id) == own && moved.client_time != 0 => {
                let across = self.answered(moved.client_time, bot)?;
                self.update(|s| {
                    s.acks += 1;
                    if across {
                        s.acked_across_reset += 1;
                    }
                    if !s.view_resets.is_empty() && s.first_ack_after_reset.is_none() {
                        s.first_ack_after_reset = Some(now);
                    }
                });
            }
            Some(S::Error(error)) if error.client_time != 0 => {
                let across = self.answered(error.client_time, bot)?;
                let allowed = self.options.allowed_errors.iter().any(|c| *c as i32 == error.code);
                let name = code_name(error.code);
                if !allowed {
                    return Err(bot
                        .report(&format!(
                            "move {} was refused with {name} ({:?}); this run allows only {:?}",
                            error.client_time, error.detail, self.options.allowed_errors
                        ))
                        .into());
                }
                self.update(|s| {
                    *s.errors.entry(name).or_default() += 1;
                    s.first_error.get_or_insert(now);
                    s.last_error = Some(now);
                    if across {
                        s.refused_across_reset += 1;
                    }
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// The move in flight got its answer; whether a `ViewReset` came in between.
    fn answered(&mut self, client_time: u64, bot: &Bot) -> anyhow::Result<bool> {
        match self.in_flight.take() {
            Some((t, across)) if t == client_time => Ok(across),
            other => Err(bot.report(&format!(
                "an answer to move {client_time} while the move in flight was {other:?}"
            ))),
        }
    }
}
