//! The small values of the scenario format: tokens, positions, directions, times, texts
//! and the `world` settings.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context as _};
use meridian_world::{Direction, PlayerId, Position, WorldConfig};

use super::Labels;

pub(super) fn parse_config(tokens: &[String]) -> anyhow::Result<WorldConfig> {
    let mut config = WorldConfig::default();
    for token in tokens {
        let (key, value) = token.split_once('=').context("world settings are key=value")?;
        let value: u32 = value.parse()?;
        match key {
            "width" => config.width = value,
            "height" => config.height = value,
            "view" => config.view_range = value,
            "rate" => config.move_rate = value,
            _ => bail!("unknown world setting {key:?}"),
        }
    }
    Ok(config)
}

pub(super) fn parse_set(
    labels: &mut Labels,
    tokens: &[String],
) -> anyhow::Result<BTreeSet<PlayerId>> {
    tokens.iter().map(|token| labels.id(token)).collect()
}

pub(super) fn parse_position(token: &str) -> anyhow::Result<Position> {
    let (x, y) = token.split_once(',').context("a position is x,y")?;
    Ok(Position::new(x.parse()?, y.parse()?))
}

pub(super) fn parse_direction(token: &str) -> anyhow::Result<Direction> {
    Ok(match token {
        "up" => Direction::Up,
        "down" => Direction::Down,
        "left" => Direction::Left,
        "right" => Direction::Right,
        _ => bail!("unknown direction {token:?}"),
    })
}

/// Seconds with up to nine decimals, parsed exactly: `0.05` must be 50 ms, not 49.999... ms.
pub(super) fn parse_seconds(token: &str) -> anyhow::Result<Duration> {
    let (whole, fraction) = token.split_once('.').unwrap_or((token, ""));
    ensure!(fraction.len() <= 9, "at most nine decimals in {token:?}");
    let nanos = if fraction.is_empty() { 0 } else { format!("{fraction:0<9}").parse()? };
    Ok(Duration::new(whole.parse()?, nanos))
}

pub(super) fn unquote(token: &str) -> anyhow::Result<&str> {
    token
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .ok_or_else(|| anyhow!("expected a quoted text, got {token}"))
}

/// Splits on whitespace, keeping a "quoted text" (quotes included) as one token, and drops
/// a `#` comment that is not inside quotes.
pub(super) fn tokenize(raw: &str) -> anyhow::Result<Vec<String>> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in raw.chars() {
        match c {
            '"' => {
                current.push(c);
                quoted = !quoted;
            }
            '#' if !quoted => break,
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    ensure!(!quoted, "unterminated quote");
    if !current.is_empty() {
        tokens.push(current);
    }
    Ok(tokens)
}
