//! The field limits the protocol states, checked once where a message enters the cluster.
//!
//! Names are what players use to tell each other apart, so a name is normalised and
//! restricted until two names that render the same are the same string
//! ([`validate_name`]; `docs/protocol.md` states the rule for clients). Chat is checked
//! only for what breaks the text around it: control characters, bidirectional overrides
//! and line or paragraph separators ([`validate_chat`]).

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
use unicode_script::{Script, UnicodeScript};

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
    #[error("name is {0} bytes, the limit is 32 (counted after NFKC normalisation)")]
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
    #[error(
        "name contains an invisible or formatting character (U+{0:04X}): zero-width \
         characters, soft hyphens, joiners, variation selectors and blank fillers are refused"
    )]
    NameInvisible(u32),
    #[error("name contains a line or paragraph separator (U+{0:04X})")]
    NameSeparator(u32),
    #[error("name contains a private-use or unassigned character (U+{0:04X})")]
    NameUnassigned(u32),
    #[error("name starts with a combining mark (U+{0:04X}); a mark needs a letter before it")]
    NameLeadingMark(u32),
    #[error(
        "name has a space at its start or end, two spaces in a row, or a space other than \
         U+0020"
    )]
    NameSpacing,
    #[error(
        "name mixes the scripts {0}: a name's letters are of one script, except that Latin, \
         Han, Hiragana and Katakana may mix, and Latin and Han with Bopomofo or Hangul"
    )]
    NameScripts(String),
    #[error(
        "chat text contains a line or paragraph separator (U+{0:04X}); a chat message is one \
         line"
    )]
    ChatSeparator(u32),
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

impl InvalidArgument {
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

/// The longest name, as sent, that is normalised at all. NFKC turns no character of four
/// bytes into less than one byte (the worst is a mathematical letter such as U+1D400 "𝐀"
/// becoming "A"), so a longer name cannot fit [`MAX_NAME_BYTES`] once normalised: refusing
/// it early bounds the work and never refuses a name that fits.
const MAX_NAME_BYTES_SENT: usize = 4 * MAX_NAME_BYTES;

/// Characters that render as nothing or as blank space without being a space: Unicode's
/// `Default_Ignorable_Code_Point` (soft hyphen, combining grapheme joiner, Hangul fillers,
/// Khmer inherent vowels, Mongolian selectors, zero-width space and joiners, word joiner and
/// invisible operators, variation selectors, the byte order mark, tags; from
/// DerivedCoreProperties.txt, Unicode 16), and the braille blank U+2800, which is a symbol
/// that prints as an empty cell.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    ) || c.general_category() == GeneralCategory::Format
}

/// Line and paragraph separators (general categories Zl and Zp: U+2028 and U+2029). They
/// end a line in JavaScript strings and in many log viewers, so text carrying one can fake
/// a line of its own.
fn separator(c: char) -> bool {
    matches!(
        c.general_category(),
        GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
    )
}

/// The first character of a name (as sent, or normalised) that no name may hold.
fn name_character(name: &str) -> Result<(), InvalidArgument> {
    for c in name.chars() {
        let code = u32::from(c);
        if forbidden(c) {
            return Err(InvalidArgument::NameCharacter(code));
        }
        if separator(c) {
            return Err(InvalidArgument::NameSeparator(code));
        }
        if invisible(c) {
            return Err(InvalidArgument::NameInvisible(code));
        }
        // Script `Unknown` is what has no script: private use, surrogates, noncharacters and
        // code points not assigned yet, which render however a font likes.
        if c.script() == Script::Unknown {
            return Err(InvalidArgument::NameUnassigned(code));
        }
    }
    Ok(())
}

/// Spaces: only U+0020, never first or last, never two in a row.
fn name_spacing(name: &str) -> Result<(), InvalidArgument> {
    let other_space = name.chars().any(|c| c.is_whitespace() && c != ' ');
    if other_space || name.starts_with(' ') || name.ends_with(' ') || name.contains("  ") {
        return Err(InvalidArgument::NameSpacing);
    }
    Ok(())
}

