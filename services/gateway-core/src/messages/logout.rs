//! `Logout`: a Leave to the player's shard, which answers with `Left` to observers and a
//! close for this session; before a login, the connection just closes.

use std::sync::Arc;

use meridian_rpc::pb::{player_input::Kind as Input, Leave};

use super::super::{Closing, Conn, Ctx, Session};

impl Ctx {
    pub(super) fn logout(&mut self, conn: &mut Conn, slot: u32, session: u64) {
        match &conn.session {
            Session::Playing { player, link } if link.accepts_inputs() => {
                let (player, link) = (*player, Arc::clone(link));
                // A login after the logout finds them here as this connection left them.
                self.shared.admission.keep_budgets(player, conn.chats, conn.actions, self.now);
                let leave = Input::Leave(Leave { logout: true, budgets: None });
                self.relay(&link, session, player, conn.take_seq(), leave);
                conn.session = Session::LoggingOut { link };
            }
            // Already logging out: the shard's close is on its way.
            Session::LoggingOut { .. } => {}
            _ => self.close(conn, slot, session, Closing::AfterFlush),
        }
    }
}
