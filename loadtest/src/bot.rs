//! One bot: connect, log in, move on an open-loop schedule, match every answer to its
//! move, then log out.
//!
//! The socket is split: a writer sends the k-th move at `login + phase + k * interval`
//! whatever has come back so far, and a reader, polled concurrently in the same task,
//! matches each own `Moved` (or `Error`) to its move by `client_time`. A slow server thus
//! cannot slow the send schedule down and hide its own delay, and a server that stops
//! reading cannot stop the bot from reading.
//!
//! With `--actions-per-second` the writer also sends the example game's `ATTACK` on a
//! second open-loop schedule of its own, aimed at the nearest wolf the reader has seen
//! (`sight`), and the reader matches each `ActionDone` (or `Error`) to its action the same
//! way. Moves and actions share one `client_time` sequence, so an `Error` names exactly one
//! of them.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use meridian_protocol::pb::{
    self, client_message, server_message, ClientMessage, ErrorCode, ServerMessage,
};
use meridian_protocol::{encode_frame, CodecError, FrameReader, DEFAULT_MAX_FRAME};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::sync::Notify;
use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::debug;

use crate::cli::{bot_name, SpawnArea};
use crate::sight::Sight;
use crate::stats::{bump, Stats};

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a bot waits for its `LoginOk`.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// After `Logout`, how long a bot waits for the server to close before closing itself.
const LOGOUT_LINGER: Duration = Duration::from_secs(1);
/// Socket read size; the frame reader keeps any partial frame between reads.
const READ_CHUNK: usize = 4096;

/// The example game's (`examples/wolves`) action that attacks an adjacent entity, and the
/// entity kind of its wolves: what `--actions-per-second` sends and aims at.
const ATTACK: u32 = 1;
const WOLF: u32 = 1;

const DIRECTIONS: [pb::Direction; 4] =
    [pb::Direction::Up, pb::Direction::Down, pb::Direction::Left, pb::Direction::Right];

/// A bot's byte stream, read side: a TCP socket's, a QUIC stream's, or a WebSocket's made
/// to look like one (`crate::ws`).
pub type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
/// A bot's byte stream, write side.
pub type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

/// One bot's connection: the protocol's byte stream, whatever carries it.
pub struct Conn {
    read_half: ReadHalf,
    write_half: WriteHalf,
}

/// What carries a bot's messages (`--transport`).
#[derive(Debug)]
pub enum Carrier {
    Tcp,
    /// The client endpoints every QUIC bot shares.
    Quic(crate::quic::QuicClients),
    /// A WebSocket upgraded on a TCP connection of the bot's own.
    WebSocket,
}

/// What every bot of the run shares and never changes.
#[derive(Debug)]
pub struct Plan {
    pub target: SocketAddr,
    /// `--resume-addr`: where a bot told `SHUTTING_DOWN` resumes, after `target`.
    pub resume_targets: Vec<SocketAddr>,
    pub carrier: Carrier,
    pub source_ips: u32,
    pub name_prefix: String,
    pub spawn_area: Option<SpawnArea>,
    /// Battle mode: moves stay inside `spawn_area`.
    pub battle: bool,
    /// `--disperse-after`: when a share of the bots leave.
    pub disperse: Option<crate::cli::Disperse>,
    /// Shard borders (columns, rows): acks that land across one count as crossings.
    pub border_x: Vec<u32>,
    pub border_y: Vec<u32>,
    pub move_interval: Duration,
    /// `--actions-per-second` as an interval; `None`: the bots send no actions.
    pub action_interval: Option<Duration>,
    pub seed: u64,
    /// When the first bot started; `client_time` counts microseconds from here.
    pub started: Instant,
    /// No move is due at or after `started` plus this many microseconds. Ramp mode pulls
    /// it in when a step fails, so it is read on every use, never cached.
    pub sending_ends_us: AtomicU64,
    /// Moves still unanswered this long after sending ends are lost.
    pub drain: Duration,
}

impl Plan {
    /// No move is due at or after this instant.
    pub fn sending_ends(&self) -> Instant {
        self.started + Duration::from_micros(self.sending_ends_us.load(Ordering::Relaxed))
    }

    /// Moves still unanswered at this instant are lost.
    pub fn drain_ends(&self) -> Instant {
        self.sending_ends() + self.drain
    }

    /// Ends sending at `at` if that is earlier than planned (ramp mode: a step failed). A
    /// bot notices at its next due move, at most one move interval later.
    pub fn stop_sending_at(&self, at: Instant) {
        let micros = at.saturating_duration_since(self.started).as_micros() as u64;
        self.sending_ends_us.fetch_min(micros, Ordering::Relaxed);
    }

