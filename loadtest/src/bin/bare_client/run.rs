//! The run: one thread, one epoll set, every bot's socket.
//!
//! The loop connects bot `i` at `start + i * connect_interval`, logs it in, and from its
//! `LoginOk` sends it a move every interval (from a random phase) until sending ends,
//! whatever has come back: the schedule is a heap of due times, and a late loop sends
//! every move that fell due (open loop). Between due times the thread blocks in
//! `epoll_wait`; a readable socket gets exactly one `read` of up to `READ_BUFFER` bytes,
//! every whole frame in it is handled, and a partial frame waits in the bot's inbox for
//! the next one. After sending ends it waits for the last acks (at most `drain`), sends
//! every bot `Logout`, waits briefly for the server to close, and stops.
//!
//! With `send_tick` a move due at `t` waits for the first tick boundary (multiples of the
//! tick since the start) at or after `t`, and every move due by then goes out together, as
//! a timer wheel of that resolution would send them; without it each move goes out the
//! first time the loop sees it due, and the loop runs whenever anything arrives.
//!
//! The system calls are counted here (`IoCounts`) so the report can say how many reads,
//! writes and wake-ups a relayed message cost this client.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::net::{self, Epoll, Ready};
use crate::tally::{Pending, Tally};
use crate::wire::{self, Direction, ServerEvent};

/// One read takes whatever the socket holds, up to this much.
pub const READ_BUFFER: usize = 64 * 1024;
/// Events taken from one `epoll_wait`.
const EVENTS_PER_WAIT: usize = 1024;
/// After `Logout`, how long to wait for the servers to close the connections.
const LOGOUT_LINGER: Duration = Duration::from_secs(1);

/// What every bot shares; times are absolute.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: SocketAddr,
    pub bots: u32,
    pub started: Instant,
    pub connect_interval: Duration,
    pub move_interval: Duration,
    /// No move is sent at or after this instant.
    pub sending_ends: Instant,
    /// Moves unanswered at this instant are lost.
    pub drain_ends: Instant,
    /// Bots spawn uniformly in this inclusive rectangle of cells.
    pub spawn_area: (u32, u32, u32, u32),
    pub name_prefix: String,
    pub seed: u64,
    /// Moves wait for the next multiple of this since `started`; zero: no waiting.
    pub send_tick: Duration,
}

impl Plan {
    /// When a move due at `due` is sent: at `due`, or at the first tick boundary at or
    /// after it.
    pub fn release_at(&self, due: Instant) -> Instant {
        let tick = self.send_tick.as_nanos();
        if tick == 0 {
            return due;
        }
        let since = due.saturating_duration_since(self.started).as_nanos();
        let ticks = since.div_ceil(tick);
        self.started + Duration::from_nanos((ticks * tick).min(u64::MAX as u128) as u64)
    }
}

/// The system calls of the run, as this client made them.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct IoCounts {
    pub epoll_waits: u64,
    /// Waits that returned no event (a timer: a move or a connect fell due).
    pub epoll_waits_idle: u64,
    pub events: u64,
    pub reads: u64,
    /// Reads that found nothing (`EAGAIN`): with level-triggered epoll there should be
    /// none.
    pub reads_empty: u64,
    pub bytes_read: u64,
    pub writes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    LoggingIn,
    Playing,
    LoggingOut,
    Closed,
}

struct Bot {
    stream: Option<TcpStream>,
    phase: Phase,
    player_id: u64,
    /// Bytes read but not yet a whole frame.
    inbox: Vec<u8>,
    /// Bytes the socket has not taken yet (only when its send buffer was full).
    outbox: Vec<u8>,
    pending: Pending,
    last_client_time: u64,
}

/// The run's state: the plan, the sockets and the bookkeeping.
pub struct Client {
    plan: Plan,
    epoll: Epoll,
    bots: Vec<Bot>,
    /// `(due, bot)` of every bot's next move.
    schedule: BinaryHeap<Reverse<(Instant, u32)>>,
    rng: SmallRng,
    tally: Tally,
    io: IoCounts,
    online: u64,
    /// Moves sent and not yet answered, over all bots.
    waiting: usize,
    scratch: Vec<u8>,
    frame: Vec<u8>,
    events: Vec<ServerEvent>,
}

