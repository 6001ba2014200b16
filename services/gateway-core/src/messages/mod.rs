//! The client's messages, one kind per file, as mini-redis handles one command per file:
//! [`Ctx::handle_message`] dispatches a decoded `ClientMessage` to its kind's handler.
//! The dispatch is called by `intake` only (login's other entries: the store's answer from
//! the door's `handle_mail`, and `delivery` placing a login whose player no shard holds);
//! the handlers answer through `output` and relay through `outgoing`.

mod action;
mod chat;
mod login;
mod logout;
mod moves;
mod ping;
mod resume;

use std::sync::Arc;
use std::time::Instant;

use meridian_protocol::pb::{client_message::Kind as C, ClientMessage, ErrorCode};
use tracing::trace;

use super::outgoing::STALLED_LIMIT;
use super::{Conn, Ctx, Session};
use crate::routing::ShardLink;

impl Ctx {
    pub(super) fn handle_message(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        message: ClientMessage,
        now: Instant,
    ) {
        trace!(session, ?message, "client message");
        let Some(kind) = message.kind else {
            return self.refuse(conn, slot, ErrorCode::InvalidArgument, "message has no kind", 0);
        };
        match kind {
            C::Ping(ping) => self.ping(conn, slot, session, ping),
            C::Login(login) => self.login(conn, slot, session, login),
            C::Move(m) => self.move_to(conn, slot, session, m, now),
            C::Action(action) => self.action(conn, slot, session, action, now),
            C::Chat(chat) => self.chat(conn, slot, session, chat, now),
            C::Logout(_) => self.logout(conn, slot, session),
            C::Resume(resume) => self.resume(conn, slot, session, &resume.token, now),
        }
    }

    /// The player and link to relay an in-game input to, or an error answer.
    pub(crate) fn route(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        client_time: u64,
    ) -> Option<(u64, Arc<ShardLink>)> {
        match &conn.session {
            Session::Playing { link, .. } if self.stalled_for(link) >= STALLED_LIMIT => {
                let detail = "shard overloaded; try again";
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
                None
            }
            Session::Playing { player, link } if link.accepts_inputs() && !conn.restoring => {
                Some((*player, Arc::clone(link)))
            }
            Session::Playing { .. } => {
                let detail = if conn.restoring {
                    "restoring after a shard failure"
                } else {
                    "shard unavailable"
                };
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
                None
            }
            Session::Resuming { .. } => {
                let detail = "resuming: wait for ViewReset";
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
                None
            }
            Session::Anonymous => {
                self.refuse(conn, slot, ErrorCode::NotLoggedIn, "log in first", client_time);
                None
            }
            Session::LoggingOut { .. } | Session::Gone => None,
        }
    }
}