    /// The loopback source address of bot `index`, when bots are spread over several.
    fn source_ip(&self, index: u32) -> Option<IpAddr> {
        source_ip(self.source_ips, index)
    }
}

/// The loopback source address of bot `index` among `source_ips`, if more than one.
pub fn source_ip(source_ips: u32, index: u32) -> Option<IpAddr> {
    (source_ips > 1).then(|| {
        let first = u32::from(Ipv4Addr::LOCALHOST);
        IpAddr::V4(Ipv4Addr::from(first + index % source_ips))
    })
}

/// Opens bot `index`'s connection, from its source address if the run spreads them: a
/// TCP connection, a QUIC connection and its one bidirectional stream, or a WebSocket.
pub async fn connect(plan: &Plan, index: u32) -> io::Result<Conn> {
    connect_to(plan, index, plan.target).await
}

/// [`connect`] to `target` (the first gateway, or one to resume on).
async fn connect_to(plan: &Plan, index: u32, target: SocketAddr) -> io::Result<Conn> {
    let deadline = (Instant::now() + CONNECT_TIMEOUT).min(plan.drain_ends());
    if let Carrier::Quic(quic) = &plan.carrier {
        let connecting =
            quic.endpoint(index).connect(target, &quic.server_name).map_err(io::Error::other)?;
        let connection = timeout_at(deadline, connecting)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "QUIC handshake timed out"))?
            .map_err(io::Error::other)?;
        let (send, recv) = connection.open_bi().await.map_err(io::Error::other)?;
        return Ok(Conn { read_half: Box::new(recv), write_half: Box::new(send) });
    }
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(source) = plan.source_ip(index) {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    let stream = timeout_at(deadline, socket.connect(target))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    // Moves are tiny and latency is what is measured: never let Nagle hold one back.
    stream.set_nodelay(true)?;
    if let Carrier::WebSocket = plan.carrier {
        let host = target.to_string();
        let (read_half, write_half) =
            timeout_at(deadline, crate::ws::upgrade(stream, &host)).await.map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, "WebSocket upgrade timed out")
            })??;
        return Ok(Conn { read_half: Box::new(read_half), write_half: Box::new(write_half) });
    }
    let (read_half, write_half) = stream.into_split();
    Ok(Conn { read_half: Box::new(read_half), write_half: Box::new(write_half) })
}

/// Runs bot `index` to the end; every outcome lands in `stats`, nothing is returned.
pub async fn run(plan: Arc<Plan>, stats: Arc<Stats>, index: u32, conn: Option<Conn>) {
    let conn = match conn {
        Some(conn) => conn,
        None => match connect(&plan, index).await {
            Ok(stream) => stream,
            Err(error) => {
                debug!(bot = index, %error, "connect failed");
                bump(&stats.connect_failures);
                return;
            }
        },
    };
    let mut rng = SmallRng::seed_from_u64(plan.seed.wrapping_add(u64::from(index)));
    let Conn { mut read_half, mut write_half } = conn;
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut encoded = Vec::with_capacity(64);
    let mut read_buf = vec![0u8; READ_CHUNK];

    let login = Login {
        name: bot_name(&plan.name_prefix, index),
        spawn: plan.spawn_area.map(|area| random_cell(&mut rng, area)),
    };
    let io = Io {
        read_half: &mut read_half,
        write_half: &mut write_half,
        frames: &mut frames,
        read_buf: &mut read_buf,
        encoded: &mut encoded,
    };
    let (player_id, login_cell, token) = match log_in(io, &login, &stats, &plan).await {
        Ok(answer) => answer,
        Err(error) => {
            debug!(bot = index, %error, "login failed");
            bump(&stats.login_failures);
            return;
        }
    };
    let logged_in_at = Instant::now();
    bump(&stats.bots_connected);
    bump(&stats.bots_online);

    let mut session = Session {
        plan: &plan,
        stats: &stats,
        player_id,
        position: AtomicU64::new(login_cell.map_or(u64::MAX, pack)),
        ledger: Mutex::new(Ledger { last_ack: Some(logged_in_at), token, ..Ledger::default() }),
        sight: plan.action_interval.map(|_| {
            let mut sight = Sight::new(WOLF);
            if let Some(cell) = login_cell {
                sight.set_me(cell);
            }
            Mutex::new(sight)
        }),
        writer_done: Notify::new(),
        reader_done: Notify::new(),
        leaves_at: plan.disperse.filter(|d| d.leaves(index)).map(|d| plan.started + d.after),
    };
    let mut gateway = 0;
    let mut schedule_from = logged_in_at;
    let writer_intact = loop {
        let (writer_intact, ()) = tokio::join!(
            session.send_moves(&mut write_half, &mut encoded, &mut rng, schedule_from),
            session.read_answers(&mut read_half, &mut frames, &mut read_buf),
        );
        if !std::mem::take(&mut session.ledger().moving) {
            break writer_intact;
        }
        // The gateway said SHUTTING_DOWN and closed: on to the next one, with the token.
        let Some(conn) = session.resume_elsewhere(index, &mut gateway, &mut encoded).await else {
            bump(&stats.resume_failures);
            session.mark_disconnected();
            break false;
        };
        bump(&stats.resumes);
        Conn { read_half, write_half } = conn.0;
        frames = conn.1;
        session.writer_done = Notify::new();
        session.reader_done = Notify::new();
        session.ledger().sending_done = false;
        schedule_from = Instant::now();
    };
    stats.bots_online.fetch_sub(1, Ordering::Relaxed);
    let disconnected = {
        let ledger = session.ledger();
        let unanswered = ledger.outstanding.len() + ledger.crossed.len();
        stats.moves_lost.fetch_add(unanswered as u64, Ordering::Relaxed);
        stats.actions_lost.fetch_add(ledger.actions.len() as u64, Ordering::Relaxed);
        if ledger.acked {
            stats.ack_gaps.record(ledger.longest_gap.as_micros() as u64);
        }
        ledger.disconnected
    };
    if disconnected || !writer_intact {
        return;
    }
    let io = Io {
        read_half: &mut read_half,
        write_half: &mut write_half,
        frames: &mut frames,
        read_buf: &mut read_buf,
        encoded: &mut encoded,
    };
    if let Err(error) = log_out(io).await {
        debug!(bot = index, %error, "logout did not complete cleanly");
    }
}

