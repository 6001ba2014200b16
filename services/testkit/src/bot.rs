//! A blocking bot client: one TCP connection to a gateway, the protocol's framing, and the
//! player's view rebuilt and checked from every message it receives.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use meridian_protocol::pb::{
    server_message::Kind as S, ClientMessage, Direction, ErrorCode, LoginOk, ServerMessage,
};
use meridian_protocol::{encode_frame, FrameReader, DEFAULT_MAX_FRAME};

use crate::code::code_name;
use crate::msg;
use crate::quic::{QuicClient, QuicOptions, QuicRead, QuicTarget};
use crate::stream::StreamCheck;
use crate::view::View;
use crate::wait::{deadline, DEFAULT_WAIT};
use crate::ws::{WsClient, WsRead};

/// How many received messages a bot remembers to explain a failure.
const HISTORY: usize = 32;

/// Ping client_times start here, far above any move client_time a test uses, so a `Pong` is
/// never mistaken for an answer to something else.
const PING_BASE: u64 = 1 << 48;

static NEXT_BOT: AtomicU64 = AtomicU64::new(1);

/// Where a bot connects: a gateway's TCP game port, or its QUIC front. `Copy` like the
/// `SocketAddr` it wraps, so a scenario written for TCP runs over QUIC unchanged.
#[derive(Debug, Clone, Copy)]
pub enum GameAddr {
    Tcp(SocketAddr),
    Quic(QuicTarget),
    /// A gateway's WebSocket front.
    Ws(SocketAddr),
}

impl From<SocketAddr> for GameAddr {
    fn from(addr: SocketAddr) -> Self {
        GameAddr::Tcp(addr)
    }
}

impl From<QuicTarget> for GameAddr {
    fn from(target: QuicTarget) -> Self {
        GameAddr::Quic(target)
    }
}

/// The connection under a bot.
enum Link {
    Tcp(TcpStream),
    Quic(Box<QuicClient>),
    Ws(Box<WsClient>),
}

/// A connected client. Every message it receives goes through its [`View`], so a protocol
/// violation (a `Moved` for a player not in view, an `Entered` twice, ...) fails the test
/// where it happens.
pub struct Bot {
    label: String,
    addr: SocketAddr,
    link: Link,
    reader: FrameReader,
    view: View,
    history: VecDeque<String>,
    next_ping: u64,
    resume_token: Vec<u8>,
    /// The stricter per-stream checks, when a test asks for them.
    checker: Option<StreamCheck>,
}

/// What one read from the connection produced.
enum Received {
    Message(ServerMessage),
    Closed,
    TimedOut,
}

/// What came back for a `Login`: the `LoginOk`, then everything received before the
/// Ping/Pong barrier that follows it (the `Entered` of everyone already in sight).
#[derive(Debug, Clone)]
pub struct LoggedIn {
    pub ok: LoginOk,
    pub after: Vec<ServerMessage>,
}

impl LoggedIn {
    pub fn player_id(&self) -> u64 {
        self.ok.player_id
    }

    /// The ids of the players announced with `Entered` right after login.
    pub fn entered_ids(&self) -> BTreeSet<u64> {
        self.after
            .iter()
            .filter_map(|m| match &m.kind {
                Some(S::Entered(e)) => Some(e.player_id),
                _ => None,
            })
            .collect()
    }
}

/// The one answer every `Move` gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The mover's own `Moved`, with the position after the move.
    Ack((u32, u32)),
    /// An `Error` carrying the move's client_time.
    Error(ErrorCode, String),
}

/// The answer to one move, and the other messages received while waiting for it (already
/// applied to the bot's view).
#[derive(Debug, Clone)]
pub struct MoveAnswer {
    pub client_time: u64,
    pub answer: Answer,
    pub others: Vec<ServerMessage>,
}

impl MoveAnswer {
    /// The acknowledged position, or an error saying what came instead.
    pub fn ack(&self) -> anyhow::Result<(u32, u32)> {
        match &self.answer {
            Answer::Ack(position) => Ok(*position),
            Answer::Error(code, detail) => bail!(
                "move {} was refused with {} ({detail:?}) where an ack was expected",
                self.client_time,
                code.as_str_name()
            ),
        }
    }

