//! A per-client checker of the notification stream, stricter than [`View`](crate::View): it
//! knows what the client sent, so it checks the client's own acks, and it knows where every
//! subject was, so it checks that subjects move one step at a time and that nobody is
//! dropped from sight (`Left`) while still in sight.
//!
//! Sans-IO: [`StreamCheck::on_send`] for every message the client sends,
//! [`StreamCheck::on_receive`] for every message it receives, in order. A [`Bot`](crate::Bot)
//! runs one when [`Bot::check_streams`](crate::Bot::check_streams) is called.
//!
//! The rules (DESIGN.md sections 1 and 2), per client:
//! - acks come one per move, in the order the moves were sent, each at the previous own
//!   position plus the move's step, clamped at the map edge; an `Error` answering a move
//!   leaves the position unchanged (and is itself a failure unless allowed);
//! - a subject's consecutive positions while in view (`Entered`, then each `Moved`) are
//!   exactly one step apart: not zero (a clamped move, or a duplicate, tells observers
//!   nothing) and not two (a lost `Moved`);
//! - every `Entered` and `Moved` puts the subject within sight of the client, give or take
//!   the client's own moves not yet acknowledged;
//! - a `Left` for a subject still well inside sight is only allowed if the subject is gone
//!   for good (logged out or disconnected): such a `Left` is remembered, and an `Entered` of
//!   the same subject later, or the subject still being logged in at the end
//!   ([`StreamCheck::check_final`]), fails. This is how a `Left` + `Entered` pair sent for a
//!   player that merely crossed a shard border is caught. (Player ids are never reused, and
//!   the scripted clients these checks are for never `Resume`.)
//! - a chat is heard only from oneself or from a subject in view.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use anyhow::bail;
use meridian_protocol::pb::{
    client_message::Kind as C, server_message::Kind as S, ClientMessage, Direction, ErrorCode,
    Position, ServerMessage,
};

/// Chebyshev distance: the sight rule is `chebyshev(a, b) <= view_range`.
pub fn chebyshev(a: (u32, u32), b: (u32, u32)) -> u32 {
    a.0.abs_diff(b.0).max(a.1.abs_diff(b.1))
}

/// Manhattan distance: one move changes a position by exactly 1.
pub fn manhattan(a: (u32, u32), b: (u32, u32)) -> u32 {
    a.0.abs_diff(b.0) + a.1.abs_diff(b.1)
}

/// One move from `at` on a `map` (width, height), clamped at the edge as the server does.
pub fn step_clamped(at: (u32, u32), direction: Direction, map: (u32, u32)) -> (u32, u32) {
    let (x, y) = at;
    match direction {
        Direction::Up => (x, y.saturating_sub(1)),
        Direction::Down => (x, (y + 1).min(map.1.saturating_sub(1))),
        Direction::Left => (x.saturating_sub(1), y),
        Direction::Right => ((x + 1).min(map.0.saturating_sub(1)), y),
        Direction::Unspecified => (x, y),
    }
}

fn xy(position: &Option<Position>) -> (u32, u32) {
    position.as_ref().map_or((0, 0), |p| (p.x, p.y))
}

/// A chat the client received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeardChat {
    pub speaker: u64,
    pub text: String,
}

/// Counts, for reports and for "every move was answered" checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub moves_sent: u64,
    pub acks: u64,
    /// Errors answering moves, by code name.
    pub move_errors: BTreeMap<String, u64>,
    pub entered: u64,
    pub moved: u64,
    pub left: u64,
    pub chats: u64,
}

#[derive(Debug, Clone)]
struct Subject {
    name: String,
    in_view: bool,
    position: (u32, u32),
    /// Set when a `Left` came while the subject was well inside sight: fine only if the
    /// subject is gone for good.
    early_left: Option<String>,
}

/// How many notifications about each subject a checker remembers, to explain a failure.
const TRAIL: usize = 8;

/// The checker for one client connection. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    own: Option<(u64, (u32, u32))>,
    map: (u32, u32),
    view_range: u32,
    /// Moves sent and not yet answered, oldest first: (client_time, raw direction).
    in_flight: VecDeque<(u64, i32)>,
    has_moved: bool,
    allow_move_errors: bool,
    /// Keep the moves in flight across a `ViewReset` (see
    /// [`StreamCheck::answers_survive_view_reset`]).
    answers_survive_view_reset: bool,
    subjects: BTreeMap<u64, Subject>,
    chats: Vec<HeardChat>,
    stats: StreamStats,
    /// Messages received so far: numbers the entries of the trails.
    received: u64,
    /// The last notifications about each subject, with their message numbers.
    trails: BTreeMap<u64, VecDeque<String>>,
}