struct Login {
    name: String,
    spawn: Option<pb::Position>,
}

/// The bot's socket halves and its reused buffers.
struct Io<'a> {
    read_half: &'a mut ReadHalf,
    write_half: &'a mut WriteHalf,
    frames: &'a mut FrameReader,
    read_buf: &'a mut [u8],
    encoded: &'a mut Vec<u8>,
}

fn random_cell(rng: &mut SmallRng, area: SpawnArea) -> pb::Position {
    pb::Position { x: rng.random_range(area.x0..=area.x1), y: rng.random_range(area.y0..=area.y1) }
}

async fn send(
    write_half: &mut WriteHalf,
    encoded: &mut Vec<u8>,
    kind: client_message::Kind,
) -> io::Result<()> {
    encoded.clear();
    encode_frame(&ClientMessage { kind: Some(kind) }, encoded);
    write_half.write_all(encoded).await?;
    // Costs nothing on TCP and QUIC (both write through); a WebSocket sends on flush.
    write_half.flush().await
}

/// Sends `Login` and waits for `LoginOk`; returns the player id and its cell. Messages
/// after `LoginOk` stay in `frames` for the reader.
async fn log_in(
    io: Io<'_>,
    login: &Login,
    stats: &Stats,
    plan: &Plan,
) -> anyhow::Result<(u64, Option<(u32, u32)>, Vec<u8>)> {
    let message = pb::Login { name: login.name.clone(), spawn: login.spawn, token: String::new() };
    send(io.write_half, io.encoded, client_message::Kind::Login(message)).await?;
    let deadline = (Instant::now() + LOGIN_TIMEOUT).min(plan.drain_ends());
    loop {
        while let Some(message) = io.frames.next_message::<ServerMessage>()? {
            match message.kind {
                Some(server_message::Kind::LoginOk(ok)) => {
                    let at = ok.position.map(|p| (p.x, p.y));
                    return Ok((ok.player_id, at, ok.resume_token));
                }
                Some(server_message::Kind::Error(error)) => {
                    stats.record_error(error.code);
                    bail!("login refused with error {}: {}", error.code, error.detail);
                }
                _ => {}
            }
        }
        let read = timeout_at(deadline, io.read_half.read(io.read_buf))
            .await
            .map_err(|_| anyhow!("no LoginOk within the login timeout"))?
            .context("reading the login answer")?;
        if read == 0 {
            bail!("server closed the connection before LoginOk");
        }
        io.frames.extend(&io.read_buf[..read]);
    }
}

