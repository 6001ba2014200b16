//! Running a [`Script`]: one thread per slot, each a [`Bot`] with its
//! [`StreamCheck`](crate::StreamCheck) on, doing its steps on time and reading everything
//! that arrives in between. [`settle`](crate::settle) then brings the world to rest.
//!
//! Pacing: a bot sends a move only once the previous one is answered, and never sooner than
//! `min_move_gap` after it, so a bot that falls behind its schedule catches up without ever
//! going over the server's move rate. A move not answered within `answer_within` is a lost
//! ack. Any failure (a broken stream rule, a lost ack, a closed connection) stops the whole
//! fleet at once and is reported with the bot's name and its last messages.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::bot::{Bot, GameAddr};
use crate::failures::{Failures, Stop};
use crate::msg;
use crate::scenario::{Action, Script, SlotScript};
use crate::wait::{deadline, wait_until, DEFAULT_WAIT};

/// How often a waiting slot thread looks at the abort flag.
const POLL: Duration = Duration::from_millis(100);

/// How a [`Fleet`] runs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Game ports (TCP) or QUIC fronts; slot scripts name one by index (modulo the length).
    pub gateways: Vec<GameAddr>,
    /// The shortest time between two moves of one bot. 50 ms keeps a bot at or under the
    /// default 20 moves a second.
    pub min_move_gap: Duration,
    /// How long a move may wait for its answer before it counts as lost.
    pub answer_within: Duration,
    /// Names the run in every failure (e.g. "seed 7, 4 shards").
    pub label: String,
}

impl FleetOptions {
    pub fn new<A: Into<GameAddr>>(gateways: Vec<A>, label: impl Into<String>) -> FleetOptions {
        FleetOptions {
            gateways: gateways.into_iter().map(Into::into).collect(),
            min_move_gap: Duration::from_millis(50),
            answer_within: DEFAULT_WAIT,
            label: label.into(),
        }
    }
}

/// A client the script left logged in, after the run.
pub struct Player {
    pub slot: usize,
    pub name: String,
    pub bot: Bot,
    /// The chats it sent, to check that each came back to it.
    pub chats_sent: Vec<String>,
}

impl Player {
    pub fn id(&self) -> u64 {
        self.bot.id()
    }

    /// Its position as its own acks put it.
    pub fn position(&self) -> (u32, u32) {
        self.bot.view().own_position().expect("invariant: a player is logged in")
    }
}

#[derive(Default)]
struct Shared {
    failures: Failures,
    /// Slots that have done all their steps.
    done: AtomicUsize,
    /// Players logged in now: id -> name.
    logged_in: Mutex<BTreeMap<u64, String>>,
}

/// A script being run.
pub struct Fleet {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<Option<Player>>>,
    slots: usize,
    label: String,
    started: Instant,
    expected_duration: Duration,
}

