//! Short constructors for the server messages, so call sites read like the protocol table.

/// Every error code a server sends (all but `ERROR_UNSPECIFIED`), in wire order.
pub fn error_codes() -> impl Iterator<Item = crate::pb::ErrorCode> {
    (1..).map_while(|code| crate::pb::ErrorCode::try_from(code).ok())
}

/// `ServerMessage` constructors.
pub mod server {
    use crate::pb::{self, server_message::Kind, ErrorCode, ServerMessage};

    fn wrap(kind: Kind) -> ServerMessage {
        ServerMessage { kind: Some(kind) }
    }

    pub fn position(x: u32, y: u32) -> Option<pb::Position> {
        Some(pb::Position { x, y })
    }

    pub fn error(code: ErrorCode, detail: impl Into<String>, client_time: u64) -> ServerMessage {
        wrap(Kind::Error(pb::Error { code: code as i32, detail: detail.into(), client_time }))
    }

    pub fn pong(client_time: u64) -> ServerMessage {
        wrap(Kind::Pong(pb::Pong { client_time }))
    }

    pub fn entered(player_id: u64, x: u32, y: u32, name: impl Into<String>) -> ServerMessage {
        wrap(Kind::Entered(pb::Entered {
            player_id,
            position: position(x, y),
            name: name.into(),
            ..Default::default()
        }))
    }

    /// `Entered` for an entity with a game kind (0: a player) and public state; with kind 0
    /// and no state it is byte for byte [`entered`].
    pub fn entered_as(
        player_id: u64,
        x: u32,
        y: u32,
        name: impl Into<String>,
        kind: u32,
        state: &[u8],
    ) -> ServerMessage {
        wrap(Kind::Entered(pb::Entered {
            player_id,
            position: position(x, y),
            name: name.into(),
            kind,
            state: state.to_vec(),
        }))
    }

    pub fn state_changed(entity_id: u64, state: &[u8]) -> ServerMessage {
        wrap(Kind::StateChanged(pb::StateChanged { entity_id, state: state.to_vec() }))
    }

    pub fn game_event(source: u64, kind: u32, payload: &[u8]) -> ServerMessage {
        wrap(Kind::Event(pb::GameEvent { source, kind, payload: payload.to_vec() }))
    }

    pub fn action_done(client_time: u64, payload: &[u8]) -> ServerMessage {
        wrap(Kind::ActionDone(pb::ActionDone { client_time, payload: payload.to_vec() }))
    }

    pub fn moved(player_id: u64, x: u32, y: u32, client_time: u64) -> ServerMessage {
        wrap(Kind::Moved(pb::Moved { player_id, position: position(x, y), client_time }))
    }

    pub fn left(player_id: u64) -> ServerMessage {
        wrap(Kind::Left(pb::Left { player_id }))
    }

    pub fn chat(player_id: u64, text: impl Into<String>) -> ServerMessage {
        wrap(Kind::Chat(pb::ChatMessage { player_id, text: text.into() }))
    }

    pub fn view_reset(player_id: u64, x: u32, y: u32) -> ServerMessage {
        view_reset_with_token(player_id, x, y, Vec::new())
    }

    /// A `ViewReset` that hands the client a fresh resume token.
    pub fn view_reset_with_token(
        player_id: u64,
        x: u32,
        y: u32,
        resume_token: Vec<u8>,
    ) -> ServerMessage {
        let position = position(x, y);
        wrap(Kind::ViewReset(pb::ViewReset { player_id, position, resume_token }))
    }
}
