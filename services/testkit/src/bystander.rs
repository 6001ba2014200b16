//! A player that keeps playing in a corner of the map while a test abuses the gateway, and
//! fails the test if it is disturbed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail};
use meridian_protocol::pb::Direction;

use crate::bot::{Answer, Bot, GameAddr};
use crate::wait::{deadline, wait_until, DEFAULT_WAIT};

/// The pause between one ack and the next move: at most ~16 moves a second, under the
/// default limit of 20, so the bystander is never rate limited.
const PACE: Duration = Duration::from_millis(60);

/// A bot on its own thread that moves back and forth between two cells and checks every
/// answer: each move acknowledged with the right position and client_time, and nothing
/// else received (it must be placed where nobody else comes into sight).
pub struct Bystander {
    label: String,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Bystander {
    /// Logs in at `spawn` (in the caller's thread, so a refused login fails at once) and
    /// starts playing. Nobody may be in sight of `spawn` or `spawn + (1, 0)`.
    pub fn start(
        addr: impl Into<GameAddr>,
        name: &str,
        spawn: (u32, u32),
    ) -> anyhow::Result<Bystander> {
        let mut bot = Bot::connect(addr)?;
        let login = bot.login(name, Some(spawn))?;
        if !login.after.is_empty() {
            bail!("bystander {name} at {spawn:?} is not alone: it got {:?}", login.after);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, acks, failure) = (stop.clone(), acks.clone(), failure.clone());
            std::thread::Builder::new().name(format!("bystander {name}")).spawn(move || {
                if let Err(e) = play(&mut bot, spawn, &stop, &acks) {
                    *failure.lock().expect("invariant: the lock is never poisoned") =
                        Some(format!("{e:#}"));
                }
            })?
        };
        Ok(Bystander { label: name.to_string(), stop, acks, failure, thread: Some(thread) })
    }

    /// Moves acknowledged so far.
    pub fn acks(&self) -> u64 {
        self.acks.load(Ordering::Relaxed)
    }

    /// Waits until `more` further moves are acknowledged; fails at once if the bystander
    /// was disturbed.
    pub fn wait_for_acks(&self, more: u64) -> anyhow::Result<()> {
        let target = self.acks() + more;
        let what = format!("bystander {} to get {more} more acks", self.label);
        let mut failed = None;
        wait_until(deadline(DEFAULT_WAIT), &what, || {
            failed = self.failure();
            failed.is_some() || self.acks() >= target
        })?;
        match failed {
            Some(e) => Err(anyhow!("bystander {} was disturbed: {e}", self.label)),
            None => Ok(()),
        }
    }

    /// Stops playing and returns the number of acks; an error if the bystander was disturbed
    /// at any point.
    pub fn finish(mut self) -> anyhow::Result<u64> {
        self.stop_thread();
        match self.failure() {
            Some(e) => Err(anyhow!("bystander {} was disturbed: {e}", self.label)),
            None => Ok(self.acks()),
        }
    }

    fn failure(&self) -> Option<String> {
        self.failure.lock().expect("invariant: the lock is never poisoned").clone()
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn play(
    bot: &mut Bot,
    home: (u32, u32),
    stop: &AtomicBool,
    acks: &AtomicU64,
) -> anyhow::Result<()> {
    let mut client_time = 0u64;
    let mut at = home;
    while !stop.load(Ordering::Relaxed) {
        client_time += 1;
        let (direction, expected) = if at == home {
            (Direction::Right, (home.0 + 1, home.1))
        } else {
            (Direction::Left, home)
        };
        let answer = bot.move_(direction, client_time)?;
        match &answer.answer {
            Answer::Ack(position) if *position == expected => at = expected,
            other => bail!("move {client_time} {direction:?} from {at:?}: expected an ack at {expected:?}, got {other:?}"),
        }
        if !answer.others.is_empty() {
            bail!("got messages meant for nobody near it: {:?}", answer.others);
        }
        acks.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(PACE);
    }
    // Nothing may be left pending either.
    bot.expect_quiet()
}