impl Fleet {
    /// Starts one thread per slot; step times count from now.
    pub fn start(script: &Script, options: FleetOptions) -> anyhow::Result<Fleet> {
        if options.gateways.is_empty() {
            bail!("a fleet needs at least one gateway");
        }
        let shared = Arc::new(Shared::default());
        let started = Instant::now();
        let mut threads = Vec::with_capacity(script.slots.len());
        for slot in &script.slots {
            let slot_number = slot.slot;
            let slot = slot.clone();
            let shared_for_thread = Arc::clone(&shared);
            let options = options.clone();
            let total = script.slots.len();
            let spawned = std::thread::Builder::new()
                .name(format!("slot {}", slot.slot))
                .stack_size(256 * 1024)
                .spawn(move || {
                    let shared = shared_for_thread;
                    let slot_number = slot.slot;
                    match run_slot(slot, &options, started, &shared, total) {
                        Ok(player) => player,
                        Err(Stop::Aborted) => None,
                        Err(Stop::Failed(e)) => {
                            shared
                                .failures
                                .fail(format!("{}, slot {slot_number}: {e:#}", options.label));
                            None
                        }
                    }
                });
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    shared.failures.fail(format!("starting the thread of slot {slot_number}: {e}"));
                    break;
                }
            }
        }
        Ok(Fleet {
            shared,
            threads,
            slots: script.slots.len(),
            label: options.label,
            started,
            expected_duration: script.duration(),
        })
    }

    /// The players logged in right now (login answered, no logout or drop sent yet).
    pub fn logged_in(&self) -> BTreeMap<u64, String> {
        self.shared.logged_in.lock().expect("invariant: the lock is never poisoned").clone()
    }

    /// The first failure, if any slot failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.failures.first()
    }

    /// Whether some slot still has steps to do.
    pub fn walking(&self) -> bool {
        self.shared.done.load(Ordering::SeqCst) < self.slots && !self.shared.failures.aborted()
    }

    /// Stops every slot as soon as it looks (within about 0.1 s, or one answer wait).
    pub fn abort(&self) {
        self.shared.failures.abort();
    }

    /// Waits for every slot to finish its script and returns the players left logged in,
    /// by slot; the first failure (with how many slots failed) if any did. The script gets
    /// its own duration plus `slack` to finish.
    pub fn finish(mut self, slack: Duration) -> anyhow::Result<Vec<Player>> {
        let finish_by = self.started + self.expected_duration + slack;
        let waited = wait_until(
            finish_by,
            &format!("{}: every slot to finish its script", self.label),
            || self.threads.iter().all(|t| t.is_finished()),
        );
        if waited.is_err() {
            self.abort();
            let _ = wait_until(
                deadline(DEFAULT_WAIT + DEFAULT_WAIT),
                "slot threads to stop after the abort",
                || self.threads.iter().all(|t| t.is_finished()),
            );
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
                Err(_) => self.shared.failures.fail("a slot thread panicked".to_string()),
            }
        }
        self.shared.failures.check("slots")?;
        waited?;
        players.sort_by_key(|p| p.slot);
        Ok(players)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The state of one slot's current client.
struct Client {
    name: String,
    bot: Bot,
    next_client_time: u64,
    last_move: Option<Instant>,
    chats_sent: Vec<String>,
}

fn run_slot(
    slot: SlotScript,
    options: &FleetOptions,
    started: Instant,
    shared: &Shared,
    total: usize,
) -> Result<Option<Player>, Stop> {
    let gateway = options.gateways[slot.gateway % options.gateways.len()];
    let mut client: Option<Client> = None;
    for step in &slot.steps {
        drain_until(&mut client, started + step.at, shared)?;
        match &step.action {
            Action::Login { name, spawn } => {
                if let Some(old) = &client {
                    return Err(anyhow!(
                        "script error: {name} logs in while {} is still logged in",
                        old.name
                    )
                    .into());
                }
                let mut bot = Bot::connect(gateway)?;
                bot.check_streams();
                let login = bot.login(name, Some(*spawn))?;
                let at = login.ok.position.as_ref().map(|p| (p.x, p.y));
                if at != Some(*spawn) {
                    return Err(bot
                        .report(&format!(
                            "logged in at {at:?}, asked for {spawn:?} (dev mode honours spawn)"
                        ))
                        .into());
                }
                shared
                    .logged_in
                    .lock()
                    .expect("invariant: the lock is never poisoned")
                    .insert(login.player_id(), name.clone());
                client = Some(Client {
                    name: name.clone(),
                    bot,
                    next_client_time: 1,
                    last_move: None,
                    chats_sent: Vec::new(),
                });
            }
            Action::Move(direction) => {
                let c = logged_in(&mut client, &step.action)?;
                await_answers(c, options.answer_within, shared)?;
                if let Some(last) = c.last_move {
                    let earliest = last + options.min_move_gap;
                    drain_client_until(c, earliest, shared)?;
                }
                let t = c.next_client_time;
                c.next_client_time += 1;
                c.last_move = Some(Instant::now());
                c.bot.send_move(*direction, t)?;
            }
            Action::Chat(text) => {
                let c = logged_in(&mut client, &step.action)?;
                c.bot.chat(text)?;
                c.chats_sent.push(text.clone());
            }
            Action::Logout => {
                let mut c = client
                    .take()
                    .ok_or_else(|| anyhow!("script error: Logout while logged out"))?;
                await_answers(&mut c, options.answer_within, shared)?;
                forget(shared, &c.bot);
                c.bot.send(&msg::logout())?;
                c.bot.expect_closed(deadline(DEFAULT_WAIT))?;
                check_own_chats(&c.bot, &c.chats_sent)?;
            }
            Action::Disconnect => {
                let c = client
                    .take()
                    .ok_or_else(|| anyhow!("script error: Disconnect while logged out"))?;
                forget(shared, &c.bot);
                c.bot.disconnect();
            }
        }
    }
    if let Some(c) = &mut client {
        await_answers(c, options.answer_within, shared)?;
    }
    shared.done.fetch_add(1, Ordering::SeqCst);
    // Keep reading until every slot is done, so nobody's socket fills up while others walk.
    while shared.done.load(Ordering::SeqCst) < total {
        let until = Instant::now() + POLL;
        drain_until(&mut client, until, shared)?;
    }
    Ok(client.map(|c| Player {
        slot: slot.slot,
        name: c.name,
        bot: c.bot,
        chats_sent: c.chats_sent,
    }))
}

