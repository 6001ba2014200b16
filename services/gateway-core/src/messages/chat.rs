//! `Chat`: checked, rate limited here (its bucket lives where every input passes, so a
//! handoff cannot refill it), and relayed to the player's shard.

use std::time::Instant;

use meridian_protocol::pb::{Chat, ErrorCode};
use meridian_protocol::validate_chat;
use meridian_rpc::pb::player_input::Kind as Input;

use super::super::{Conn, Ctx, Session};

impl Ctx {
    pub(super) fn chat(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        chat: Chat,
        now: Instant,
    ) {
        if let Err(invalid) = validate_chat(&chat.text) {
            if matches!(conn.session, Session::Playing { .. }) {
                return self.refuse(conn, slot, invalid.code(), &invalid.to_string(), 0);
            }
        }
        let Some((player, link)) = self.route(conn, slot, 0) else { return };
        if !conn.chats.try_take(self.shared.admission.limits().chats, 1, now) {
            self.shared.metrics.rate_limited.inc("chat");
            return self.refuse(conn, slot, ErrorCode::RateLimited, "chat rate limit", 0);
        }
        self.relay_in_game(conn, &link, session, player, Input::Chat(chat));
    }
}
