//! One client connection's state, as the core keeps it: its session (anonymous, playing,
//! resuming, logging out, gone), its budgets, its input and output buffers, and what it
//! needs to follow its player across handoffs and restore it after a failure. Owned by the
//! endpoint slab; changed only by the core's rooms, never by an event loop.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_rpc::pb::{Budgets, Delivery, PlayerInput};

use crate::limits::{Bucket, InputBudget, Limits};
use crate::routing::ShardLink;
use crate::websocket::WsState;

/// Unconfirmed inputs kept per connection for a handoff (see `Conn::unconfirmed`); when
/// full, the oldest is no longer kept (it is still forwarded by the old owner, as usual).
pub(super) const UNCONFIRMED_LIMIT: usize = 256;
/// How long a resume may wait for the shards' answers.
pub(super) const RESUME_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy)]
pub(super) struct PendingOwner {
    pub(super) to: ShardId,
    pub(super) incarnation: u64,
    pub(super) generation: u64,
    pub(super) since: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Serving.
    No,
    /// Write what is queued, then close (after an error the client must read, a logout).
    AfterFlush,
    /// Close now, dropping queued output (peer gone, or too slow to keep up).
    Abort,
}

pub(super) enum Session {
    Anonymous,
    Playing {
        player: u64,
        link: Arc<ShardLink>,
    },
    /// A valid resume token was presented; every shard was asked who holds the player.
    Resuming {
        player: u64,
        waiting: usize,
        since: Instant,
        /// A login of the player's account rather than a resume token: placed as a new
        /// login if no shard holds the player.
        login: Option<Box<Takeover>>,
    },
    /// The client logged out: the Leave went to `link`, whose close ends the connection.
    /// Nothing more is relayed; moves sent after the Logout are refused once the moves
    /// before it are answered.
    LoggingOut {
        link: Arc<ShardLink>,
    },
    /// The shard has let the player go (logout); nothing more is relayed.
    Gone,
}

/// A login whose account's player may be online (or parked) on some shard: every shard
/// is asked, and the one holding it takes it over from the old connection (`REPLACED`).
pub(super) struct Takeover {
    pub(super) name: String,
    /// A dev-mode Login's spawn: where the player goes, online or not.
    pub(super) spawn: Option<meridian_protocol::pb::Position>,
    /// The cell it was saved at: where it goes if no shard holds it (and no spawn).
    pub(super) saved: Option<meridian_protocol::pb::Position>,
    /// The generation to place it with then (after the one it was saved at).
    pub(super) generation: u64,
}