/// Sends `Resume` with `token` and waits for its `ViewReset`, which it returns. Messages
/// after it stay in `frames` for the reader.
async fn resume(
    io: Io<'_>,
    token: Vec<u8>,
    plan: &Plan,
    stats: &Stats,
) -> anyhow::Result<pb::ViewReset> {
    send(io.write_half, io.encoded, client_message::Kind::Resume(pb::Resume { token })).await?;
    let deadline = (Instant::now() + LOGIN_TIMEOUT).min(plan.drain_ends());
    loop {
        while let Some(message) = io.frames.next_message::<ServerMessage>()? {
            match message.kind {
                Some(server_message::Kind::ViewReset(reset)) => return Ok(reset),
                Some(server_message::Kind::Error(error)) if error.client_time == 0 => {
                    stats.record_error(error.code);
                    bail!("resume refused with error {}: {}", error.code, error.detail);
                }
                _ => {}
            }
        }
        let read = timeout_at(deadline, io.read_half.read(io.read_buf))
            .await
            .map_err(|_| anyhow!("no ViewReset within the login timeout"))?
            .context("reading the resume answer")?;
        if read == 0 {
            bail!("server closed the connection before ViewReset");
        }
        io.frames.extend(&io.read_buf[..read]);
    }
}

/// Sends `Logout`, then waits (briefly) for the server to close so that it sees a clean
/// logout rather than a reset.
async fn log_out(io: Io<'_>) -> io::Result<()> {
    let linger_ends = Instant::now() + LOGOUT_LINGER;
    let goodbye = async {
        let logout = client_message::Kind::Logout(pb::Logout {});
        send(io.write_half, io.encoded, logout).await?;
        io.write_half.shutdown().await?;
        while io.read_half.read(io.read_buf).await? > 0 {}
        Ok(())
    };
    timeout_at(linger_ends, goodbye)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "server did not close")))
}

/// The moves and actions of one bot that are still waiting for an answer, oldest first.
#[derive(Debug, Default)]
struct Ledger {
    /// Moves: `(client_time, sent at)`.
    outstanding: VecDeque<(u64, Instant)>,
    /// Moves still unanswered when a `ViewReset` came: not applied before it, but one that
    /// crossed the reset on the wire may be applied after it and acked (docs/protocol.md,
    /// "ViewReset"). Answered or, at the end, lost.
    crossed: VecDeque<(u64, Instant)>,
    /// Actions: `(client_time, sent at, whom it aimed at)`.
    actions: VecDeque<(u64, Instant, Aim)>,
    /// The writer has sent its last move.
    sending_done: bool,
    /// The connection broke before the bot was done with it.
    disconnected: bool,
    /// The latest resume token (from `LoginOk`, or a `ViewReset` that carried one).
    token: Vec<u8>,
    /// The gateway said `SHUTTING_DOWN` and there is another to resume on: the writer
    /// stops, the reader reads to the close, then the bot moves.
    moving: bool,
    /// The last move ack (or the login, before the first), and the longest time between
    /// two of them so far.
    last_ack: Option<Instant>,
    longest_gap: Duration,
    acked: bool,
}

/// What the writer and reader of one bot share. Only these two futures ever take the
/// ledger's lock, so it is never contended across bots.
struct Session<'a> {
    plan: &'a Plan,
    stats: &'a Stats,
    player_id: u64,
    /// Own position as of the last ack or ViewReset, packed `x << 32 | y`; `u64::MAX`
    /// before the first.
    position: AtomicU64,
    ledger: Mutex<Ledger>,
    /// With `--actions-per-second`: the wolves in sight, for the actions' target.
    sight: Option<Mutex<Sight>>,
    writer_done: Notify,
    reader_done: Notify,
    /// `--disperse-after`, for a bot among those that leave: it sends nothing due at or
    /// after this instant, and logs out once its moves are answered.
    leaves_at: Option<Instant>,
}

/// Whom an action aimed at, seen from the bot when it sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aim {
    /// No wolf in sight: target 0.
    NoOne,
    /// A wolf on the bot's side of every `--border-x/--border-y` line (all of them when
    /// no borders are given).
    Within,
    /// A wolf across a border: owned by a neighbour shard, a ghost on the bot's.
    Across,
}

/// Whom the nearest wolf in `sight` is, for an action sent now.
fn aim(sight: &Sight, border_x: &[u32], border_y: &[u32]) -> (u64, Aim) {
    let Some((target, at)) = sight.nearest_at() else { return (0, Aim::NoOne) };
    let Some(me) = sight.me() else { return (target, Aim::Within) };
    let apart = |borders: &[u32], a: u32, b: u32| borders.iter().any(|&l| (a < l) != (b < l));
    if apart(border_x, me.0, at.0) || apart(border_y, me.1, at.1) {
        (target, Aim::Across)
    } else {
        (target, Aim::Within)
    }
}

/// Takes the entry of `client_time` out of a ledger queue; returns when it was sent.
/// Answers come in send order, so the match is almost always at the front.
fn take(queue: &mut VecDeque<(u64, Instant)>, client_time: u64) -> Option<Instant> {
    let position = queue.iter().position(|&(ct, _)| ct == client_time)?;
    queue.remove(position).map(|(_, sent_at)| sent_at)
}

