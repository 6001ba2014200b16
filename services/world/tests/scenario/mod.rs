//! The scenario format: a world's rules written as data. One command per line; the indented
//! lines under a command are exactly what each client receives from it, in order per
//! subject (the order between different subjects in one event is free). A client that is
//! not listed must receive nothing.
//!
//! ```text
//! world width=60 height=60 view=20 rate=20   # optional, before any other command
//! login a 10,10            # players are named by labels; ids are given in order of appearance
//! login b 30,10
//!   a: entered b 30,10
//!   b: entered a 10,10
//! time 0.5                 # the clock, in seconds, for the commands that follow
//! move a right t=7 x2      # t= is the client time (default 1), xN repeats the command
//!   a: moved a 11,10 t=7
//!   ...
//! move a up => rate-limited   # the command must fail with this error and emit nothing
//! chat b "hi"   logout a   ghost g 12,10   remove-ghost g   ghost-chat g "hi"
//! promote g   demote a
//! sees a: b c              # checks: everyone a sees, the local players that see a cell,
//! observers 12,10: a       # a position (or `absent`), and the counts
//! at a 11,10
//! counts local=1 ghosts=0
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

mod lex;

use anyhow::{bail, ensure, Context as _};
use lex::{
    parse_config, parse_direction, parse_position, parse_seconds, parse_set, tokenize, unquote,
};
use meridian_world::{Direction, Envelope, Notification, PlayerId, Position, WorldConfig};

pub enum Command {
    Time(Duration),
    Login(PlayerId, Position),
    Move { who: PlayerId, direction: Direction, client_time: u64 },
    Chat(PlayerId, Arc<str>),
    Logout(PlayerId),
    Ghost(PlayerId, Position),
    RemoveGhost(PlayerId),
    GhostChat(PlayerId, Arc<str>),
    Promote(PlayerId),
    Demote(PlayerId),
    Sees(PlayerId, BTreeSet<PlayerId>),
    Observers(Position, BTreeSet<PlayerId>),
    At(PlayerId, Option<Position>),
    Counts { local: usize, ghosts: usize },
}

pub struct Step {
    pub line: usize,
    pub text: String,
    pub command: Command,
    pub repeat: u32,
    /// The kebab-case name of the error the command must fail with.
    pub error: Option<String>,
    /// What each recipient must receive, in order, over all repetitions.
    pub expected: BTreeMap<PlayerId, Vec<Notification>>,
}

pub struct Scenario {
    pub config: WorldConfig,
    pub steps: Vec<Step>,
    pub labels: Labels,
}

/// Player labels and the ids they stand for (1, 2, 3... in order of first appearance).
#[derive(Default)]
pub struct Labels {
    ids: BTreeMap<String, PlayerId>,
    names: BTreeMap<PlayerId, Arc<str>>,
}

impl Labels {
    pub(super) fn id(&mut self, label: &str) -> anyhow::Result<PlayerId> {
        ensure!(
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad player label {label:?}"
        );
        if let Some(&id) = self.ids.get(label) {
            return Ok(id);
        }
        let id = PlayerId(self.ids.len() as u64 + 1);
        self.ids.insert(label.to_owned(), id);
        self.names.insert(id, Arc::from(label));
        Ok(id)
    }

    /// A player's name, which is its label.
    pub fn name(&self, id: PlayerId) -> Arc<str> {
        self.names.get(&id).cloned().unwrap_or_else(|| Arc::from(format!("#{id}")))
    }

    pub fn render(&self, note: &Notification) -> String {
        match note {
            Notification::Entered { subject, position, name, .. } => {
                let extra = if **name == *self.name(*subject) {
                    String::new()
                } else {
                    format!(" name={name:?}")
                };
                format!("entered {} {},{}{extra}", self.name(*subject), position.x, position.y)
            }
            Notification::Moved { subject, position, client_time: 0 } => {
                format!("moved {} {},{}", self.name(*subject), position.x, position.y)
            }
            Notification::Moved { subject, position, client_time } => {
                format!(
                    "moved {} {},{} t={client_time}",
                    self.name(*subject),
                    position.x,
                    position.y
                )
            }
            Notification::Left { subject } => format!("left {}", self.name(*subject)),
            Notification::Chat { speaker, text } => {
                format!("chat {} {text:?}", self.name(*speaker))
            }
            Notification::StateChanged { subject, state } => {
                format!("state {} {:?}", self.name(*subject), String::from_utf8_lossy(state))
            }
            Notification::Event { source, kind, payload } => format!(
                "event {} {kind} {:?}",
                self.name(*source),
                String::from_utf8_lossy(payload)
            ),
        }
    }