pub(super) struct Conn {
    pub(super) generation_slot: u32,
    /// A WebSocket session (on the same event loop as TCP): its bytes are WebSocket frames,
    /// turned into and from the length-delimited frames everything else handles.
    pub(super) ws: Option<Box<WsState>>,
    /// Counted by the admission (a WebSocket connection refused admission is kept, not
    /// admitted, until it can be told why).
    pub(super) admitted: bool,
    /// The client's address as admitted (given back to the admission on removal).
    pub(super) peer: Option<IpAddr>,
    /// Since when the connection has been anonymous (accepted, or back from a resume that
    /// failed): the login deadline counts from here.
    pub(super) opened_at: Instant,
    /// When the last frame of any kind was read: the idle deadline counts from here.
    pub(super) last_input_at: Instant,
    /// The player's move and chat budgets (DESIGN section 2b), kept where every input
    /// passes, so a handoff to another shard cannot refill them.
    pub(super) moves: Bucket,
    pub(super) chats: Bucket,
    pub(super) actions: Bucket,
    /// The connection's input budget over every kind of input, frames and bytes: every
    /// frame it sends is paid for before it is read (over WebSocket, every WebSocket frame).
    pub(super) input: InputBudget,
    /// The input budget is spent: the backend stops reading this connection (TCP flow
    /// control slows the client) until `tick` finds the budget refilled. What was already
    /// on its way waits unread: in `inbuf`, or over WebSocket in `ws`.
    pub(super) read_paused: bool,
    /// Output the backend has taken from `out` and not yet written: it counts toward the
    /// output bound like `out`.
    pub(super) sending: usize,
    /// The link to the player's shard broke while both ends lived: the player is
    /// restored on the owner of its last acknowledged cell once a link is up (or told and
    /// closed after [`RESTORE_WAIT`]).
    pub(super) restore_due: Option<Instant>,
    /// Bytes of an incomplete frame carried over to the next read.
    pub(super) inbuf: Vec<u8>,
    /// Output not yet handed to the kernel.
    pub(super) out: Vec<u8>,
    pub(super) session: Session,
    /// Every move relayed and not yet answered, oldest first: its client_time, its seq,
    /// and when it was read (for the move delay histogram).
    pub(super) inflight: VecDeque<(u64, u64, Instant)>,
    /// Moves sent after a Logout (their client_times): refused once `inflight` is empty,
    /// so that answers stay in move order.
    pub(super) refused_after_logout: Vec<u64>,
    /// In-game inputs relayed to the player's owner and not known to be applied (a shard
    /// applies inputs in seq order, so an answered move confirms everything up to it),
    /// oldest first, at most [`UNCONFIRMED_LIMIT`]. When the owner hands the player over,
    /// these are sent to the new owner as well: any of them can still be on its way to
    /// the old one, which may be draining and gone before it could forward them. A shard
    /// drops inputs it has already applied, so a copy that arrives twice counts once.
    pub(super) unconfirmed: VecDeque<PlayerInput>,
    /// Sequence number of the next input relayed for this connection (Join is 1).
    pub(super) next_seq: u64,
    /// The player's name, last acknowledged position and ownership generation, kept to
    /// restore the player on another shard if its shard dies.
    pub(super) name: String,
    pub(super) last_position: Option<(u32, u32)>,
    pub(super) generation: u64,
    /// The latest ownership generation whose release marker this connection followed (0:
    /// none, or markers of shards that say no generation): a copy of such a marker from a
    /// shard that is not the owner is dropped (see `Delivery.released_generation`).
    pub(super) released_through: u64,
    /// The player's private game state, as its shard last reported it (or the player
    /// store had it at login): it goes with a restore.
    pub(super) state: Vec<u8>,
    /// A restore was sent and its ViewReset has not come back: moves are refused until
    /// then, so every move unanswered at the ViewReset was indeed not applied.
    pub(super) restoring: bool,
    /// A shard this player was handed to that the routing table did not know yet (or only
    /// an earlier life of it): its id, its incarnation as the releasing shard knew it, the
    /// player's generation, and since when.
    pub(super) pending_owner: Option<PendingOwner>,
    /// A login waiting for the player store's answer (`--store`).
    pub(super) pending_login: Option<PendingLogin>,
    /// The owner this player was handed from, until the new owner's first output shows
    /// it took the player: if the old owner dies before then, its `Handoff` may have died
    /// with it, and the player is restored like one of the dead shard's own.
    pub(super) handed_from: Option<ShardId>,
    /// A shard other than the owner that said it holds the player at a newer generation
    /// (a held delivery with its position): a handoff whose release marker has not come,
    /// or died with the old owner. A restore goes there, where the player is, rather than
    /// making a second copy at the owner of its last acknowledged cell.
    pub(super) claim: Option<(ShardId, u64)>,
    /// This connection's login's `Join.login_stamp` (0 after a resume by token): sent with
    /// a restore too, so the shard judges a racing login of the account against it.
    pub(super) login_stamp: u64,
    /// Output from a shard that is taking the player over, held until the current owner's
    /// `released_to` marker, so the player's messages stay in order across a handoff.
    pub(super) held: Vec<(ShardId, Delivery)>,
    /// Bytes of frames in `held`: they count toward the output bound like queued output.
    pub(super) held_bytes: usize,
    pub(super) closing: Closing,
    /// Set when `closing` left `No`; bounds the linger.
    pub(super) closing_since: Option<Instant>,
    /// When the stopping gateway said `SHUTTING_DOWN` to it: what it sends from then on is
    /// answered so, and it closes [`crate::GOODBYE_GRACE`] later.
    pub(super) goodbye_at: Option<Instant>,
    /// The stopping gateway answered this connection's moves in flight itself (the shards
    /// did not within `SHUTDOWN_WAIT`): what the shards send it from then on is dropped, or
    /// a late answer would answer a move twice.
    pub(super) shards_silenced: bool,
    pub(super) dirty: bool,
}