    /// The error code, or an error saying the move was acknowledged instead.
    pub fn error(&self) -> anyhow::Result<ErrorCode> {
        match &self.answer {
            Answer::Error(code, _) => Ok(*code),
            Answer::Ack(position) => bail!(
                "move {} was acknowledged at {position:?} where an Error was expected",
                self.client_time
            ),
        }
    }
}

impl Bot {
    /// Connects to a gateway's game port (TCP) or QUIC front.
    pub fn connect(addr: impl Into<GameAddr>) -> anyhow::Result<Bot> {
        Bot::connect_with(addr, &QuicOptions::default())
    }

    /// [`Bot::connect`], with these settings if it is a QUIC connection.
    pub fn connect_with(addr: impl Into<GameAddr>, quic: &QuicOptions) -> anyhow::Result<Bot> {
        let n = NEXT_BOT.fetch_add(1, Ordering::Relaxed);
        let (addr, link) = match addr.into() {
            GameAddr::Tcp(addr) => {
                let stream = TcpStream::connect_timeout(&addr, DEFAULT_WAIT)
                    .with_context(|| format!("bot #{n} connecting to gateway {addr}"))?;
                stream.set_nodelay(true)?;
                stream.set_write_timeout(Some(DEFAULT_WAIT))?;
                (addr, Link::Tcp(stream))
            }
            GameAddr::Quic(target) => {
                let client = QuicClient::connect_with(&target, quic).with_context(|| {
                    format!("bot #{n} connecting to gateway {} over QUIC", target.addr)
                })?;
                (target.addr, Link::Quic(Box::new(client)))
            }
            GameAddr::Ws(addr) => {
                let client = WsClient::connect(addr, DEFAULT_WAIT).with_context(|| {
                    format!("bot #{n} connecting to gateway {addr} over WebSocket")
                })?;
                (addr, Link::Ws(Box::new(client)))
            }
        };
        Ok(Bot {
            label: format!("bot #{n}"),
            addr,
            link,
            reader: FrameReader::new(DEFAULT_MAX_FRAME),
            view: View::new(),
            history: VecDeque::new(),
            next_ping: PING_BASE + n * 1_000_000,
            resume_token: Vec::new(),
            checker: None,
        })
    }

    /// The name this bot logged in with, or `bot #n` before that; used in every error.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The player id from `LoginOk`.
    ///
    /// # Panics
    /// If the bot is not logged in: that is a mistake in the test, not in the server.
    pub fn id(&self) -> u64 {
        self.view.own_id().unwrap_or_else(|| panic!("{} is not logged in", self.label))
    }

    /// The view rebuilt from everything received so far.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Runs a [`StreamCheck`] on everything this bot sends and receives from now on (call it
    /// before `login`): own acks in order and at the right positions, subjects moving one
    /// step at a time, no `Left` for a player that stays in sight, chat only from players
    /// in view. A broken rule fails the receive that saw it, like a [`View`] violation.
    pub fn check_streams(&mut self) {
        self.check_streams_with(StreamCheck::new());
    }

    /// [`Bot::check_streams`] with a checker configured by the caller.
    pub fn check_streams_with(&mut self, check: StreamCheck) {
        self.checker = Some(check);
    }

    /// The stream checker, if [`Bot::check_streams`] was called.
    pub fn stream_check(&self) -> Option<&StreamCheck> {
        self.checker.as_ref()
    }

    /// An error naming this bot and `what` went wrong, with the last messages it received:
    /// for failures a test finds itself (a view that differs from the truth, a lost ack).
    pub fn report(&self, what: &str) -> anyhow::Error {
        self.failure(what)
    }

    /// The resume token from `LoginOk`.
    pub fn resume_token(&self) -> &[u8] {
        &self.resume_token
    }

    pub fn send(&mut self, message: &ClientMessage) -> anyhow::Result<()> {
        self.send_all(std::slice::from_ref(message))
    }

    /// Sends several messages in one write, so the server gets them back to back.
    pub fn send_all(&mut self, messages: &[ClientMessage]) -> anyhow::Result<()> {
        let mut wire = Vec::new();
        for message in messages {
            encode_frame(message, &mut wire);
            if let Some(check) = &mut self.checker {
                check.on_send(message);
            }
        }
        self.send_raw(&wire)
    }