    pub fn render_all(&self, by_recipient: &BTreeMap<PlayerId, Vec<Notification>>) -> String {
        let mut text = String::new();
        for (to, notes) in by_recipient {
            for note in notes {
                text.push_str(&format!("  {}: {}\n", self.name(*to), self.render(note)));
            }
        }
        if text.is_empty() {
            text.push_str("  (nothing)\n");
        }
        text
    }
}

/// The subject a notification is about (the speaker, for chat).
pub fn subject_of(note: &Notification) -> PlayerId {
    match note {
        Notification::Entered { subject, .. }
        | Notification::Moved { subject, .. }
        | Notification::Left { subject }
        | Notification::StateChanged { subject, .. } => *subject,
        Notification::Chat { speaker, .. } => *speaker,
        Notification::Event { source, .. } => *source,
    }
}

/// Groups notifications by (recipient, subject), keeping their order. DESIGN.md fixes the
/// order per observer and per subject; across subjects within one event it is free, so
/// comparing in this form keeps scenarios independent of the sector scan order.
pub fn by_recipient_and_subject(
    by_recipient: &BTreeMap<PlayerId, Vec<Notification>>,
) -> BTreeMap<(PlayerId, PlayerId), Vec<Notification>> {
    let mut grouped: BTreeMap<(PlayerId, PlayerId), Vec<Notification>> = BTreeMap::new();
    for (to, notes) in by_recipient {
        for note in notes {
            grouped.entry((*to, subject_of(note))).or_default().push(note.clone());
        }
    }
    grouped
}

/// Groups envelopes by recipient, keeping each recipient's order.
pub fn by_recipient(envelopes: &[Envelope]) -> BTreeMap<PlayerId, Vec<Notification>> {
    let mut grouped: BTreeMap<PlayerId, Vec<Notification>> = BTreeMap::new();
    for envelope in envelopes {
        grouped.entry(envelope.to).or_default().push(envelope.note.clone());
    }
    grouped
}

pub fn parse(text: &str) -> anyhow::Result<Scenario> {
    let mut scenario =
        Scenario { config: WorldConfig::default(), steps: Vec::new(), labels: Labels::default() };
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        parse_line(&mut scenario, raw, line).with_context(|| format!("line {line}: {raw:?}"))?;
    }
    Ok(scenario)
}

fn parse_line(scenario: &mut Scenario, raw: &str, line: usize) -> anyhow::Result<()> {
    let tokens = tokenize(raw)?;
    let Some(first) = tokens.first() else {
        return Ok(());
    };
    let labels = &mut scenario.labels;
    if raw.starts_with(char::is_whitespace) {
        let recipient = first.strip_suffix(':').context("an expectation starts with `name:`")?;
        let to = labels.id(recipient)?;
        let note = parse_note(labels, &tokens[1..])?;
        let step = scenario.steps.last_mut().context("an expectation before any command")?;
        step.expected.entry(to).or_default().push(note);
        return Ok(());
    }
    if first == "world" {
        ensure!(scenario.steps.is_empty(), "`world` must come before any command");
        scenario.config = parse_config(&tokens[1..])?;
        return Ok(());
    }
    let (tokens, error) = match tokens.iter().position(|token| token == "=>") {
        Some(at) => {
            ensure!(at + 2 == tokens.len(), "`=>` is followed by exactly one error name");
            (&tokens[..at], Some(tokens[at + 1].clone()))
        }
        None => (&tokens[..], None),
    };
    let (tokens, repeat) = match tokens.last().and_then(|last| last.strip_prefix('x')) {
        Some(count) if count.parse::<u32>().is_ok() => {
            (&tokens[..tokens.len() - 1], count.parse()?)
        }
        _ => (tokens, 1),
    };
    let command = parse_command(labels, tokens)?;
    let text = raw.trim().to_owned();
    let expected = BTreeMap::new();
    scenario.steps.push(Step { line, text, command, repeat, error, expected });
    Ok(())
}