/// What a login waiting for its account's player needs to go on.
pub(super) struct PendingLogin {
    pub(super) account: String,
    pub(super) name: String,
    /// Where the client asked to be (dev mode); wins over the saved cell.
    pub(super) spawn: Option<meridian_protocol::pb::Position>,
    /// Ids offered so far that belonged to other accounts.
    pub(super) tries: u8,
}

/// How many ids a login offers the store before it gives up (each one taken by another
/// account: only if etcd's id allocator was reset under an old store).
pub(super) const ID_TRIES: u8 = 3;

impl Conn {
    pub(super) fn new(
        peer: Option<IpAddr>,
        ws: Option<Box<WsState>>,
        admitted: bool,
        limits: &Limits,
        now: Instant,
    ) -> Conn {
        Conn {
            generation_slot: 0,
            ws,
            admitted,
            peer,
            opened_at: now,
            last_input_at: now,
            moves: Bucket::full(limits.moves, now),
            chats: Bucket::full(limits.chats, now),
            actions: Bucket::full(limits.actions, now),
            input: InputBudget::full(limits, now),
            read_paused: false,
            sending: 0,
            restore_due: None,
            inbuf: Vec::new(),
            out: Vec::new(),
            session: Session::Anonymous,
            inflight: VecDeque::new(),
            refused_after_logout: Vec::new(),
            unconfirmed: VecDeque::new(),
            next_seq: 1,
            name: String::new(),
            last_position: None,
            state: Vec::new(),
            generation: 0,
            released_through: 0,
            restoring: false,
            pending_owner: None,
            handed_from: None,
            claim: None,
            login_stamp: 0,
            pending_login: None,
            held: Vec::new(),
            held_bytes: 0,
            closing: Closing::No,
            closing_since: None,
            goodbye_at: None,
            shards_silenced: false,
            dirty: false,
        }
    }

    /// Output queued, being sent, or held for an old owner's release: what the output
    /// bounds count.
    pub(super) fn queued(&self) -> usize {
        self.out.len() + self.sending + self.held_bytes
    }

    /// Input read and not yet handled, over every front: what [`INBUF_LIMIT`] bounds.
    ///
    /// [`INBUF_LIMIT`]: super::INBUF_LIMIT
    pub(super) fn waiting_input(&self) -> usize {
        self.inbuf.len() + self.ws.as_ref().map_or(0, |ws| ws.held())
    }

    /// Takes back the chat and action budgets `player`'s last connection to this gateway
    /// left with, if kept (see `limits::Admission::keep_budgets`). Its shard gives the ones
    /// parked with the player, from any gateway, beside its answer ([`Conn::lower_budgets`]).
    /// Whether any were kept.
    pub(super) fn take_kept_budgets(
        &mut self,
        admission: &crate::limits::Admission,
        player: u64,
        now: Instant,
    ) -> bool {
        let kept = admission.take_budgets(player, now);
        if let Some(kept) = &kept {
            self.chats = kept.chats;
            self.actions = kept.actions;
        }
        kept.is_some()
    }

    /// Empties the chat and action budgets at `now` (they refill at their rates): for a
    /// connection that took its player over from one still open, whose budgets come later.
    pub(super) fn empty_budgets(&mut self, limits: &Limits, now: Instant) {
        self.chats.lower_to(limits.chats, 0, now, now);
        self.actions.lower_to(limits.actions, 0, now, now);
    }

    /// Lowers the chat and action budgets to what the player's shard says its last
    /// connection left with (`Delivery.budgets`), where that is less.
    pub(super) fn lower_budgets(&mut self, limits: &Limits, budgets: &Budgets, now: Instant) {
        let at = now.checked_sub(Duration::from_millis(budgets.age_ms)).unwrap_or(now);
        self.chats.lower_to(limits.chats, budgets.chat_credit, at, now);
        self.actions.lower_to(limits.actions, budgets.action_credit, at, now);
    }

    /// The chat and action budgets as they stand at `now`, for the shard to park with the
    /// player (`Leave.budgets`).
    pub(super) fn budgets(&self, limits: &Limits, now: Instant) -> Budgets {
        Budgets {
            chat_credit: self.chats.credit_at(limits.chats, now),
            action_credit: self.actions.credit_at(limits.actions, now),
            age_ms: 0,
        }
    }

    pub(super) fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}