impl Default for StreamCheck {
    fn default() -> Self {
        StreamCheck::new()
    }
}

impl StreamCheck {
    /// A checker for a client that is about to log in. Any `Error` answering a move is a
    /// failure; see [`StreamCheck::allow_move_errors`].
    pub fn new() -> StreamCheck {
        StreamCheck {
            own: None,
            // DESIGN.md's defaults, until LoginOk says otherwise.
            map: (400, 400),
            view_range: 20,
            in_flight: VecDeque::new(),
            has_moved: false,
            allow_move_errors: false,
            answers_survive_view_reset: false,
            subjects: BTreeMap::new(),
            chats: Vec::new(),
            stats: StreamStats::default(),
            received: 0,
            trails: BTreeMap::new(),
        }
    }

    /// Accept `Error` answers to moves (they still count, in [`StreamStats::move_errors`]).
    pub fn allow_move_errors(mut self) -> StreamCheck {
        self.allow_move_errors = true;
        self
    }

    /// Moves still unanswered when a `ViewReset` arrives keep waiting for their one answer
    /// (an ack applied from the reset position, or an `Error`), instead of being written off
    /// as not applied. For a client whose shard dies while it keeps playing: a move it sends
    /// just before the `ViewReset` reaches it may reach the gateway just after the restore,
    /// and is then applied and acknowledged after the `ViewReset`.
    pub fn answers_survive_view_reset(mut self) -> StreamCheck {
        self.answers_survive_view_reset = true;
        self
    }

    pub fn own_id(&self) -> Option<u64> {
        self.own.map(|(id, _)| id)
    }

    /// The position of the last ack (or of `LoginOk`).
    pub fn own_position(&self) -> Option<(u32, u32)> {
        self.own.map(|(_, p)| p)
    }

    /// Client times of the moves sent and not answered yet, oldest first.
    pub fn unanswered(&self) -> Vec<u64> {
        self.in_flight.iter().map(|(t, _)| *t).collect()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Every chat received, in order.
    pub fn chats(&self) -> &[HeardChat] {
        &self.chats
    }

    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }

    /// Records a message the client sends.
    pub fn on_send(&mut self, message: &ClientMessage) {
        if let Some(C::Move(m)) = &message.kind {
            self.in_flight.push_back((m.client_time, m.direction));
            self.stats.moves_sent += 1;
        }
    }

    /// How far the client may be from where the server computed an event, in steps: the
    /// moves in flight, plus two for a client that moves at all (the ack and the
    /// notifications its move causes may arrive in either order, and during the client's own
    /// handoff two shards may speak for it). A client that never moves has no slack, which
    /// makes the checks on stationary observers exact.
    fn slack(&self) -> u32 {
        if self.has_moved || !self.in_flight.is_empty() {
            self.in_flight.len() as u32 + 2
        } else {
            0
        }
    }

    fn describe_subject(&self, id: u64) -> String {
        match self.subjects.get(&id) {
            Some(s) => format!("player {id} ({:?})", s.name),
            None => format!("player {id}"),
        }
    }

    /// Checks one received message and updates what the client knows; a broken rule is an
    /// error naming it, with the last notifications received about the subject concerned.
    pub fn on_receive(&mut self, message: &ServerMessage) -> anyhow::Result<()> {
        self.received += 1;
        let subject = match &message.kind {
            Some(S::Entered(m)) => Some((m.player_id, format!("Entered {:?}", xy(&m.position)))),
            Some(S::Moved(m)) if Some(m.player_id) != self.own_id() => {
                Some((m.player_id, format!("Moved {:?}", xy(&m.position))))
            }
            Some(S::Left(m)) => Some((m.player_id, "Left".to_string())),
            Some(S::Chat(m)) if Some(m.player_id) != self.own_id() => {
                Some((m.player_id, format!("Chat {:?}", m.text)))
            }
            _ => None,
        };
        let result = self.apply(message);
        let Some((id, entry)) = subject else {
            return result;
        };
        if let Err(e) = result {
            let trail = self
                .trails
                .get(&id)
                .map(|t| t.iter().map(String::as_str).collect::<Vec<_>>().join(", "));
            return Err(anyhow::anyhow!(
                "{e:#}\n  (message #{} here; the earlier notifications about player {id} here: {})",
                self.received,
                trail.unwrap_or_else(|| "none".to_string())
            ));
        }
        let trail = self.trails.entry(id).or_default();
        if trail.len() == TRAIL {
            trail.pop_front();
        }
        trail.push_back(format!("#{} {entry}", self.received));
        Ok(())
    }