/// [`take`] for the actions' queue: when it was sent and whom it aimed at.
fn take_action(queue: &mut VecDeque<(u64, Instant, Aim)>, ct: u64) -> Option<(Instant, Aim)> {
    let position = queue.iter().position(|&(sent, _, _)| sent == ct)?;
    queue.remove(position).map(|(_, sent_at, aimed)| (sent_at, aimed))
}

/// `direction`, or its opposite if a step that way from `position` (packed, `u64::MAX` if
/// unknown) would leave `area`.
fn stay_inside(area: SpawnArea, position: u64, direction: pb::Direction) -> pb::Direction {
    use pb::Direction::{Down, Left, Right, Up};
    if position == u64::MAX {
        return direction;
    }
    let (x, y) = ((position >> 32) as u32, position as u32);
    let leaves = match direction {
        Up => y <= area.y0,
        Down => y >= area.y1,
        Left => x <= area.x0,
        Right => x >= area.x1,
        _ => false,
    };
    match (leaves, direction) {
        (false, _) => direction,
        (true, Up) => Down,
        (true, Down) => Up,
        (true, Left) => Right,
        (true, _) => Left,
    }
}

fn pack((x, y): (u32, u32)) -> u64 {
    (u64::from(x) << 32) | u64::from(y)
}