    /// Sends bytes as they are: for frames a well-behaved client would never send.
    pub fn send_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let sent = match &mut self.link {
            Link::Tcp(stream) => stream.write_all(bytes).map_err(anyhow::Error::from),
            Link::Quic(client) => client.write_all(bytes),
            Link::Ws(client) => client.write_all(bytes),
        };
        sent.with_context(|| {
            format!("{} sending {} bytes to {}", self.label, bytes.len(), self.addr)
        })
    }

    /// Whether this bot speaks QUIC.
    pub fn is_quic(&self) -> bool {
        matches!(self.link, Link::Quic(_))
    }

    /// How long the QUIC handshake took (`None` for a TCP bot).
    pub fn quic_handshake(&self) -> Option<Duration> {
        match &self.link {
            Link::Quic(client) => Some(client.handshake),
            Link::Tcp(_) | Link::Ws(_) => None,
        }
    }

    /// QUIC only: moves the connection to a new UDP socket (connection migration); returns
    /// the new local address.
    pub fn rebind(&mut self) -> anyhow::Result<SocketAddr> {
        match &mut self.link {
            Link::Quic(client) => client.rebind(),
            Link::Tcp(_) | Link::Ws(_) => {
                bail!("{} is not a QUIC bot: only QUIC connections migrate", self.label)
            }
        }
    }

    /// The local address the connection uses now.
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        match &self.link {
            Link::Tcp(stream) => Ok(stream.local_addr()?),
            Link::Quic(client) => client.local_addr(),
            Link::Ws(client) => client.local_addr(),
        }
    }

    /// QUIC only: disappears without a word (no CONNECTION_CLOSE), as a dead device does;
    /// the gateway can only notice by its idle timeout.
    pub fn vanish(self) -> anyhow::Result<()> {
        match self.link {
            Link::Quic(client) => {
                client.vanish();
                Ok(())
            }
            Link::Tcp(_) | Link::Ws(_) => {
                bail!("{} is not a QUIC bot: vanish is a QUIC test", self.label)
            }
        }
    }

    /// The next message from the server, applied to the view; an error on timeout, on close,
    /// on an undecodable frame and on a protocol violation.
    pub fn recv(&mut self, deadline: Instant) -> anyhow::Result<ServerMessage> {
        match self.read_message(deadline)? {
            Some(message) => Ok(message),
            None => Err(self.failure("the connection was closed by the server")),
        }
    }

    /// The next message if one arrives before `deadline`, `None` if none does; an error on
    /// close, on an undecodable frame and on a protocol violation. For clients that read
    /// whatever comes while waiting for their next scheduled action.
    pub fn recv_timeout(&mut self, deadline: Instant) -> anyhow::Result<Option<ServerMessage>> {
        match self.read(deadline)? {
            Received::Message(message) => Ok(Some(message)),
            Received::TimedOut => Ok(None),
            Received::Closed => Err(self.failure("the connection was closed by the server")),
        }
    }

    /// Receives until `done` holds for a message; returns every message received, the
    /// matching one last. `what` says what was awaited if the deadline passes.
    pub fn recv_until(
        &mut self,
        deadline: Instant,
        what: &str,
        mut done: impl FnMut(&ServerMessage) -> bool,
    ) -> anyhow::Result<Vec<ServerMessage>> {
        let budget = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
        let mut got = Vec::new();
        loop {
            let message = self.recv(deadline).with_context(|| {
                format!("{} waiting up to {budget:.1} s for {what}", self.label)
            })?;
            let matched = done(&message);
            got.push(message);
            if matched {
                return Ok(got);
            }
        }
    }

    /// Sends `Login` and waits for `LoginOk`, then collects what follows it (the `Entered`
    /// of everyone in sight) up to a Ping/Pong barrier.
    pub fn login(&mut self, name: &str, spawn: Option<(u32, u32)>) -> anyhow::Result<LoggedIn> {
        self.send(&msg::login(name, spawn))?;
        let first = self.recv(deadline(DEFAULT_WAIT)).with_context(|| {
            format!("{} waiting for LoginOk as {name:?} at {spawn:?}", self.label)
        })?;
        let ok = expect_login_ok(&self.label, name, spawn, first)?;
        self.label = name.to_string();
        self.resume_token = ok.resume_token.clone();
        let after = self.ping_barrier()?;
        Ok(LoggedIn { ok, after })
    }

    pub fn send_move(&mut self, direction: Direction, client_time: u64) -> anyhow::Result<()> {
        self.send(&msg::move_(direction, client_time))
    }

    /// Sends a move and waits for its one answer (own ack or Error with its client_time).
    pub fn move_(&mut self, direction: Direction, client_time: u64) -> anyhow::Result<MoveAnswer> {
        self.send_move(direction, client_time)?;
        self.recv_answer(deadline(DEFAULT_WAIT), client_time)
    }

    /// Sends a move and returns the acknowledged position; anything else is an error.
    pub fn move_ok(
        &mut self,
        direction: Direction,
        client_time: u64,
    ) -> anyhow::Result<(u32, u32)> {
        let answer = self.move_(direction, client_time)?;
        answer.ack().with_context(|| format!("{} moving {direction:?}", self.label))
    }

    /// Waits for the answer to the move sent with `client_time`. An answer to any other move
    /// arriving first is an error: acks come in the order the moves were sent, one each.
    pub fn recv_answer(
        &mut self,
        deadline: Instant,
        client_time: u64,
    ) -> anyhow::Result<MoveAnswer> {
        let own = self.view.own_id();
        let budget = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
        let mut others = Vec::new();
        loop {
            let message = self.recv(deadline).with_context(|| {
                format!(
                    "{} waiting up to {budget:.1} s for the answer to move {client_time}",
                    self.label
                )
            })?;
            match &message.kind {
                Some(S::Moved(m)) if Some(m.player_id) == own => {
                    if m.client_time != client_time {
                        return Err(self.failure(&format!(
                            "got an ack {m:?} while waiting for the answer to move \
                             {client_time}: acks out of order, or a move answered twice"
                        )));
                    }
                    let p = m.position.as_ref().map_or((0, 0), |p| (p.x, p.y));
                    return Ok(MoveAnswer { client_time, answer: Answer::Ack(p), others });
                }
                Some(S::Error(e)) if e.client_time == client_time => {
                    let code = ErrorCode::try_from(e.code)
                        .map_err(|_| self.failure(&format!("unknown error code in {e:?}")))?;
                    let answer = Answer::Error(code, e.detail.clone());
                    return Ok(MoveAnswer { client_time, answer, others });
                }
                Some(S::Error(e)) if e.client_time != 0 => {
                    return Err(self.failure(&format!(
                        "got {e:?} while waiting for the answer to move {client_time}"
                    )));
                }
                _ => others.push(message),
            }
        }
    }

    pub fn chat(&mut self, text: &str) -> anyhow::Result<()> {
        self.send(&msg::chat(text))
    }

    /// Sends a Ping with a fresh client_time and returns every message received before its
    /// Pong. Everything the gateway had queued for this connection before it read the Ping
    /// arrives before the Pong, so an empty result shows that nothing else was pending.
    pub fn ping_barrier(&mut self) -> anyhow::Result<Vec<ServerMessage>> {
        let t = self.send_ping()?;
        self.recv_pong(t, deadline(DEFAULT_WAIT))
    }

    /// The first half of [`Bot::ping_barrier`]: sends a Ping with a fresh client_time and
    /// returns it. Lets a test put a barrier on many bots at once (send to all, then
    /// [`Bot::recv_pong`] from each).
    pub fn send_ping(&mut self) -> anyhow::Result<u64> {
        self.next_ping += 1;
        let t = self.next_ping;
        self.send(&msg::ping(t))?;
        Ok(t)
    }

    /// The second half of [`Bot::ping_barrier`]: every message received before the Pong
    /// for `client_time`.
    pub fn recv_pong(
        &mut self,
        client_time: u64,
        deadline: Instant,
    ) -> anyhow::Result<Vec<ServerMessage>> {
        let mut got = self.recv_until(
            deadline,
            &format!("Pong {client_time}"),
            |m| matches!(&m.kind, Some(S::Pong(p)) if p.client_time == client_time),
        )?;
        got.pop();
        Ok(got)
    }

    /// Nothing pending for this client: the ping barrier comes back empty.
    pub fn expect_quiet(&mut self) -> anyhow::Result<()> {
        let got = self.ping_barrier()?;
        if !got.is_empty() {
            return Err(self.failure(&format!("expected nothing, got {got:?}")));
        }
        Ok(())
    }

    /// Exactly these messages, in any order, then nothing more (checked with a ping barrier).
    pub fn expect_messages(&mut self, expected: &[ServerMessage]) -> anyhow::Result<()> {
        let mut missing: Vec<ServerMessage> = expected.to_vec();
        let mut got = Vec::new();
        let until = deadline(DEFAULT_WAIT);
        while !missing.is_empty() {
            let message = self.recv(until).with_context(|| {
                format!("{} still expecting {missing:?} after receiving {got:?}", self.label)
            })?;
            match missing.iter().position(|m| *m == message) {
                Some(i) => {
                    missing.remove(i);
                    got.push(message);
                }
                None => {
                    return Err(self
                        .failure(&format!("unexpected {message:?}; still expecting {missing:?}")))
                }
            }
        }
        let extra = self.ping_barrier()?;
        if !extra.is_empty() {
            return Err(
                self.failure(&format!("got the expected {expected:?} but then also {extra:?}"))
            );
        }
        Ok(())
    }

    /// The next message is an `Error` with `code` and `client_time`.
    pub fn expect_error(&mut self, code: ErrorCode, client_time: u64) -> anyhow::Result<String> {
        let message = self
            .recv(deadline(DEFAULT_WAIT))
            .with_context(|| format!("{} waiting for Error {}", self.label, code.as_str_name()))?;
        match &message.kind {
            Some(S::Error(e)) if e.code == code as i32 && e.client_time == client_time => {
                Ok(e.detail.clone())
            }
            _ => Err(self.failure(&format!(
                "expected Error {} with client_time {client_time}, got {message:?}",
                code.as_str_name()
            ))),
        }
    }

    /// Waits until the server closes the connection (end of stream or reset) and returns the
    /// messages received before that. The connection still being open at `deadline` is an
    /// error.
    pub fn expect_closed(&mut self, deadline: Instant) -> anyhow::Result<Vec<ServerMessage>> {
        let mut got = Vec::new();
        loop {
            match self.read_message(deadline) {
                Ok(Some(message)) => got.push(message),
                Ok(None) => return Ok(got),
                Err(e) => {
                    return Err(e.context(format!(
                        "{} expected the server to close the connection; received {got:?}",
                        self.label
                    )))
                }
            }
        }
    }

    /// Closes our side cleanly (FIN; over QUIC, stream finished and CONNECTION_CLOSE 0)
    /// without a Logout.
    pub fn disconnect(self) {
        match self.link {
            Link::Tcp(stream) => {
                let _ = stream.shutdown(Shutdown::Both);
            }
            Link::Quic(client) => client.close(),
            Link::Ws(client) => client.close(),
        }
    }

    /// WebSocket only: sends a text message (which the protocol does not allow).
    pub fn send_text(&mut self, text: &str) -> anyhow::Result<()> {
        match &mut self.link {
            Link::Ws(client) => client.send_text(text),
            _ => bail!("{} is not a WebSocket bot", self.label),
        }
    }

    /// Whether this bot speaks WebSocket.
    pub fn is_ws(&self) -> bool {
        matches!(self.link, Link::Ws(_))
    }

    /// Aborts the connection with a TCP reset (SO_LINGER 0), as a crashed client would.
    /// Over QUIC: the stream reset and CONNECTION_CLOSE with an error code.
    pub fn reset(self) -> anyhow::Result<()> {
        let stream = match self.link {
            Link::Tcp(stream) => stream,
            Link::Quic(client) => {
                client.abort();
                return Ok(());
            }
            Link::Ws(client) => client.into_stream(),
        };
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: the fd is open for the life of `self.stream`, and the option value is a
        // properly sized `linger` that lives across the call.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!("setting SO_LINGER 0: {}", std::io::Error::last_os_error());
        }
        drop(stream);
        Ok(())
    }

    /// One message, `None` at end of stream or reset. Timeouts, undecodable frames and
    /// protocol violations are errors.
    fn read_message(&mut self, deadline: Instant) -> anyhow::Result<Option<ServerMessage>> {
        match self.read(deadline)? {
            Received::Message(message) => Ok(Some(message)),
            Received::Closed => Ok(None),
            Received::TimedOut => {
                Err(self.failure("timed out waiting for a message from the server"))
            }
        }
    }

    /// One message, the end of the stream, or the deadline passing. Undecodable frames and
    /// protocol violations (the view's rules, and the stream checker's if it is on) are
    /// errors.
    fn read(&mut self, deadline: Instant) -> anyhow::Result<Received> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.reader.next_message::<ServerMessage>() {
                Ok(Some(message)) => {
                    if let Err(violation) = self.view.try_apply(&message) {
                        return Err(self.failure(&violation.to_string()));
                    }
                    let checked = match &mut self.checker {
                        Some(check) => check.on_receive(&message),
                        None => Ok(()),
                    };
                    if let Err(violation) = checked {
                        return Err(self.failure(&format!(
                            "stream check failed on {message:?}: {violation:#}"
                        )));
                    }
                    if let Some(S::ViewReset(reset)) = &message.kind {
                        // A resume (or a restore) spends the token held: the fresh one
                        // comes with the ViewReset.
                        if !reset.resume_token.is_empty() {
                            self.resume_token = reset.resume_token.clone();
                        }
                    }
                    if self.history.len() == HISTORY {
                        self.history.pop_front();
                    }
                    self.history.push_back(format!("{message:?}"));
                    return Ok(Received::Message(message));
                }
                Ok(None) => {}
                Err(e) => return Err(self.failure(&format!("undecodable frame from server: {e}"))),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Received::TimedOut);
            }
            let wait = (deadline - now).max(Duration::from_millis(1));
            let stream = match &mut self.link {
                Link::Tcp(stream) => stream,
                Link::Quic(client) => match client.read(&mut buf, now + wait) {
                    Ok(QuicRead::Data(n)) => {
                        self.reader.extend(&buf[..n]);
                        continue;
                    }
                    Ok(QuicRead::Closed) => return Ok(Received::Closed),
                    Ok(QuicRead::TimedOut) => continue,
                    Err(e) => return Err(self.failure(&format!("{e:#}"))),
                },
                Link::Ws(client) => match client.read(now + wait) {
                    Ok(WsRead::Data(framed)) => {
                        self.reader.extend(&framed);
                        continue;
                    }
                    Ok(WsRead::Closed) => return Ok(Received::Closed),
                    Ok(WsRead::TimedOut) => continue,
                    Err(e) => return Err(self.failure(&format!("{e:#}"))),
                },
            };
            stream.set_read_timeout(Some(wait))?;
            match stream.read(&mut buf) {
                Ok(0) => return Ok(Received::Closed),
                Ok(n) => self.reader.extend(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(Received::Closed),
                Err(e) => return Err(self.failure(&format!("read failed: {e}"))),
            }
        }
    }

    /// An error naming this bot, what went wrong, and what it received last.
    fn failure(&self, what: &str) -> anyhow::Error {
        let transport = match self.link {
            Link::Quic(_) => "QUIC",
            Link::Ws(_) => "WebSocket",
            Link::Tcp(_) => "TCP",
        };
        let player = match self.view.own_id() {
            Some(id) => format!("player {id}, "),
            None => String::new(),
        };
        let mut text =
            format!("{} ({player}connected to {} over {transport}): {what}", self.label, self.addr);
        if !self.reader.buffered().is_empty() {
            let _ = write!(text, "\n  {} undecoded bytes buffered", self.reader.buffered().len());
        }
        if self.history.is_empty() {
            text.push_str("\n  nothing received before this");
        } else {
            text.push_str("\n  last messages received, oldest first:");
            for line in &self.history {
                let _ = write!(text, "\n    {line}");
            }
        }
        anyhow!(text)
    }
}

/// The first answer to a Login, which must be `LoginOk`: a refusal or anything else is an
/// error naming the client (`label`), the name and the spawn asked for.
pub(crate) fn expect_login_ok(
    label: &str,
    name: &str,
    spawn: Option<(u32, u32)>,
    first: ServerMessage,
) -> anyhow::Result<LoginOk> {
    match first.kind {
        Some(S::LoginOk(ok)) => Ok(ok),
        Some(S::Error(e)) => bail!(
            "{label}: login as {name:?} at {spawn:?} was refused with {} ({:?})",
            code_name(e.code),
            e.detail
        ),
        other => {
            bail!("{label}: expected LoginOk as the first answer to Login {name:?}, got {other:?}")
        }
    }
}