    fn apply(&mut self, message: &ServerMessage) -> anyhow::Result<()> {
        let Some(kind) = &message.kind else {
            return Ok(());
        };
        match kind {
            S::LoginOk(ok) => {
                self.own = Some((ok.player_id, xy(&ok.position)));
                self.map = (ok.map_width, ok.map_height);
                self.view_range = ok.view_range;
            }
            S::ViewReset(reset) => {
                // Moves not answered when a ViewReset arrives were not applied (DESIGN.md
                // section 2), unless the test knows they may still be answered after it.
                if !self.answers_survive_view_reset {
                    self.in_flight.clear();
                }
                // A resumed connection starts with it, instead of LoginOk.
                self.own = Some((reset.player_id, xy(&reset.position)));
                // Everyone in sight is announced again, from wherever they are now.
                self.subjects.clear();
            }
            S::Moved(moved) if Some(moved.player_id) == self.own_id() => {
                self.on_ack(moved.client_time, xy(&moved.position))?;
            }
            S::Error(error) if error.client_time != 0 => {
                self.on_move_error(error.client_time, error.code, &error.detail)?;
            }
            S::Error(error) => bail!(
                "an Error that answers nothing the client sent: {} {:?}",
                crate::code::code_name(error.code),
                error.detail
            ),
            S::Entered(entered) => {
                self.stats.entered += 1;
                let at = xy(&entered.position);
                self.check_in_sight(entered.player_id, at, "Entered")?;
                let distance = self.own_position().map(|own| chebyshev(own, at));
                let threshold = self.view_range.saturating_sub(self.slack());
                if let Some(subject) = self.subjects.get_mut(&entered.player_id) {
                    if let Some(early) = subject.early_left.take() {
                        bail!(
                            "Entered {entered:?} for a player that got Left while it was still \
                             in sight ({early}): a Left + Entered pair for a player that stayed \
                             in sight (it should have been Moved)"
                        );
                    }
                    // Back in sight after a Left: by one step, so at the edge of sight.
                    if distance.is_some_and(|d| d < threshold) {
                        bail!(
                            "Entered {entered:?} at distance {} from us at {:?}: it was out of \
                             sight before, so one step can only bring it to distance {}",
                            distance.unwrap_or(0),
                            self.own_position(),
                            self.view_range
                        );
                    }
                    subject.in_view = true;
                    subject.position = at;
                } else {
                    self.subjects.insert(
                        entered.player_id,
                        Subject {
                            name: entered.name.clone(),
                            in_view: true,
                            position: at,
                            early_left: None,
                        },
                    );
                }
            }
            S::Moved(moved) => {
                self.stats.moved += 1;
                let at = xy(&moved.position);
                let who = self.describe_subject(moved.player_id);
                let Some(subject) = self.subjects.get(&moved.player_id).filter(|s| s.in_view)
                else {
                    bail!("Moved {moved:?} for {who}, who is not in view");
                };
                let from = subject.position;
                if manhattan(from, at) != 1 {
                    bail!(
                        "{who} went from {from:?} to {at:?} in one Moved: observers see every \
                         step, one cell at a time (a lost or duplicated Moved, or one sent for \
                         a clamped move)"
                    );
                }
                self.check_in_sight(moved.player_id, at, "Moved")?;
                if let Some(subject) = self.subjects.get_mut(&moved.player_id) {
                    subject.position = at;
                }
            }
            S::Left(left) => {
                self.stats.left += 1;
                let slack = self.slack();
                let own = self.own_position();
                let range = self.view_range;
                let Some(subject) = self.subjects.get_mut(&left.player_id).filter(|s| s.in_view)
                else {
                    bail!("Left {left:?} for a player not in view");
                };
                subject.in_view = false;
                if let Some(own) = own {
                    let distance = chebyshev(own, subject.position);
                    if distance < range.saturating_sub(slack) {
                        subject.early_left = Some(format!(
                            "it was at {:?}, {distance} from us at {own:?}",
                            subject.position
                        ));
                    }
                }
            }
            S::Chat(chat) => {
                self.stats.chats += 1;
                if Some(chat.player_id) != self.own_id()
                    && !self.subjects.get(&chat.player_id).is_some_and(|s| s.in_view)
                {
                    bail!(
                        "chat {:?} from {}, who is not in view: chat reaches those who see \
                         the speaker, and per subject it comes in order with Entered and Left",
                        chat.text,
                        self.describe_subject(chat.player_id)
                    );
                }
                self.chats.push(HeardChat { speaker: chat.player_id, text: chat.text.clone() });
            }
            S::Pong(_) | S::StateChanged(_) | S::Event(_) | S::ActionDone(_) => {}
        }
        Ok(())
    }

