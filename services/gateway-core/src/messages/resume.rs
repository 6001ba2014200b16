//! `Resume`: the token's signature is checked here; every shard is asked which of them
//! holds the player (only that one knows whether the token is the player's last), and the
//! answers settle the session in `delivery`.

use std::sync::Arc;
use std::time::Instant;

use meridian_protocol::pb::ErrorCode;
use meridian_rpc::pb::{player_input::Kind as Input, ResumeRequest};

use super::super::{Conn, Ctx, Session};
use crate::routing::ShardLink;

impl Ctx {
    /// Checks a resume token and asks every shard which of them holds the player.
    pub(super) fn resume(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        token: &[u8],
        now: Instant,
    ) {
        if !matches!(conn.session, Session::Anonymous) {
            return self.refuse(conn, slot, ErrorCode::AlreadyLoggedIn, "already logged in", 0);
        }
        // The signature is checked here; whether the token is the player's last one (it
        // is good once) only the shard holding the player knows.
        let player = match self.shared.config.resume_keys.verify(token) {
            Ok(token) => token.player_id,
            Err(error) => {
                return self.refuse(conn, slot, ErrorCode::InvalidToken, &error.to_string(), 0)
            }
        };
        let links: Vec<Arc<ShardLink>> =
            self.routing().read(|t| t.links.iter().filter(|l| l.is_up()).cloned().collect());
        if links.is_empty() {
            return self.refuse(conn, slot, ErrorCode::Unavailable, "no shard available", 0);
        }
        let seq = conn.take_seq();
        let request = ResumeRequest { token: token.to_vec(), ..Default::default() };
        for link in &links {
            self.relay(link, session, player, seq, Input::Resume(request.clone()));
        }
        // A new connection has full budgets; the shard that held the player keeps its own
        // move budget across the resume, so a reconnect still buys no fresh burst of moves.
        conn.session = Session::Resuming { player, waiting: links.len(), since: now, login: None };
    }
}