fn parse_command(labels: &mut Labels, tokens: &[String]) -> anyhow::Result<Command> {
    let args = &tokens[1..];
    let arity = |n: usize| -> anyhow::Result<()> {
        ensure!(args.len() == n, "`{}` takes {n} arguments", tokens[0]);
        Ok(())
    };
    let command = match tokens[0].as_str() {
        "time" => {
            arity(1)?;
            Command::Time(parse_seconds(&args[0])?)
        }
        "login" => {
            arity(2)?;
            Command::Login(labels.id(&args[0])?, parse_position(&args[1])?)
        }
        "move" => {
            ensure!(matches!(args.len(), 2 | 3), "`move` takes a player, a direction and t=");
            let client_time = match args.get(2) {
                Some(token) => {
                    token.strip_prefix("t=").context("expected t=<client time>")?.parse()?
                }
                None => 1,
            };
            Command::Move {
                who: labels.id(&args[0])?,
                direction: parse_direction(&args[1])?,
                client_time,
            }
        }
        "chat" => {
            arity(2)?;
            Command::Chat(labels.id(&args[0])?, Arc::from(unquote(&args[1])?))
        }
        "logout" => {
            arity(1)?;
            Command::Logout(labels.id(&args[0])?)
        }
        "ghost" => {
            arity(2)?;
            Command::Ghost(labels.id(&args[0])?, parse_position(&args[1])?)
        }
        "remove-ghost" => {
            arity(1)?;
            Command::RemoveGhost(labels.id(&args[0])?)
        }
        "ghost-chat" => {
            arity(2)?;
            Command::GhostChat(labels.id(&args[0])?, Arc::from(unquote(&args[1])?))
        }
        "promote" => {
            arity(1)?;
            Command::Promote(labels.id(&args[0])?)
        }
        "demote" => {
            arity(1)?;
            Command::Demote(labels.id(&args[0])?)
        }
        "sees" => {
            let who = args.first().and_then(|a| a.strip_suffix(':')).context("sees <name>: ...")?;
            Command::Sees(labels.id(who)?, parse_set(labels, &args[1..])?)
        }
        "observers" => {
            let at =
                args.first().and_then(|a| a.strip_suffix(':')).context("observers x,y: ...")?;
            Command::Observers(parse_position(at)?, parse_set(labels, &args[1..])?)
        }
        "at" => {
            arity(2)?;
            let position = if args[1] == "absent" { None } else { Some(parse_position(&args[1])?) };
            Command::At(labels.id(&args[0])?, position)
        }
        "counts" => {
            arity(2)?;
            let local = args[0].strip_prefix("local=").context("counts local=N ghosts=M")?;
            let ghosts = args[1].strip_prefix("ghosts=").context("counts local=N ghosts=M")?;
            Command::Counts { local: local.parse()?, ghosts: ghosts.parse()? }
        }
        other => bail!("unknown command {other:?}"),
    };
    Ok(command)
}

fn parse_note(labels: &mut Labels, tokens: &[String]) -> anyhow::Result<Notification> {
    let kind = tokens.first().context("an expectation names a notification")?;
    let args = &tokens[1..];
    let note = match (kind.as_str(), args.len()) {
        ("entered", 2) => {
            let subject = labels.id(&args[0])?;
            let position = parse_position(&args[1])?;
            let (kind, state) = (0, std::sync::Arc::from(&[][..]));
            Notification::Entered { subject, position, name: labels.name(subject), kind, state }
        }
        ("moved", 2 | 3) => {
            let client_time = match args.get(2) {
                Some(token) => {
                    token.strip_prefix("t=").context("expected t=<client time>")?.parse()?
                }
                None => 0,
            };
            let position = parse_position(&args[1])?;
            Notification::Moved { subject: labels.id(&args[0])?, position, client_time }
        }
        ("left", 1) => Notification::Left { subject: labels.id(&args[0])? },
        ("chat", 2) => Notification::Chat {
            speaker: labels.id(&args[0])?,
            text: Arc::from(unquote(&args[1])?),
        },
        _ => bail!("bad notification {tokens:?}"),
    };
    Ok(note)
}