    fn check_in_sight(&self, id: u64, at: (u32, u32), what: &str) -> anyhow::Result<()> {
        let Some(own) = self.own_position() else {
            return Ok(());
        };
        let distance = chebyshev(own, at);
        let allowed = self.view_range + self.slack();
        if distance > allowed {
            bail!(
                "{what} puts {} at {at:?}, {distance} from us at {own:?} ({} moves \
                 unanswered): out of sight",
                self.describe_subject(id),
                self.in_flight.len()
            );
        }
        Ok(())
    }

    fn on_ack(&mut self, client_time: u64, at: (u32, u32)) -> anyhow::Result<()> {
        let Some((id, from)) = self.own else {
            bail!("an ack before LoginOk");
        };
        let Some((expected_time, direction)) = self.in_flight.pop_front() else {
            bail!("an ack (client_time {client_time}, at {at:?}) for no move: none is unanswered");
        };
        if client_time != expected_time {
            bail!(
                "the ack of move {client_time} came while move {expected_time} was the oldest \
                 unanswered: acks out of order, lost, or duplicated (unanswered after it: {:?})",
                self.unanswered()
            );
        }
        let Ok(direction) = Direction::try_from(direction) else {
            bail!("move {client_time} with the invalid direction {direction} was acknowledged");
        };
        let expected = step_clamped(from, direction, self.map);
        if at != expected {
            bail!(
                "move {client_time} {direction:?} from {from:?} was acknowledged at {at:?}, \
                 expected {expected:?}"
            );
        }
        self.own = Some((id, at));
        self.has_moved = true;
        self.stats.acks += 1;
        Ok(())
    }

    fn on_move_error(&mut self, client_time: u64, code: i32, detail: &str) -> anyhow::Result<()> {
        let name = crate::code::code_name(code);
        let Some((expected_time, _)) = self.in_flight.pop_front() else {
            bail!("Error {name} ({detail:?}) with client_time {client_time}, but no move is unanswered");
        };
        if client_time != expected_time {
            bail!(
                "Error {name} answers move {client_time} while move {expected_time} was the \
                 oldest unanswered: answers out of order"
            );
        }
        *self.stats.move_errors.entry(name.clone()).or_default() += 1;
        if !self.allow_move_errors {
            let hint = if code == ErrorCode::RateLimited as i32 {
                " (the test paces moves under the limit: a rate limit here is a bug)"
            } else {
                ""
            };
            bail!("move {client_time} was refused with {name} ({detail:?}){hint}");
        }
        Ok(())
    }

