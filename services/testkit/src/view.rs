//! A client's view of the world, rebuilt from the notifications it receives, with the
//! protocol's ordering rules checked on every message (DESIGN.md section 1).

use std::collections::BTreeMap;

use anyhow::bail;
use meridian_protocol::pb::{server_message::Kind as S, Position, ServerMessage};

/// What a client knows about another player it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub name: String,
    pub position: (u32, u32),
    /// 0 for a player; the game's kind for an NPC.
    pub kind: u32,
    /// The entity's public state, as last told.
    pub state: Vec<u8>,
}

/// The player's own id and position, and every other player it has been told it sees.
///
/// Rules checked (a broken one is a protocol violation by the server):
/// nothing about others before `LoginOk`; no second `LoginOk`; `Entered` only for a player not
/// in view and never for oneself; `Moved` for another player only while it is in view and with
/// `client_time` 0; `Left` only for a player in view. `ViewReset` clears the view.
#[derive(Debug, Clone, Default)]
pub struct View {
    own: Option<(u64, (u32, u32))>,
    others: BTreeMap<u64, Seen>,
    /// The player's own public state, as last told (`StateChanged` for its own id).
    own_state: Vec<u8>,
}

fn xy(position: &Option<Position>) -> (u32, u32) {
    position.as_ref().map_or((0, 0), |p| (p.x, p.y))
}

impl View {
    pub fn new() -> Self {
        View::default()
    }

    /// The player's own public state, as last told.
    pub fn own_state(&self) -> &[u8] {
        &self.own_state
    }

    /// Our own player id, once logged in.
    pub fn own_id(&self) -> Option<u64> {
        self.own.map(|(id, _)| id)
    }

    /// Our own position, as of the last `LoginOk`, own `Moved` ack or `ViewReset`.
    pub fn own_position(&self) -> Option<(u32, u32)> {
        self.own.map(|(_, position)| position)
    }

    /// The players in view, by id.
    pub fn others(&self) -> &BTreeMap<u64, Seen> {
        &self.others
    }

    pub fn sees(&self, player_id: u64) -> bool {
        self.others.contains_key(&player_id)
    }

    pub fn position_of(&self, player_id: u64) -> Option<(u32, u32)> {
        self.others.get(&player_id).map(|seen| seen.position)
    }

    /// Applies one server message, panicking on a protocol violation.
    pub fn apply(&mut self, message: &ServerMessage) {
        if let Err(violation) = self.try_apply(message) {
            panic!("{violation}");
        }
    }

    /// Applies one server message; a protocol violation is an error and leaves the view as
    /// it was.
    pub fn try_apply(&mut self, message: &ServerMessage) -> anyhow::Result<()> {
        let Some(kind) = &message.kind else {
            bail!("protocol violation: a ServerMessage with no kind");
        };
        match kind {
            S::LoginOk(ok) => {
                if let Some((id, _)) = self.own {
                    bail!("protocol violation: a second LoginOk ({ok:?}) after logging in as {id}");
                }
                self.own = Some((ok.player_id, xy(&ok.position)));
            }
            S::Entered(entered) => {
                let own_id = self.require_login("Entered", message)?;
                if entered.player_id == own_id {
                    bail!("protocol violation: Entered for ourselves: {entered:?}");
                }
                if let Some(seen) = self.others.get(&entered.player_id) {
                    bail!(
                        "protocol violation: Entered {entered:?} for a player already in view \
                         (at {:?}): a duplicate, or a missing Left",
                        seen.position
                    );
                }
                let seen = Seen {
                    name: entered.name.clone(),
                    position: xy(&entered.position),
                    kind: entered.kind,
                    state: entered.state.clone(),
                };
                self.others.insert(entered.player_id, seen);
            }
            S::Moved(moved) => {
                let own_id = self.require_login("Moved", message)?;
                if moved.player_id == own_id {
                    self.own = Some((own_id, xy(&moved.position)));
                } else {
                    if moved.client_time != 0 {
                        bail!(
                            "protocol violation: Moved for another player carries a \
                             client_time (only the mover's own ack does): {moved:?}"
                        );
                    }
                    let Some(seen) = self.others.get_mut(&moved.player_id) else {
                        bail!(
                            "protocol violation: Moved {moved:?} for a player not in view \
                             (no Entered before it, or after its Left)"
                        );
                    };
                    seen.position = xy(&moved.position);
                }
            }
            S::Left(left) => {
                self.require_login("Left", message)?;
                if self.others.remove(&left.player_id).is_none() {
                    bail!("protocol violation: Left {left:?} for a player not in view");
                }
            }
            S::ViewReset(reset) => {
                // A resumed connection starts with ViewReset instead of LoginOk.
                let own_id = match self.own {
                    Some((id, _)) => id,
                    None => reset.player_id,
                };
                if reset.player_id != own_id {
                    bail!("protocol violation: ViewReset {reset:?} for another player ({own_id})");
                }
                self.own = Some((own_id, xy(&reset.position)));
                self.others.clear();
            }
            S::StateChanged(changed) => {
                self.require_login("StateChanged", message)?;
                match self.others.get_mut(&changed.entity_id) {
                    Some(seen) => seen.state = changed.state.clone(),
                    // Our own state is ours to know; anyone else's must be in view.
                    None if Some(changed.entity_id) == self.own.map(|(id, _)| id) => {
                        self.own_state = changed.state.clone();
                    }
                    None => bail!(
                        "protocol violation: StateChanged {changed:?} for an entity not in view"
                    ),
                }
            }
            S::Chat(_) | S::Pong(_) | S::Error(_) | S::Event(_) | S::ActionDone(_) => {}
        }
        Ok(())
    }