/// The script rule, UTS #39's "highly restrictive" level: the scripts of a name's characters
/// (Common and Inherited ones, such as digits, punctuation, symbols and combining accents,
/// aside) are one script, or fit in one of Latin + Han + Hiragana + Katakana (Japanese),
/// Latin + Han + Bopomofo (Chinese) and Latin + Han + Hangul (Korean). So a Cyrillic "а" or a
/// Greek "ο" cannot hide in a Latin name. (Names wholly in a script that looks like Latin,
/// such as Cyrillic "асе" beside Latin "ace", need confusable tables and are not caught.)
fn name_scripts(name: &str) -> Result<(), InvalidArgument> {
    let mut scripts: Vec<Script> = Vec::new();
    for script in name.chars().map(|c| c.script()) {
        if !matches!(script, Script::Common | Script::Inherited) && !scripts.contains(&script) {
            scripts.push(script);
        }
    }
    const MIXES: [&[Script]; 3] = [
        &[Script::Latin, Script::Han, Script::Hiragana, Script::Katakana],
        &[Script::Latin, Script::Han, Script::Bopomofo],
        &[Script::Latin, Script::Han, Script::Hangul],
    ];
    let fits = |mix: &[Script]| scripts.iter().all(|s| mix.contains(s));
    if scripts.len() <= 1 || MIXES.iter().any(|mix| fits(mix)) {
        return Ok(());
    }
    let names: Vec<&str> = scripts.iter().map(|s| s.full_name()).collect();
    Err(InvalidArgument::NameScripts(names.join(" and ")))
}

/// Checks a player's or NPC's name and returns it normalised: the name the cluster stores
/// and shows. The rule, in order:
/// - 1..=32 bytes of UTF-8, counted after normalisation to NFKC (so "ＡＢＣ" is "ABC", and
///   fullwidth or mathematical look-alikes become the letters they look like);
/// - no control or bidirectional formatting character, no line or paragraph separator, no
///   invisible or formatting character (general category Cf, Unicode's default-ignorable
///   code points, the braille blank), no private-use or unassigned character, checked in
///   the name as sent and again once normalised;
/// - spaces are U+0020 only, never first, last or doubled, and the name does not start with
///   a combining mark;
/// - its letters are of one script, or one of the CJK mixes of [`name_scripts`].
pub fn validate_name(name: &str) -> Result<String, InvalidArgument> {
    match name.len() {
        0 => return Err(InvalidArgument::EmptyName),
        n if n > MAX_NAME_BYTES_SENT => return Err(InvalidArgument::NameTooLong(n)),
        _ => {}
    }
    name_character(name)?;
    let normalised: String = name.nfkc().collect();
    if normalised.len() > MAX_NAME_BYTES {
        return Err(InvalidArgument::NameTooLong(normalised.len()));
    }
    name_character(&normalised)?;
    name_spacing(&normalised)?;
    if let Some(mark) = normalised.chars().next().filter(|c| {
        matches!(
            c.general_category(),
            GeneralCategory::NonspacingMark
                | GeneralCategory::SpacingMark
                | GeneralCategory::EnclosingMark
        )
    }) {
        return Err(InvalidArgument::NameLeadingMark(u32::from(mark)));
    }
    name_scripts(&normalised)?;
    Ok(normalised)
}