    /// End-of-run rules, once the client is quiet: every move answered, and no player that
    /// got an early `Left` (see the module docs) is still logged in.
    pub fn check_final(&self, logged_in: &BTreeSet<u64>) -> anyhow::Result<()> {
        if !self.in_flight.is_empty() {
            bail!("moves never answered: {:?}", self.unanswered());
        }
        for (id, subject) in &self.subjects {
            if let Some(early) = &subject.early_left {
                if logged_in.contains(id) {
                    bail!(
                        "got Left for {} while it was in sight ({early}), yet it is still \
                         logged in",
                        self.describe_subject(*id)
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::pb::LoginOk;
    use meridian_protocol::server;

    fn login_ok(id: u64, x: u32, y: u32) -> ServerMessage {
        ServerMessage {
            kind: Some(S::LoginOk(LoginOk {
                player_id: id,
                position: server::position(x, y),
                resume_token: vec![1],
                map_width: 400,
                map_height: 400,
                view_range: 20,
            })),
        }
    }

    fn checker_at(x: u32, y: u32) -> StreamCheck {
        let mut check = StreamCheck::new();
        check.on_receive(&login_ok(1, x, y)).unwrap();
        check
    }

    #[test]
    fn acks_follow_the_moves_in_order() {
        let mut check = checker_at(0, 5);
        check.on_send(&crate::msg::move_(Direction::Left, 1));
        check.on_send(&crate::msg::move_(Direction::Right, 2));
        // Clamped at x = 0: same position.
        check.on_receive(&server::moved(1, 0, 5, 1)).unwrap();
        assert!(check.on_receive(&server::moved(1, 2, 5, 2)).is_err(), "wrong position");
        let mut check = checker_at(0, 5);
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        check.on_send(&crate::msg::move_(Direction::Down, 2));
        assert!(check.on_receive(&server::moved(1, 0, 6, 2)).is_err(), "out of order");
        let mut check = checker_at(0, 5);
        assert!(check.on_receive(&server::moved(1, 0, 6, 9)).is_err(), "no move sent");
        check.on_send(&crate::msg::move_(Direction::Down, 3));
        check.on_receive(&server::moved(1, 0, 6, 3)).unwrap();
        check.check_final(&BTreeSet::new()).unwrap();
        check.on_send(&crate::msg::move_(Direction::Down, 4));
        assert!(check.check_final(&BTreeSet::new()).is_err(), "unanswered");
    }

    #[test]
    fn move_errors_fail_unless_allowed() {
        let mut check = checker_at(10, 10);
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        let refused = server::error(ErrorCode::RateLimited, "slow down", 1);
        assert!(check.on_receive(&refused).is_err());
        let mut check = checker_at(10, 10).allow_move_errors();
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        check.on_receive(&refused).unwrap();
        assert_eq!(check.own_position(), Some((10, 10)));
        assert_eq!(check.stats().move_errors.get("RATE_LIMITED"), Some(&1));
    }

    #[test]
    fn moves_in_flight_at_a_view_reset_are_written_off_unless_told_otherwise() {
        let mut check = checker_at(10, 10);
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        check.on_receive(&server::view_reset(1, 50, 50)).unwrap();
        assert!(check.on_receive(&server::moved(1, 50, 51, 1)).is_err(), "written off");
        let mut check = checker_at(10, 10).answers_survive_view_reset();
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        check.on_receive(&server::view_reset(1, 50, 50)).unwrap();
        assert!(check.on_receive(&server::moved(1, 10, 11, 1)).is_err(), "from the reset cell");
        let mut check = checker_at(10, 10).answers_survive_view_reset();
        check.on_send(&crate::msg::move_(Direction::Down, 1));
        check.on_receive(&server::view_reset(1, 50, 50)).unwrap();
        check.on_receive(&server::moved(1, 50, 51, 1)).unwrap();
        check.check_final(&BTreeSet::new()).unwrap();
    }

    #[test]
    fn subjects_move_one_step_at_a_time() {
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 110, 100, "b")).unwrap();
        check.on_receive(&server::moved(2, 111, 100, 0)).unwrap();
        assert!(check.on_receive(&server::moved(2, 111, 100, 0)).is_err(), "duplicate");
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 110, 100, "b")).unwrap();
        let err = check.on_receive(&server::moved(2, 112, 100, 0)).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("one cell at a time"), "{text}");
        assert!(text.contains("#2 Entered (110, 100)"), "the subject's trail: {text}");
        let mut check = checker_at(100, 100);
        assert!(check.on_receive(&server::entered(2, 130, 100, "b")).is_err(), "out of sight");
    }

    #[test]
    fn a_left_for_a_player_in_sight_is_caught_when_it_comes_back_or_stays() {
        // Left at the edge of sight, then Entered at the edge: fine.
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 120, 100, "b")).unwrap();
        check.on_receive(&server::left(2)).unwrap();
        check.on_receive(&server::entered(2, 120, 100, "b")).unwrap();
        check.check_final(&BTreeSet::from([2])).unwrap();

        // Left well inside sight, then Entered next to where it was: a crossing seen as
        // Left + Entered.
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 105, 100, "b")).unwrap();
        check.on_receive(&server::left(2)).unwrap();
        let err = check.on_receive(&server::entered(2, 106, 100, "b")).unwrap_err();
        assert!(err.to_string().contains("stayed in sight"), "{err}");

        // Left well inside sight and never back: fine if it logged out, not if it is still on.
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 105, 100, "b")).unwrap();
        check.on_receive(&server::left(2)).unwrap();
        check.check_final(&BTreeSet::new()).unwrap();
        assert!(check.check_final(&BTreeSet::from([2])).is_err());

        // Entered again deep inside sight after a Left at the edge: it teleported.
        let mut check = checker_at(100, 100);
        check.on_receive(&server::entered(2, 120, 100, "b")).unwrap();
        check.on_receive(&server::left(2)).unwrap();
        assert!(check.on_receive(&server::entered(2, 110, 100, "b")).is_err());
    }

    #[test]
    fn chat_only_from_self_or_a_player_in_view() {
        let mut check = checker_at(100, 100);
        check.on_receive(&server::chat(1, "me")).unwrap();
        assert!(check.on_receive(&server::chat(2, "stranger")).is_err());
        check.on_receive(&server::entered(2, 101, 100, "b")).unwrap();
        check.on_receive(&server::chat(2, "hi")).unwrap();
        assert_eq!(check.chats().len(), 2);
    }
}