fn logged_in<'a>(
    client: &'a mut Option<Client>,
    action: &Action,
) -> anyhow::Result<&'a mut Client> {
    client.as_mut().ok_or_else(|| anyhow!("script error: {action:?} while logged out"))
}

fn forget(shared: &Shared, bot: &Bot) {
    shared.logged_in.lock().expect("invariant: the lock is never poisoned").remove(&bot.id());
}

/// Every chat a client sent came back to it.
pub(crate) fn check_own_chats(bot: &Bot, chats_sent: &[String]) -> anyhow::Result<()> {
    let own = bot.id();
    let heard: Vec<&str> = bot
        .stream_check()
        .map(|s| s.chats().iter().filter(|h| h.speaker == own).map(|h| h.text.as_str()).collect())
        .unwrap_or_default();
    let missing: Vec<&String> =
        chats_sent.iter().filter(|t| !heard.contains(&t.as_str())).collect();
    if !missing.is_empty() {
        return Err(bot.report(&format!(
            "its own chats {missing:?} never came back to it (chat is delivered to the speaker)"
        )));
    }
    Ok(())
}

/// Reads whatever arrives until `until`, looking at the abort flag now and then.
fn drain_until(client: &mut Option<Client>, until: Instant, shared: &Shared) -> Result<(), Stop> {
    match client {
        Some(c) => drain_client_until(c, until, shared),
        None => loop {
            if shared.failures.aborted() {
                return Err(Stop::Aborted);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            // Nothing to read: wait for the scheduled time.
            std::thread::sleep((until - now).min(POLL));
        },
    }
}

fn drain_client_until(c: &mut Client, until: Instant, shared: &Shared) -> Result<(), Stop> {
    loop {
        if shared.failures.aborted() {
            return Err(Stop::Aborted);
        }
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        let slice = until.min(now + POLL);
        while c.bot.recv_timeout(slice)?.is_some() {}
    }
}

/// Waits until every move sent is answered; a move unanswered after `within` is lost.
fn await_answers(c: &mut Client, within: Duration, shared: &Shared) -> Result<(), Stop> {
    let by = Instant::now() + within;
    loop {
        let unanswered = c.bot.stream_check().map_or(0, |s| s.in_flight());
        if unanswered == 0 {
            return Ok(());
        }
        if shared.failures.aborted() {
            return Err(Stop::Aborted);
        }
        let now = Instant::now();
        if now >= by {
            let times = c.bot.stream_check().map(|s| s.unanswered()).unwrap_or_default();
            return Err(c
                .bot
                .report(&format!(
                    "lost ack: moves {times:?} unanswered after {:.1} s (every move gets exactly one answer)",
                    within.as_secs_f64()
                ))
                .into());
        }
        c.bot.recv_timeout(by.min(now + POLL))?;
    }
}