/// Checks a chat text: 1..=256 bytes, no control or bidirectional formatting character and
/// no line or paragraph separator. Chat is otherwise passed on as sent (emoji sequences need
/// their zero-width joiners).
pub fn validate_chat(text: &str) -> Result<(), InvalidArgument> {
    match text.len() {
        0 => return Err(InvalidArgument::EmptyChat),
        n if n > MAX_CHAT_BYTES => return Err(InvalidArgument::ChatTooLong(n)),
        _ => {}
    }
    for c in text.chars() {
        if forbidden(c) {
            return Err(InvalidArgument::ChatCharacter(u32::from(c)));
        }
        if separator(c) {
            return Err(InvalidArgument::ChatSeparator(u32::from(c)));
        }
    }
    Ok(())
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

    fn ok(name: &str) -> Result<String, InvalidArgument> {
        Ok(name.to_string())
    }

    #[test]
    fn name_limits_count_bytes_not_chars() {
        assert_eq!(validate_name(""), Err(InvalidArgument::EmptyName));
        assert_eq!(validate_name(&"a".repeat(32)), ok(&"a".repeat(32)));
        assert_eq!(validate_name(&"a".repeat(33)), Err(InvalidArgument::NameTooLong(33)));
        // Eleven three-byte characters: 33 bytes.
        assert_eq!(validate_name(&"€".repeat(11)), Err(InvalidArgument::NameTooLong(33)));
    }

    #[test]
    fn the_32_byte_limit_is_counted_after_normalisation() {
        // Thirty-two fullwidth letters are 96 bytes as sent and 32 once normalised.
        let wide = "Ａ".repeat(32);
        assert_eq!(wide.len(), 96);
        assert_eq!(validate_name(&wide), ok(&"A".repeat(32)));
        assert_eq!(validate_name(&"Ａ".repeat(33)), Err(InvalidArgument::NameTooLong(33)));
        // Thirty-two mathematical bold A (four bytes each) are the worst case: 128 bytes.
        assert_eq!(validate_name(&"\u{1D400}".repeat(32)), ok(&"A".repeat(32)));
        assert_eq!(validate_name(&"\u{1D400}".repeat(33)), Err(InvalidArgument::NameTooLong(132)));
        // One ligature that normalises to 33 bytes: short as sent, too long as stored.
        assert_eq!(validate_name("\u{FDFA}"), Err(InvalidArgument::NameTooLong(33)));
    }

    #[test]
    fn names_are_normalised_to_nfkc() {
        assert_eq!(validate_name("ＡＢＣ"), ok("ABC"));
        assert_eq!(validate_name("\u{1D41A}nn"), ok("ann"), "mathematical bold a");
        assert_eq!(validate_name("ﬁsh"), ok("fish"), "a ligature");
        // A decomposed "ë" is composed; so the two spellings are one name.
        assert_eq!(validate_name("Zoe\u{308}"), ok("Zoë"));
        // A no-break space or an ideographic space is an ordinary space once normalised.
        assert_eq!(validate_name("Ann\u{A0}Lee"), ok("Ann Lee"));
        assert_eq!(validate_name("Ann\u{3000}Lee"), ok("Ann Lee"));
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
        assert_eq!(validate_name("Zoë 张 ✨"), ok("Zoë 张 ✨"));
        assert_eq!(validate_name("שלום"), ok("שלום"));
        assert_eq!(validate_name("مرحبا 2"), ok("مرحبا 2"));
        assert_eq!(validate_name("Ἀθηνᾶ"), ok("Ἀθηνᾶ"));
        assert_eq!(validate_chat("שלום, مرحبا — hello 👋"), Ok(()));
        assert_eq!(validate_chat("a family: 👨\u{200D}👩\u{200D}👧"), Ok(()), "chat keeps ZWJ");
    }

    #[test]
    fn zero_width_and_invisible_characters_are_refused_in_names() {
        for (name, code) in [
            ("an\u{200B}n", 0x200B),
            ("an\u{200C}n", 0x200C),
            ("an\u{200D}n", 0x200D),
            ("ann\u{2060}", 0x2060),
            ("\u{FEFF}ann", 0xFEFF),
            ("an\u{AD}n", 0xAD),
            ("ann\u{FE0F}", 0xFE0F),
            ("ann\u{E0041}", 0xE0041),
            ("ann\u{180E}", 0x180E),
            ("ann\u{34F}", 0x34F),
        ] {
            assert_eq!(validate_name(name), Err(InvalidArgument::NameInvisible(code)), "{name:?}");
        }
    }

    #[test]
    fn blank_fillers_are_refused_in_names() {
        for code in [0x3164, 0x115F, 0x1160, 0xFFA0, 0x2800] {
            let c = char::from_u32(code).expect("a char");
            let alone = c.to_string();
            assert_eq!(validate_name(&alone), Err(InvalidArgument::NameInvisible(code)));
            let inside = format!("ann{c}");
            assert_eq!(validate_name(&inside), Err(InvalidArgument::NameInvisible(code)));
        }
    }

    #[test]
    fn line_and_paragraph_separators_are_refused_in_names_and_chat() {
        assert_eq!(validate_name("ann\u{2028}"), Err(InvalidArgument::NameSeparator(0x2028)));
        assert_eq!(validate_name("a\u{2029}nn"), Err(InvalidArgument::NameSeparator(0x2029)));
        let fake = "gg\u{2028}[server] ann was banned";
        assert_eq!(validate_chat(fake), Err(InvalidArgument::ChatSeparator(0x2028)));
        assert_eq!(validate_chat("\u{2029}hi"), Err(InvalidArgument::ChatSeparator(0x2029)));
    }

    #[test]
    fn spaces_are_single_and_inside() {
        assert_eq!(validate_name("Ann Lee"), ok("Ann Lee"));
        for name in [" ann", "ann ", "ann  lee", "ann\u{1680}lee", " ", "ann\u{3000}"] {
            assert_eq!(validate_name(name), Err(InvalidArgument::NameSpacing), "{name:?}");
        }
        let mark = validate_name("\u{301}ann");
        assert_eq!(mark, Err(InvalidArgument::NameLeadingMark(0x301)));
    }

    #[test]
    fn private_use_and_unassigned_characters_are_refused_in_names() {
        assert_eq!(validate_name("ann\u{E000}"), Err(InvalidArgument::NameUnassigned(0xE000)));
        assert_eq!(validate_name("ann\u{FFFF}"), Err(InvalidArgument::NameUnassigned(0xFFFF)));
        assert_eq!(validate_name("ann\u{10FFFD}"), Err(InvalidArgument::NameUnassigned(0x10FFFD)));
    }

    #[test]
    fn a_name_mixing_latin_with_look_alike_scripts_is_refused() {
        let mixed = |scripts: &str| Err(InvalidArgument::NameScripts(scripts.to_string()));
        // "pаypal" with a Cyrillic "а"; "Jοhn" with a Greek omicron.
        assert_eq!(validate_name("p\u{430}ypal"), mixed("Latin and Cyrillic"));
        assert_eq!(validate_name("J\u{3BF}hn"), mixed("Latin and Greek"));
        assert_eq!(validate_name("\u{430}\u{431} 张"), mixed("Cyrillic and Han"));
        // Whole names of one script pass, digits and punctuation with any script.
        assert_eq!(validate_name("Иван_99"), ok("Иван_99"));
        // The CJK mixes UTS #39 allows: Japanese, Chinese with Bopomofo, Korean, with Latin.
        assert_eq!(validate_name("Taro 太郎 たろう タロウ"), ok("Taro 太郎 たろう タロウ"));
        assert_eq!(validate_name("Kim 김 金"), ok("Kim 김 金"));
        assert_eq!(validate_name("ㄅ 中 A"), ok("ㄅ 中 A"));
        assert_eq!(validate_name("김 たろう"), mixed("Hangul and Hiragana"));
    }

    #[test]
    fn a_normalised_name_is_its_own_normal_form() {
        for name in ["ＡＢＣ", "Zoe\u{308}", "ﬁsh", "Ann\u{A0}Lee", "Taro 太郎"] {
            let once = validate_name(name).expect("valid");
            assert_eq!(validate_name(&once), Ok(once.clone()), "{name:?}");
        }
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
