//! `Ping`: answered by the player's shard, so its `Pong` follows everything the shard sent
//! before; answered here when the shard is not taking inputs (a Ping never queues behind a
//! stalled shard), or before a login.

use std::sync::Arc;

use meridian_protocol::pb::Ping;
use meridian_protocol::server;
use meridian_rpc::pb::player_input::Kind as Input;

use super::super::outgoing::STALLED_LIMIT;
use super::super::{Conn, Ctx, Session};

impl Ctx {
    pub(super) fn ping(&mut self, conn: &mut Conn, slot: u32, session: u64, ping: Ping) {
        match &conn.session {
            Session::Playing { player, link }
                if link.is_up() && self.stalled_for(link) < STALLED_LIMIT =>
            {
                let (player, link) = (*player, Arc::clone(link));
                self.relay_in_game(conn, &link, session, player, Input::Ping(ping));
            }
            _ => self.reply(conn, slot, &server::pong(ping.client_time)),
        }
    }
}