impl Session<'_> {
    /// No move of this bot is due at or after this instant: the run's end, or earlier for
    /// a bot that leaves when the crowd disperses.
    fn sending_ends(&self) -> Instant {
        let ends = self.plan.sending_ends();
        self.leaves_at.map_or(ends, |leaves| leaves.min(ends))
    }

    /// This bot's moves still unanswered at this instant are lost.
    fn drain_ends(&self) -> Instant {
        self.leaves_at.map_or(self.plan.drain_ends(), |leaves| {
            (leaves + self.plan.drain).min(self.plan.drain_ends())
        })
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Updates the view the actions aim by, when the bot sends actions.
    fn with_sight(&self, update: impl FnOnce(&mut Sight)) {
        if let Some(sight) = &self.sight {
            update(&mut sight.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// The nearest wolf in sight (0 for none), and whether it stands across a border.
    fn nearest_wolf(&self) -> (u64, Aim) {
        let Some(sight) = &self.sight else { return (0, Aim::NoOne) };
        let sight = sight.lock().unwrap_or_else(PoisonError::into_inner);
        aim(&sight, &self.plan.border_x, &self.plan.border_y)
    }

    /// Counts a broken connection once, whichever half notices it first.
    fn mark_disconnected(&self) {
        let mut ledger = self.ledger();
        if !ledger.disconnected {
            ledger.disconnected = true;
            bump(&self.stats.disconnects);
        }
    }

    /// Sends every move (and action) due before the end of the run on the open-loop
    /// schedules. Returns whether the write half is still whole (no write was cut off
    /// midway).
    async fn send_moves(
        &self,
        write_half: &mut WriteHalf,
        encoded: &mut Vec<u8>,
        rng: &mut SmallRng,
        logged_in_at: Instant,
    ) -> bool {
        let interval = self.plan.move_interval;
        let phase_ns = rng.random_range(0..interval.as_nanos().max(1) as u64);
        let mut due = logged_in_at + Duration::from_nanos(phase_ns);
        // Actions keep a schedule and a phase of their own. The phase is drawn only when
        // actions are asked for, so a run without them makes the same random choices.
        let mut action_due = self.plan.action_interval.map(|every| {
            let phase_ns = rng.random_range(0..every.as_nanos().max(1) as u64);
            logged_in_at + Duration::from_nanos(phase_ns)
        });
        let mut last_client_time = 0;
        let mut intact = true;
        loop {
            // The next message due: an action only if strictly before the next move.
            let action_next = action_due.filter(|&at| at < due);
            let next = action_next.unwrap_or(due);
            if next >= self.sending_ends() {
                break;
            }
            tokio::select! {
                () = sleep_until(next) => {}
                () = self.reader_done.notified() => break,
            }
            // Ramp mode may have ended the run while this bot slept; or the gateway is
            // going away.
            if next >= self.sending_ends() || self.ledger().moving {
                break;
            }
            let now = Instant::now();
            // Microseconds since the run started, forced unique and non-zero for this bot.
            let since_start = now.saturating_duration_since(self.plan.started).as_micros() as u64;
            let client_time = (since_start + 1).max(last_client_time + 1);
            last_client_time = client_time;
            let lag = now.saturating_duration_since(next).as_micros() as u64;
            self.stats.send_lag_max_us.fetch_max(lag, Ordering::Relaxed);
            // Record before writing, so an answer can never arrive ahead of its entry.
            let kind = if action_next.is_some() {
                let (target, aimed) = self.nearest_wolf();
                self.ledger().actions.push_back((client_time, now, aimed));
                bump(&self.stats.actions_sent);
                if aimed == Aim::Across {
                    bump(&self.stats.actions_aimed_across);
                }
                let attack = pb::Action { kind: ATTACK, payload: Vec::new(), target, client_time };
                client_message::Kind::Action(attack)
            } else {
                let mut direction = DIRECTIONS[rng.random_range(0..DIRECTIONS.len())];
                if let (true, Some(area)) = (self.plan.battle, self.plan.spawn_area) {
                    direction = stay_inside(area, self.position.load(Ordering::Relaxed), direction);
                }
                self.ledger().outstanding.push_back((client_time, now));
                bump(&self.stats.moves_sent);
                client_message::Kind::Move(pb::Move { direction: direction as i32, client_time })
            };
            tokio::select! {
                result = send(write_half, encoded, kind) => {
                    if let Err(error) = result {
                        debug!(player = self.player_id, %error, "write failed");
                        self.mark_disconnected();
                        break;
                    }
                }
                // The reader gave up (drain over or connection gone) while the server was
                // not reading: the frame may be half written, so the socket is unusable.
                () = self.reader_done.notified() => {
                    intact = false;
                    break;
                }
            }
            match (action_next, self.plan.action_interval) {
                (Some(sent), Some(every)) => action_due = Some(sent + every),
                _ => due += interval,
            }
        }
        self.ledger().sending_done = true;
        self.writer_done.notify_one();
        intact
    }

    /// Reads and matches answers until every move is answered after the last one was
    /// sent, the drain deadline passes, or the connection breaks.
    async fn read_answers(
        &self,
        read_half: &mut ReadHalf,
        frames: &mut FrameReader,
        read_buf: &mut [u8],
    ) {
        let mut now = Instant::now();
        loop {
            if let Err(error) = self.handle_frames(frames, now) {
                debug!(player = self.player_id, %error, "undecodable server frame");
                self.mark_disconnected();
                break;
            }
            {
                let ledger = self.ledger();
                let answered = ledger.outstanding.is_empty()
                    && ledger.crossed.is_empty()
                    && ledger.actions.is_empty();
                if ledger.disconnected || (ledger.sending_done && answered) {
                    break;
                }
            }
            tokio::select! {
                read = read_half.read(read_buf) => match read {
                    Ok(0) if self.ledger().moving => break,
                    Ok(0) => {
                        debug!(player = self.player_id, "server closed the connection");
                        self.mark_disconnected();
                        break;
                    }
                    Ok(n) => {
                        now = Instant::now();
                        frames.extend(&read_buf[..n]);
                    }
                    Err(_) if self.ledger().moving => break,
                    Err(error) => {
                        debug!(player = self.player_id, %error, "read failed");
                        self.mark_disconnected();
                        break;
                    }
                },
                // Wakes the loop to re-check the ledger once the last move is out.
                () = self.writer_done.notified() => {}
                () = sleep_until(self.drain_ends()) => break,
            }
        }
        self.reader_done.notify_one();
    }

    /// Handles every whole frame buffered so far, all received at `now`.
    fn handle_frames(&self, frames: &mut FrameReader, now: Instant) -> Result<(), CodecError> {
        let in_window = now < self.plan.sending_ends();
        while let Some(message) = frames.next_message::<ServerMessage>()? {
            match message.kind {
                Some(server_message::Kind::Moved(moved))
                    if moved.player_id == self.player_id && moved.client_time != 0 =>
                {
                    let at = moved.position.map(|p| (p.x, p.y));
                    if let Some(at) = at {
                        self.with_sight(|sight| sight.set_me(at));
                    }
                    self.ack(moved.client_time, at, now);
                }
                Some(server_message::Kind::ActionDone(done)) => {
                    self.action_answered(done.client_time, None, now);
                }
                Some(server_message::Kind::Error(error)) => {
                    let game_answer = error.client_time != 0
                        && self.error_answer(error.client_time, error.code, now);
                    if !game_answer {
                        self.stats.record_error(error.code);
                    }
                    let goodbye =
                        error.client_time == 0 && error.code == ErrorCode::ShuttingDown as i32;
                    if goodbye && !self.plan.resume_targets.is_empty() {
                        self.ledger().moving = true;
                    }
                }
                Some(server_message::Kind::ViewReset(reset)) => {
                    self.view_reset(reset);
                    if in_window {
                        bump(&self.stats.notifications);
                    }
                }
                kind => {
                    if self.sight.is_some() {
                        self.follow(kind.as_ref());
                    }
                    if in_window {
                        bump(&self.stats.notifications);
                    }
                }
            }
        }
        Ok(())
    }

    /// Follows the view for the actions' aim: wolves entering, moving and leaving.
    fn follow(&self, kind: Option<&server_message::Kind>) {
        let cell = |p: Option<pb::Position>| p.map(|p| (p.x, p.y));
        match kind {
            Some(server_message::Kind::Entered(entered)) => {
                if let Some(at) = cell(entered.position) {
                    self.with_sight(|sight| sight.entered(entered.player_id, entered.kind, at));
                }
            }
            Some(server_message::Kind::Moved(moved)) => {
                if let Some(at) = cell(moved.position) {
                    if moved.player_id == self.player_id {
                        self.with_sight(|sight| sight.set_me(at));
                    } else {
                        self.with_sight(|sight| sight.moved(moved.player_id, at));
                    }
                }
            }
            Some(server_message::Kind::Left(left)) => {
                self.with_sight(|sight| sight.left(left.player_id));
            }
            _ => {}
        }
    }

    /// A `ViewReset`: the bot is where it says; what is unanswered was not applied before
    /// it (DESIGN.md section 2), but each move still gets its one answer: one that crossed
    /// the reset on the wire may be applied after it and acked. Actions unanswered at a
    /// reset will not be answered.
    fn view_reset(&self, reset: pb::ViewReset) {
        if let Some(p) = reset.position {
            self.position.store(pack((p.x, p.y)), Ordering::Relaxed);
        }
        self.with_sight(|sight| sight.reset(reset.position.map(|p| (p.x, p.y))));
        bump(&self.stats.view_resets);
        let actions = {
            let mut ledger = self.ledger();
            let ledger = &mut *ledger;
            ledger.crossed.extend(ledger.outstanding.drain(..));
            if !reset.resume_token.is_empty() {
                ledger.token = reset.resume_token;
            }
            ledger.actions.drain(..).count()
        };
        self.stats.actions_lost.fetch_add(actions as u64, Ordering::Relaxed);
    }

    /// After `SHUTTING_DOWN`: connects to the next gateway after `gateway` (in turn, each
    /// tried once) and resumes there; the new connection and its frames, with the
    /// `ViewReset` handled and what came after it left for the reader.
    async fn resume_elsewhere(
        &self,
        index: u32,
        gateway: &mut usize,
        encoded: &mut Vec<u8>,
    ) -> Option<(Conn, FrameReader)> {
        let targets: Vec<SocketAddr> = std::iter::once(self.plan.target)
            .chain(self.plan.resume_targets.iter().copied())
            .collect();
        for _ in 1..targets.len() {
            *gateway = (*gateway + 1) % targets.len();
            if Instant::now() >= self.plan.drain_ends() {
                return None;
            }
            let mut conn = match connect_to(self.plan, index, targets[*gateway]).await {
                Ok(conn) => conn,
                Err(error) => {
                    debug!(player = self.player_id, %error, "resume: connect failed");
                    continue;
                }
            };
            let token = self.ledger().token.clone();
            let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
            let mut read_buf = vec![0u8; READ_CHUNK];
            let io = Io {
                read_half: &mut conn.read_half,
                write_half: &mut conn.write_half,
                frames: &mut frames,
                read_buf: &mut read_buf,
                encoded,
            };
            match resume(io, token, self.plan, self.stats).await {
                Ok(reset) => {
                    self.view_reset(reset);
                    return Some((conn, frames));
                }
                Err(error) => debug!(player = self.player_id, %error, "resume refused"),
            }
        }
        None
    }

    /// The move sent with `client_time`, if it was unanswered at a `ViewReset` and is
    /// answered now (counted in `moves_answered_after_reset`): when it was sent.
    fn answered_after_reset(
        &self,
        crossed: &mut VecDeque<(u64, Instant)>,
        client_time: u64,
    ) -> Option<Instant> {
        let sent_at = take(crossed, client_time)?;
        bump(&self.stats.moves_answered_after_reset);
        Some(sent_at)
    }

    /// The own `Moved` ack of the move sent with `client_time`.
    fn ack(&self, client_time: u64, at: Option<(u32, u32)>, now: Instant) {
        let sent_at = {
            let mut ledger = self.ledger();
            let Some(sent_at) = take(&mut ledger.outstanding, client_time)
                .or_else(|| self.answered_after_reset(&mut ledger.crossed, client_time))
            else {
                drop(ledger);
                bump(&self.stats.acks_unmatched);
                return;
            };
            if let Some(last) = ledger.last_ack.replace(now) {
                ledger.longest_gap = ledger.longest_gap.max(now.saturating_duration_since(last));
            }
            ledger.acked = true;
            sent_at
        };
        bump(&self.stats.moves_acked);
        let delay = now.saturating_duration_since(sent_at).as_micros() as u64;
        self.stats.delays.record(delay);
        self.stats.step_delays.record(delay);
        let Some(at) = at else { return };
        let before = self.position.swap(pack(at), Ordering::Relaxed);
        if before != u64::MAX && !(self.plan.border_x.is_empty() && self.plan.border_y.is_empty()) {
            let before = ((before >> 32) as u32, before as u32);
            let across = |borders: &[u32], a: u32, b: u32| {
                borders.iter().any(|&line| (a < line) != (b < line))
            };
            let crossing = across(&self.plan.border_x, before.0, at.0)
                || across(&self.plan.border_y, before.1, at.1);
            if crossing {
                self.stats.delays_crossing.record(delay);
            } else {
                self.stats.delays_inner.record(delay);
            }
        }
    }

    /// An `Error` carrying a `client_time`: the answer to a move, or else to an action.
    /// True when it is the game's answer to an action (`REJECTED`), counted with the
    /// actions (`actions_rejected`) and not as an error.
    fn error_answer(&self, client_time: u64, code: i32, now: Instant) -> bool {
        let is_move = {
            let mut ledger = self.ledger();
            let ledger = &mut *ledger;
            take(&mut ledger.outstanding, client_time)
                .or_else(|| self.answered_after_reset(&mut ledger.crossed, client_time))
                .is_some()
        };
        if is_move {
            bump(&self.stats.moves_errored);
            false
        } else {
            // An error echoing a client_time we never sent is counted by its code only.
            self.action_answered(client_time, Some(code), now)
        }
    }

    /// The answer to the action sent with `client_time`: `ActionDone` (no error code) or
    /// an `Error`. `ActionDone` and `REJECTED` are the game's answers and timed; returns
    /// whether it was one of them.
    fn action_answered(&self, client_time: u64, error: Option<i32>, now: Instant) -> bool {
        let Some((sent_at, aimed)) = take_action(&mut self.ledger().actions, client_time) else {
            if error.is_none() {
                bump(&self.stats.actions_unmatched);
            }
            return false;
        };
        let counter = match error {
            None => &self.stats.actions_answered,
            Some(code) if code == ErrorCode::Rejected as i32 => &self.stats.actions_rejected,
            Some(_) => {
                bump(&self.stats.actions_errored);
                return false;
            }
        };
        bump(counter);
        let delay = now.saturating_duration_since(sent_at).as_micros() as u64;
        self.stats.action_delays.record(delay);
        match aimed {
            Aim::Across => self.stats.action_delays_across.record(delay),
            Aim::Within => self.stats.action_delays_within.record(delay),
            Aim::NoOne => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_battle_bot_turns_back_at_the_edge_of_its_area() {
        use pb::Direction::{Down, Left, Right, Up};
        let area = SpawnArea { x0: 190, y0: 190, x1: 209, y1: 209 };
        assert_eq!(stay_inside(area, pack((200, 200)), Up), Up);
        assert_eq!(stay_inside(area, pack((200, 190)), Up), Down);
        assert_eq!(stay_inside(area, pack((200, 209)), Down), Up);
        assert_eq!(stay_inside(area, pack((190, 200)), Left), Right);
        assert_eq!(stay_inside(area, pack((209, 200)), Right), Left);
        assert_eq!(stay_inside(area, u64::MAX, Left), Left, "position unknown yet");
    }

    #[test]
    fn an_action_aims_across_when_a_border_separates_bot_and_wolf() {
        let mut sight = Sight::new(WOLF);
        assert_eq!(aim(&sight, &[200], &[]), (0, Aim::NoOne));
        sight.set_me((199, 50));
        sight.entered(7, WOLF, (201, 50));
        assert_eq!(aim(&sight, &[200], &[]), (7, Aim::Across));
        assert_eq!(aim(&sight, &[], &[]), (7, Aim::Within), "no borders: all within");
        assert_eq!(aim(&sight, &[300], &[200]), (7, Aim::Within));
        sight.entered(8, WOLF, (198, 51));
        assert_eq!(aim(&sight, &[200], &[]), (8, Aim::Within), "the nearer wolf, on this side");
        sight.set_me((198, 199));
        sight.left(8);
        sight.moved(7, (198, 200));
        assert_eq!(aim(&sight, &[200], &[200]), (7, Aim::Across), "a row border too");
    }
}
