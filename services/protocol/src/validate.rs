//! The field limits the protocol states, checked once where a message enters the cluster.

use crate::pb::{Direction, ErrorCode};

/// Longest player name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 32;
/// Longest chat text, in bytes of UTF-8.
pub const MAX_CHAT_BYTES: usize = 256;
/// Largest `Action.payload`, and largest public or private game state of an entity.
pub const MAX_GAME_BYTES: usize = 1024;

/// A well-formed message with a value the protocol refuses (`INVALID_ARGUMENT`; the
/// connection stays open). The `Display` text is the `Error.detail` sent to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidArgument {
    #[error("name is empty")]
    EmptyName,
    #[error("name is {0} bytes, the limit is 32")]
    NameTooLong(usize),
    #[error("spawn ({x}, {y}) is outside the {width}x{height} map")]
    SpawnOutsideMap { x: u32, y: u32, width: u32, height: u32 },
    #[error("chat text is empty")]
    EmptyChat,
    #[error("chat text is {0} bytes, the limit is 256")]
    ChatTooLong(usize),
    #[error("direction {0} is not UP, DOWN, LEFT or RIGHT")]
    BadDirection(i32),
    #[error("message has no kind")]
    NoKind,
    #[error("name contains a control or bidirectional formatting character (U+{0:04X})")]
    NameCharacter(u32),
    #[error("chat text contains a control or bidirectional formatting character (U+{0:04X})")]
    ChatCharacter(u32),
    #[error("action kind 0 is not a kind")]
    NoActionKind,
    #[error("action payload is {0} bytes, the limit is 1024")]
    ActionTooLarge(usize),
}

/// Characters no name or chat may carry: control characters (C0, DEL, C1: they move
/// cursors, ring bells and break log lines) and the bidirectional formatting characters
/// (embeddings, overrides, isolates and marks: they make text read differently from what
/// it is, as in CVE-2021-42574 "Trojan Source").
fn forbidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn first_forbidden(text: &str) -> Option<u32> {
    text.chars().find(|c| forbidden(*c)).map(u32::from)
}

impl InvalidArgument {
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

pub fn validate_name(name: &str) -> Result<(), InvalidArgument> {
    match name.len() {
        0 => Err(InvalidArgument::EmptyName),
        n if n > MAX_NAME_BYTES => Err(InvalidArgument::NameTooLong(n)),
        _ => match first_forbidden(name) {
            Some(c) => Err(InvalidArgument::NameCharacter(c)),
            None => Ok(()),
        },
    }
}

pub fn validate_chat(text: &str) -> Result<(), InvalidArgument> {
    match text.len() {
        0 => Err(InvalidArgument::EmptyChat),
        n if n > MAX_CHAT_BYTES => Err(InvalidArgument::ChatTooLong(n)),
        _ => match first_forbidden(text) {
            Some(c) => Err(InvalidArgument::ChatCharacter(c)),
            None => Ok(()),
        },
    }
}

/// An `Action` needs a non-zero kind and a payload of at most [`MAX_GAME_BYTES`].
pub fn validate_action(action: &crate::pb::Action) -> Result<(), InvalidArgument> {
    if action.kind == 0 {
        return Err(InvalidArgument::NoActionKind);
    }
    match action.payload.len() {
        n if n > MAX_GAME_BYTES => Err(InvalidArgument::ActionTooLarge(n)),
        _ => Ok(()),
    }
}

/// Accepts exactly the four real directions; `DIRECTION_UNSPECIFIED` and unknown values
/// (proto3 enums are open) are refused.
pub fn validate_direction(raw: i32) -> Result<Direction, InvalidArgument> {
    match Direction::try_from(raw) {
        Ok(Direction::Unspecified) | Err(_) => Err(InvalidArgument::BadDirection(raw)),
        Ok(direction) => Ok(direction),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_need_a_kind_and_at_most_1024_bytes() {
        let action =
            |kind, n| crate::pb::Action { kind, payload: vec![7; n], ..Default::default() };
        assert_eq!(validate_action(&action(1, 1024)), Ok(()));
        assert_eq!(validate_action(&action(1, 0)), Ok(()));
        assert_eq!(validate_action(&action(0, 1)), Err(InvalidArgument::NoActionKind));
        assert_eq!(validate_action(&action(3, 1025)), Err(InvalidArgument::ActionTooLarge(1025)));
    }

    #[test]
    fn name_limits_count_bytes_not_chars() {
        assert_eq!(validate_name(""), Err(InvalidArgument::EmptyName));
        assert_eq!(validate_name(&"a".repeat(32)), Ok(()));
        assert_eq!(validate_name(&"a".repeat(33)), Err(InvalidArgument::NameTooLong(33)));
        // Eleven three-byte characters: 33 bytes.
        assert_eq!(validate_name(&"€".repeat(11)), Err(InvalidArgument::NameTooLong(33)));
    }

    #[test]
    fn control_and_bidirectional_characters_are_refused() {
        assert_eq!(validate_name("ann\u{7}"), Err(InvalidArgument::NameCharacter(7)));
        assert_eq!(validate_name("\u{202E}nna"), Err(InvalidArgument::NameCharacter(0x202E)));
        assert_eq!(validate_name("a\u{85}"), Err(InvalidArgument::NameCharacter(0x85)), "C1 too");
        assert_eq!(validate_chat("hi\nthere"), Err(InvalidArgument::ChatCharacter(10)));
        assert_eq!(validate_chat("x\u{2066}y"), Err(InvalidArgument::ChatCharacter(0x2066)));
        assert_eq!(validate_chat("a\u{200F}"), Err(InvalidArgument::ChatCharacter(0x200F)));
        assert_eq!(validate_chat("\u{7F}"), Err(InvalidArgument::ChatCharacter(0x7F)));
        // Everything else that is text passes: accents, CJK, emoji, right-to-left scripts.
        assert_eq!(validate_name("Zoë 张 ✨"), Ok(()));
        assert_eq!(validate_chat("שלום, مرحبا — hello 👋"), Ok(()));
    }

    #[test]
    fn chat_limits() {
        assert_eq!(validate_chat(""), Err(InvalidArgument::EmptyChat));
        assert_eq!(validate_chat(&"x".repeat(256)), Ok(()));
        assert_eq!(validate_chat(&"x".repeat(257)), Err(InvalidArgument::ChatTooLong(257)));
    }

    #[test]
    fn only_four_directions() {
        assert_eq!(validate_direction(1), Ok(Direction::Up));
        assert_eq!(validate_direction(4), Ok(Direction::Right));
        assert_eq!(validate_direction(0), Err(InvalidArgument::BadDirection(0)));
        assert_eq!(validate_direction(5), Err(InvalidArgument::BadDirection(5)));
        assert_eq!(validate_direction(-1), Err(InvalidArgument::BadDirection(-1)));
    }
}