impl Client {
    pub fn new(plan: Plan) -> io::Result<Client> {
        Ok(Client {
            epoll: Epoll::new(EVENTS_PER_WAIT)?,
            bots: Vec::with_capacity(plan.bots as usize),
            schedule: BinaryHeap::new(),
            rng: SmallRng::seed_from_u64(plan.seed),
            tally: Tally::new(plan.started, plan.sending_ends),
            io: IoCounts::default(),
            online: 0,
            waiting: 0,
            scratch: vec![0; READ_BUFFER],
            frame: Vec::with_capacity(64),
            events: Vec::new(),
            plan,
        })
    }

    /// Runs to the end and returns what was counted.
    pub fn run(mut self) -> io::Result<(Tally, IoCounts)> {
        let mut ready = Vec::with_capacity(EVENTS_PER_WAIT);
        let mut progress_second = 0;
        loop {
            let now = Instant::now();
            self.connect_due(now);
            self.send_due(now);
            self.tally.bots_online(now, self.online);
            let elapsed = now.saturating_duration_since(self.plan.started).as_secs() as usize;
            while progress_second < elapsed {
                if let Some(line) = self.tally.progress_line(progress_second, self.plan.bots) {
                    eprintln!("{line}");
                }
                progress_second += 1;
            }
            let sending = now < self.plan.sending_ends;
            if !sending && (self.waiting == 0 || now >= self.plan.drain_ends) {
                break;
            }
            let next_connect = (self.bots.len() < self.plan.bots as usize)
                .then(|| self.connect_due_at(self.bots.len() as u32));
            let next_move =
                self.schedule.peek().map(|Reverse((due, _))| self.plan.release_at(*due));
            let phase_end = if sending { self.plan.sending_ends } else { self.plan.drain_ends };
            let wake_at = [next_connect, next_move, Some(phase_end)].into_iter().flatten().min();
            let timeout = wake_at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
            self.wait(timeout, &mut ready)?;
            for event in ready.drain(..) {
                self.handle(event);
            }
        }
        self.log_out(&mut ready)?;
        Ok((self.tally, self.io))
    }

    fn wait(&mut self, timeout: Duration, ready: &mut Vec<Ready>) -> io::Result<()> {
        self.epoll.wait(timeout, ready)?;
        self.io.epoll_waits += 1;
        self.io.events += ready.len() as u64;
        if ready.is_empty() {
            self.io.epoll_waits_idle += 1;
        }
        Ok(())
    }

    fn connect_due_at(&self, index: u32) -> Instant {
        self.plan.started + self.plan.connect_interval.saturating_mul(index)
    }

    /// Starts every connect that is due, while moves are still being sent.
    fn connect_due(&mut self, now: Instant) {
        while self.bots.len() < self.plan.bots as usize {
            let index = self.bots.len() as u32;
            let due = self.connect_due_at(index);
            if due > now {
                return;
            }
            if due >= self.plan.sending_ends {
                // Too late to play: the rest are never started.
                self.plan.bots = index;
                return;
            }
            let mut bot = Bot {
                stream: None,
                phase: Phase::Closed,
                player_id: 0,
                inbox: Vec::new(),
                outbox: Vec::new(),
                pending: Pending::default(),
                last_client_time: 0,
            };
            match net::start_connect(self.plan.target) {
                Ok(stream) => match self.epoll.add(stream.as_raw_fd(), u64::from(index), true) {
                    Ok(()) => {
                        bot.stream = Some(stream);
                        bot.phase = Phase::Connecting;
                    }
                    Err(_) => self.tally.connect_failures += 1,
                },
                Err(_) => self.tally.connect_failures += 1,
            }
            self.bots.push(bot);
        }
    }

