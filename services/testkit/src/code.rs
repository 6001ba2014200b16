//! Names of the wire's error codes, for the messages of a failed check. Its own room so the
//! bot and the stream checker, which both name codes, need not import each other.

use meridian_protocol::pb::ErrorCode;

/// `ErrorCode` from the wire value, for messages.
pub(crate) fn code_name(code: i32) -> String {
    ErrorCode::try_from(code)
        .map(|c| c.as_str_name().to_string())
        .unwrap_or_else(|_| format!("unknown error code {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_codes_and_says_which_is_unknown() {
        assert_eq!(code_name(ErrorCode::Malformed as i32), "MALFORMED");
        assert_eq!(code_name(-7), "unknown error code -7");
    }
}