    fn require_login(&self, what: &str, message: &ServerMessage) -> anyhow::Result<u64> {
        match self.own {
            Some((id, _)) => Ok(id),
            None => bail!("protocol violation: {what} before LoginOk: {message:?}"),
        }
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

    #[test]
    fn follows_entered_moved_left() {
        let mut view = View::new();
        view.apply(&login_ok(1, 10, 10));
        view.apply(&server::entered(2, 20, 10, "b"));
        view.apply(&server::moved(2, 21, 10, 0));
        assert_eq!(view.position_of(2), Some((21, 10)));
        view.apply(&server::moved(1, 11, 10, 7));
        assert_eq!(view.own_position(), Some((11, 10)));
        view.apply(&server::left(2));
        assert!(!view.sees(2));
        view.apply(&server::entered(2, 30, 10, "b"));
        assert!(view.sees(2));
    }

    #[test]
    fn violations_are_errors_and_leave_the_view_unchanged() {
        let mut view = View::new();
        assert!(view.try_apply(&server::entered(2, 0, 0, "b")).is_err(), "before login");
        view.apply(&login_ok(1, 10, 10));
        assert!(view.try_apply(&server::moved(2, 0, 0, 0)).is_err(), "moved unseen");
        assert!(view.try_apply(&server::left(2)).is_err(), "left unseen");
        assert!(view.try_apply(&server::entered(1, 0, 0, "me")).is_err(), "entered self");
        view.apply(&server::entered(2, 0, 0, "b"));
        assert!(view.try_apply(&server::entered(2, 1, 0, "b")).is_err(), "entered twice");
        assert!(view.try_apply(&server::moved(2, 1, 0, 5)).is_err(), "client_time on other");
        assert!(view.try_apply(&login_ok(1, 0, 0)).is_err(), "second LoginOk");
        assert_eq!(view.position_of(2), Some((0, 0)));
    }

    #[test]
    #[should_panic(expected = "Entered")]
    fn apply_panics_on_a_violation() {
        let mut view = View::new();
        view.apply(&login_ok(1, 10, 10));
        view.apply(&server::entered(2, 0, 0, "b"));
        view.apply(&server::entered(2, 0, 0, "b"));
    }

    #[test]
    fn view_reset_clears() {
        let mut view = View::new();
        view.apply(&login_ok(1, 10, 10));
        view.apply(&server::entered(2, 0, 0, "b"));
        view.apply(&server::view_reset(1, 5, 5));
        assert!(view.others().is_empty());
        assert_eq!(view.own_position(), Some((5, 5)));
        view.apply(&server::entered(2, 0, 0, "b"));
    }
}