    /// Sends every move that has fallen due.
    fn send_due(&mut self, now: Instant) {
        while let Some(&Reverse((due, index))) = self.schedule.peek() {
            // Release times grow with due times, so the heap's order holds for both.
            if self.plan.release_at(due) > now {
                return;
            }
            self.schedule.pop();
            if due >= self.plan.sending_ends || self.bots[index as usize].phase != Phase::Playing {
                continue;
            }
            let since_start = now.saturating_duration_since(self.plan.started).as_micros() as u64;
            let bot = &mut self.bots[index as usize];
            // Microseconds since the start, made unique and non-zero for this bot.
            let client_time = (since_start + 1).max(bot.last_client_time + 1);
            bot.last_client_time = client_time;
            bot.pending.sent(client_time, now);
            self.waiting += 1;
            self.tally.move_sent(due, now);
            let direction = Direction::ALL[self.rng.random_range(0..Direction::ALL.len())];
            self.frame.clear();
            wire::put_move(&mut self.frame, direction, client_time);
            let frame = std::mem::take(&mut self.frame);
            self.send(index, &frame);
            self.frame = frame;
            if self.bots[index as usize].phase == Phase::Playing {
                self.schedule.push(Reverse((due + self.plan.move_interval, index)));
            }
        }
    }

    /// Writes `bytes` to bot `index`, after anything still waiting; what the socket does
    /// not take waits in the outbox until it turns writable.
    fn send(&mut self, index: u32, bytes: &[u8]) {
        let bot = &mut self.bots[index as usize];
        let Some(stream) = &bot.stream else { return };
        if !bot.outbox.is_empty() {
            bot.outbox.extend_from_slice(bytes);
            return;
        }
        self.io.writes += 1;
        match (&*stream).write(bytes) {
            Ok(n) if n == bytes.len() => {}
            Ok(n) => self.keep_for_later(index, &bytes[n..]),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                self.keep_for_later(index, bytes)
            }
            Err(_) => self.broken(index),
        }
    }

    fn keep_for_later(&mut self, index: u32, rest: &[u8]) {
        let bot = &mut self.bots[index as usize];
        bot.outbox.extend_from_slice(rest);
        if let Some(stream) = &bot.stream {
            if self.epoll.modify(stream.as_raw_fd(), u64::from(index), true).is_err() {
                self.broken(index);
            }
        }
    }

    /// Writes what waits in the outbox, now that the socket is writable.
    fn flush(&mut self, index: u32) {
        let bot = &mut self.bots[index as usize];
        let Some(stream) = &bot.stream else { return };
        self.io.writes += 1;
        match (&*stream).write(&bot.outbox) {
            Ok(n) => {
                bot.outbox.drain(..n);
                if bot.outbox.is_empty()
                    && self.epoll.modify(stream.as_raw_fd(), u64::from(index), false).is_err()
                {
                    self.broken(index);
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.broken(index),
        }
    }

    fn handle(&mut self, ready: Ready) {
        let index = ready.token as u32;
        let Some(bot) = self.bots.get(index as usize) else { return };
        match bot.phase {
            Phase::Closed => {}
            Phase::Connecting => self.connected(index),
            _ => {
                if ready.writable && !bot.outbox.is_empty() {
                    self.flush(index);
                }
                if ready.readable || ready.broken {
                    self.read(index);
                }
            }
        }
    }

    /// The connect finished, one way or the other: log in if it worked.
    fn connected(&mut self, index: u32) {
        let bot = &mut self.bots[index as usize];
        let Some(stream) = &bot.stream else { return };
        let worked = matches!(stream.take_error(), Ok(None)) && stream.peer_addr().is_ok();
        if !worked || stream.set_nodelay(true).is_err() {
            self.tally.connect_failures += 1;
            self.close(index);
            return;
        }
        bot.phase = Phase::LoggingIn;
        let (x0, y0, x1, y1) = self.plan.spawn_area;
        let spawn = (self.rng.random_range(x0..=x1), self.rng.random_range(y0..=y1));
        let name = format!("{}-{index}", self.plan.name_prefix);
        self.frame.clear();
        wire::put_login(&mut self.frame, &name, Some(spawn));
        let frame = std::mem::take(&mut self.frame);
        // Read interest only, unless the login itself did not fit.
        if let Some(stream) = &self.bots[index as usize].stream {
            if self.epoll.modify(stream.as_raw_fd(), u64::from(index), false).is_err() {
                self.broken(index);
            }
        }
        self.send(index, &frame);
        self.frame = frame;
    }

    /// One read, then every whole frame in the inbox.
    fn read(&mut self, index: u32) {
        let bot = &mut self.bots[index as usize];
        let Some(stream) = &bot.stream else { return };
        self.io.reads += 1;
        let n = match (&*stream).read(&mut self.scratch) {
            Ok(0) => return self.broken(index),
            Ok(n) => n,
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                self.io.reads_empty += 1;
                return;
            }
            Err(_) => return self.broken(index),
        };
        let now = Instant::now();
        self.io.bytes_read += n as u64;
        if bot.phase == Phase::LoggingOut {
            return; // Nothing is counted after Logout; only the close is awaited.
        }
        bot.inbox.extend_from_slice(&self.scratch[..n]);
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let mut used = 0;
        let mut undecodable = false;
        loop {
            match wire::split_frame(&bot.inbox[used..]) {
                Ok(Some((body, len))) => {
                    used += len;
                    match wire::read_server_message(body) {
                        Ok(event) => events.push(event),
                        Err(_) => {
                            undecodable = true;
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    undecodable = true;
                    break;
                }
            }
        }
        bot.inbox.drain(..used);
        for event in events.drain(..) {
            self.on_message(index, event, now);
        }
        self.events = events;
        if undecodable {
            self.broken(index);
        }
    }

    /// One server message to bot `index`, read at `now`.
    fn on_message(&mut self, index: u32, event: ServerEvent, now: Instant) {
        let bot = &mut self.bots[index as usize];
        match (bot.phase, event) {
            (Phase::LoggingIn, ServerEvent::LoginOk { player_id }) => {
                bot.player_id = player_id;
                bot.phase = Phase::Playing;
                self.tally.bots_connected += 1;
                self.online += 1;
                let interval_ns = self.plan.move_interval.as_nanos().max(1) as u64;
                let first = now + Duration::from_nanos(self.rng.random_range(0..interval_ns));
                self.schedule.push(Reverse((first, index)));
            }
            (Phase::LoggingIn, ServerEvent::Error { code, .. }) => {
                self.tally.error(code);
                self.tally.login_failures += 1;
                self.close(index);
            }
            (Phase::LoggingIn, _) => {}
            (Phase::Playing, ServerEvent::Moved { player_id, client_time })
                if player_id == bot.player_id && client_time != 0 =>
            {
                match bot.pending.answer(client_time) {
                    Some(sent_at) => {
                        self.waiting -= 1;
                        self.tally.acked(sent_at, now);
                    }
                    None => self.tally.acks_unmatched += 1,
                }
            }
            (Phase::Playing, ServerEvent::Error { code, client_time }) => {
                self.tally.error(code);
                if client_time != 0 && bot.pending.answer(client_time).is_some() {
                    self.waiting -= 1;
                    self.tally.moves_errored += 1;
                }
            }
            (Phase::Playing, ServerEvent::ViewReset) => {
                // Moves unanswered at a ViewReset were not applied and never will be.
                let forgotten = bot.pending.forget_all();
                self.waiting -= forgotten;
                self.tally.moves_lost += forgotten as u64;
                self.tally.view_resets += 1;
                self.tally.notification(now);
            }
            (Phase::Playing, _) => self.tally.notification(now),
            (Phase::Connecting | Phase::LoggingOut | Phase::Closed, _) => {}
        }
    }

    /// The connection broke (or the server closed it): whatever the bot was doing counts
    /// as failed, and its waiting moves as lost.
    fn broken(&mut self, index: u32) {
        match self.bots[index as usize].phase {
            Phase::Connecting => self.tally.connect_failures += 1,
            Phase::LoggingIn => self.tally.login_failures += 1,
            Phase::Playing => self.tally.disconnects += 1,
            Phase::LoggingOut | Phase::Closed => {}
        }
        self.close(index);
    }

    fn close(&mut self, index: u32) {
        let bot = &mut self.bots[index as usize];
        if bot.phase == Phase::Playing {
            self.online -= 1;
        }
        let lost = bot.pending.forget_all();
        self.waiting -= lost;
        self.tally.moves_lost += lost as u64;
        bot.phase = Phase::Closed;
        // Closing the socket also takes it out of the epoll set.
        bot.stream = None;
        bot.inbox = Vec::new();
        bot.outbox = Vec::new();
    }

    /// Counts what is still unanswered as lost, sends every bot `Logout`, and waits (at
    /// most `LOGOUT_LINGER`) for the server to close, so it sees a logout, not a reset.
    fn log_out(&mut self, ready: &mut Vec<Ready>) -> io::Result<()> {
        self.frame.clear();
        wire::put_logout(&mut self.frame);
        let logout = std::mem::take(&mut self.frame);
        let mut closing = 0;
        for index in 0..self.bots.len() as u32 {
            let bot = &mut self.bots[index as usize];
            let lost = bot.pending.forget_all();
            self.waiting -= lost;
            self.tally.moves_lost += lost as u64;
            match bot.phase {
                Phase::Playing => {
                    self.online -= 1;
                    bot.phase = Phase::LoggingOut;
                    self.send(index, &logout);
                    let bot = &self.bots[index as usize];
                    if let Some(stream) = &bot.stream {
                        if bot.outbox.is_empty() {
                            let _ = stream.shutdown(Shutdown::Write);
                        }
                        closing += 1;
                    }
                }
                Phase::Connecting | Phase::LoggingIn => {
                    self.tally.login_failures += 1;
                    self.close(index);
                }
                Phase::LoggingOut | Phase::Closed => {}
            }
        }
        let linger_ends = Instant::now() + LOGOUT_LINGER;
        while closing > 0 {
            let now = Instant::now();
            if now >= linger_ends {
                break;
            }
            self.wait(linger_ends - now, ready)?;
            for event in ready.drain(..) {
                let index = event.token as u32;
                if self.bots.get(index as usize).map(|b| b.phase) != Some(Phase::LoggingOut) {
                    continue;
                }
                self.handle(event);
                if self.bots[index as usize].phase == Phase::Closed {
                    closing -= 1;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(send_tick: Duration) -> Plan {
        let started = Instant::now();
        Plan {
            target: "127.0.0.1:1".parse().unwrap(),
            bots: 1,
            started,
            connect_interval: Duration::from_millis(1),
            move_interval: Duration::from_millis(250),
            sending_ends: started + Duration::from_secs(1),
            drain_ends: started + Duration::from_secs(2),
            spawn_area: (0, 0, 0, 0),
            name_prefix: "t".to_owned(),
            seed: 1,
            send_tick,
        }
    }

    #[test]
    fn moves_wait_for_the_next_tick_boundary_only_when_asked() {
        let exact = plan(Duration::ZERO);
        let due = exact.started + Duration::from_micros(1_234);
        assert_eq!(exact.release_at(due), due);

        let ticked = plan(Duration::from_millis(1));
        let at = |micros| ticked.started + Duration::from_micros(micros);
        assert_eq!(ticked.release_at(at(1_234)), at(2_000));
        assert_eq!(ticked.release_at(at(2_000)), at(2_000), "on a boundary: no wait");
        assert_eq!(ticked.release_at(at(2_001)), at(3_000));
        assert_eq!(ticked.release_at(ticked.started), ticked.started);
        // Monotonic, so the schedule's heap order is the release order.
        let releases: Vec<Instant> =
            (0..5_000).step_by(7).map(|us| ticked.release_at(at(us))).collect();
        assert!(releases.windows(2).all(|w| w[0] <= w[1]));
    }
}
