//! `Action`: checked here (an invalid one is refused at once when nothing is owed before
//! it, else by the shard in its turn), then relayed like a move.

use std::time::Instant;

use meridian_protocol::pb::Action;
use meridian_rpc::pb::{player_input::Kind as Input, MoveRefused};

use super::super::{Conn, Ctx, Session};

impl Ctx {
    pub(super) fn action(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        action: Action,
        now: Instant,
    ) {
        let client_time = action.client_time;
        if let Err(invalid) = meridian_protocol::validate_action(&action) {
            if matches!(conn.session, Session::Playing { .. }) && conn.inflight.is_empty() {
                let detail = invalid.to_string();
                return self.refuse(conn, slot, invalid.code(), &detail, client_time);
            }
            if matches!(conn.session, Session::Playing { .. }) {
                // Behind the answers still owed: answered by the shard in its turn.
                let code = invalid.code() as i32;
                let refused = MoveRefused { code, detail: invalid.to_string(), client_time };
                if let Some((player, link)) = self.route(conn, slot, client_time) {
                    conn.inflight.push_back((client_time, conn.next_seq, now));
                    let input = Input::Refused(refused);
                    return self.relay_in_game(conn, &link, session, player, input);
                }
                return;
            }
        }
        self.answered_input(conn, slot, session, client_time, Input::Action(action), now);
    }
}
