//! The command line and the validated run configuration it becomes.
//!
//! Everything is parsed and checked here, once, so the bot and stats code only ever see a
//! `Config` that makes sense; a bad command line exits non-zero with every problem listed.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use meridian_protocol::MAX_NAME_BYTES;

use crate::ramp::RampConfig;

/// Meridian's stress-test client: connects bots at a fixed rate, moves them on an open-loop
/// schedule and measures the delay until each move's own `Moved` ack comes back.
#[derive(Debug, Parser)]
#[command(name = "loadtest", version)]
pub struct Cli {
    /// Gateway (or single server) address to connect the bots to, HOST:PORT.
    #[arg(long, env = "MERIDIAN_LOADTEST_ADDR")]
    pub addr: String,

    /// Gateways to resume on after the gateway says `SHUTTING_DOWN` (a rolling restart),
    /// HOST:PORT, comma-separated: a bot reconnects to the next address after the one it
    /// was on (in turn, `--addr` first) and sends `Resume` with its token, as the SDKs do.
    /// None (the default): a bot whose gateway stops counts as disconnected.
    #[arg(long, value_delimiter = ',', env = "MERIDIAN_LOADTEST_RESUME_ADDR")]
    pub resume_addr: Vec<String>,

    /// Number of bots to connect.
    #[arg(long, env = "MERIDIAN_LOADTEST_BOTS")]
    pub bots: u32,

    /// How long bots send moves, from the moment the first bot starts connecting.
    #[arg(long, default_value = "30s", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_DURATION")]
    pub duration: Duration,

    /// Interval between two moves of one bot.
    #[arg(long, default_value = "1s", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_MOVE_INTERVAL")]
    pub move_interval: Duration,

    /// Interval between two bot connection attempts (the paper's 1 ms).
    #[arg(long, default_value = "1ms", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_CONNECT_INTERVAL")]
    pub connect_interval: Duration,

    /// Also write the JSON summary to this file.
    #[arg(long, env = "MERIDIAN_LOADTEST_JSON")]
    pub json: Option<std::path::PathBuf>,

    /// Seed for every random choice (spawn cell, move phase, directions).
    #[arg(long, default_value_t = 1, env = "MERIDIAN_LOADTEST_SEED")]
    pub seed: u64,

    /// Spawn bots uniformly in the inclusive cell rectangle X0,Y0,X1,Y1 (dev-mode servers only).
    #[arg(long, env = "MERIDIAN_LOADTEST_SPAWN_AREA")]
    pub spawn_area: Option<SpawnArea>,

    /// Battle mode: bots spawn in --spawn-area and stay there, turning back at its edge (a
    /// step that would leave it goes the opposite way). A 20x20 area puts every bot in
    /// sight of every other.
    #[arg(long, requires = "spawn_area", env = "MERIDIAN_LOADTEST_BATTLE")]
    pub battle: bool,

    /// The crowd disperses this long after the run started: `--disperse-share` of the bots
    /// (spread evenly over the bots' indices) stop moving, wait for their answers and log
    /// out; the rest go on. Measures how fast an overloaded
    /// cluster comes back once a battle thins out.
    #[arg(long, value_parser = parse_duration, env = "MERIDIAN_LOADTEST_DISPERSE_AFTER")]
    pub disperse_after: Option<Duration>,

    /// Also report the delays of the acks received from this long after the start on
    /// (`delay_steady_ms`): a battle's steady state, once its crowd has logged in and the
    /// balancer has made its first adjustment. Counted whole seconds of the progress lines.
    #[arg(long, value_parser = parse_duration, env = "MERIDIAN_LOADTEST_WARMUP")]
    pub warmup: Option<Duration>,

    /// The share of bots that leave at `--disperse-after`, 0 to 1.
    #[arg(long, default_value_t = 0.75, requires = "disperse_after",
          value_parser = parse_share, env = "MERIDIAN_LOADTEST_DISPERSE_SHARE")]
    pub disperse_share: f64,

    /// Spread bots over K loopback source addresses 127.0.0.1 .. 127.0.0.K (beyond ~14k
    /// sockets one source address runs out of ephemeral ports). Loopback targets only.
    #[arg(long, default_value_t = 1, env = "MERIDIAN_LOADTEST_SOURCE_IPS")]
    pub source_ips: u32,

    /// Shard borders to classify moves by: a move whose ack lands across one of these
    /// columns (X) or rows (Y) counts as a crossing; the summary then reports the delay of
    /// crossing and of non-crossing moves apart. Repeatable, e.g. --border-x 200 --border-y 200.
    #[arg(long)]
    pub border_x: Vec<u32>,
    #[arg(long)]
    pub border_y: Vec<u32>,

    /// Also send this many actions per second per bot, on their own open-loop schedule:
    /// the example game's ATTACK (kind 1) aimed at the nearest wolf (entity kind 1) in
    /// sight, or at no one (target 0, which the game answers REJECTED). 0: no actions.
    #[arg(long, default_value_t = 0.0, env = "MERIDIAN_LOADTEST_ACTIONS_PER_SECOND")]
    pub actions_per_second: f64,

    /// Bot names are PREFIX-<index>.
    #[arg(long, default_value = "bot", env = "MERIDIAN_LOADTEST_NAME_PREFIX")]
    pub name_prefix: String,

    /// After --duration, how long to wait for outstanding acks before counting them lost.
    #[arg(long, default_value = "3s", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_DRAIN")]
    pub drain: Duration,

    /// Also write a self-contained HTML report of this run (plots inline, no network).
    #[arg(long, env = "MERIDIAN_LOADTEST_HTML")]
    pub html: Option<std::path::PathBuf>,

    /// The run's name in reports.
    #[arg(long, default_value = "run", env = "MERIDIAN_LOADTEST_LABEL")]
    pub label: String,

    /// Ramp mode: start with --ramp-start bots, add --ramp-step every --ramp-step-duration
    /// until a step's p99 own-move delay passes --max-p99 (or acks fall behind, or bots
    /// fail), and report the largest passing step. --bots is the most it tries, --duration
    /// the longest it runs.
    #[arg(long, env = "MERIDIAN_LOADTEST_RAMP")]
    pub ramp: bool,

    /// Ramp mode: bots in the first step (default: --ramp-step).
    #[arg(long, env = "MERIDIAN_LOADTEST_RAMP_START")]
    pub ramp_start: Option<u32>,

    /// Ramp mode: bots added per step.
    #[arg(long, default_value_t = 500, env = "MERIDIAN_LOADTEST_RAMP_STEP")]
    pub ramp_step: u32,

    /// Ramp mode: how long each step is measured once its bots are connected.
    #[arg(long, default_value = "5s", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_RAMP_STEP_DURATION")]
    pub ramp_step_duration: Duration,

    /// Ramp mode: a step passes only if its p99 own-move delay is at most this.
    #[arg(long, default_value = "50ms", value_parser = parse_duration,
          env = "MERIDIAN_LOADTEST_MAX_P99")]
    pub max_p99: Duration,
    /// How bots reach the gateway: its TCP game port, its QUIC front (UDP; --addr is then
    /// the QUIC address, and --insecure or --ca is required), or its WebSocket front
    /// (`ws`: --addr is the gateway's --ws address; bots open ws://ADDR/).
    #[arg(long, value_enum, default_value = "tcp", env = "MERIDIAN_LOADTEST_TRANSPORT")]
    pub transport: TransportArg,

    /// QUIC: accept any server certificate (a dev cluster's self-signed one).
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,

    /// QUIC: trust the certificates in this PEM file.
    #[arg(long, env = "MERIDIAN_LOADTEST_CA")]
    pub ca: Option<std::path::PathBuf>,

    /// QUIC: the server name to verify the certificate against (the dev certificate's is
    /// localhost).
    #[arg(long, default_value = "localhost", env = "MERIDIAN_LOADTEST_SERVER_NAME")]
    pub server_name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    Tcp,
    Quic,
    Ws,
}

/// The transport, validated: QUIC always knows what to trust.
#[derive(Debug, Clone)]
pub enum Transport {
    Tcp,
    WebSocket,
    Quic { trust: crate::quic::Trust, server_name: String },
}

/// The most actions per second per bot (the gateway's default limit is 10 a second).
const MAX_ACTIONS_PER_SECOND: f64 = 1000.0;

/// The longest any duration flag may be; keeps every deadline computable.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// An inclusive rectangle of cells, `x0..=x1` by `y0..=y1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnArea {
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

impl FromStr for SpawnArea {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        let [x0, y0, x1, y1] = parts.as_slice() else {
            return Err(format!("expected X0,Y0,X1,Y1, got {text:?}"));
        };
        let cell =
            |s: &str| s.parse::<u32>().map_err(|e| format!("bad cell coordinate {s:?}: {e}"));
        let area = SpawnArea { x0: cell(x0)?, y0: cell(y0)?, x1: cell(x1)?, y1: cell(y1)? };
        if area.x0 > area.x1 || area.y0 > area.y1 {
            return Err(format!("empty spawn area {text:?}: need X0 <= X1 and Y0 <= Y1"));
        }
        Ok(area)
    }
}

impl fmt::Display for SpawnArea {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{},{}", self.x0, self.y0, self.x1, self.y1)
    }
}

/// Parses `250us`, `500ms`, `1s`, `2m`, `1h`: a whole number and a unit, nothing else.
/// When a crowd disperses and which share of it leaves (`--disperse-after`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disperse {
    pub after: Duration,
    /// 0 to 1.
    pub share: f64,
}

impl Disperse {
    /// Whether bot `index` is among those that leave: the share is spread evenly, so the
    /// first n bots send `floor(n * share)` away whatever n is.
    pub fn leaves(&self, index: u32) -> bool {
        let leaving_among = |n: u32| (f64::from(n) * self.share).floor();
        leaving_among(index + 1) > leaving_among(index)
    }
}

fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text.parse().map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("{share} is not between 0 and 1"))
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("duration {text:?} must start with a whole number, e.g. 500ms"));
    }
    let value: u64 = number.parse().map_err(|e| format!("duration {text:?}: {e}"))?;
    let micros_per_unit: u64 = match unit {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "" => return Err(format!("duration {text:?} needs a unit: us, ms, s, m or h")),
        other => return Err(format!("duration {text:?} has unknown unit {other:?}")),
    };
    let micros = value
        .checked_mul(micros_per_unit)
        .ok_or_else(|| format!("duration {text:?} is too large"))?;
    Ok(Duration::from_micros(micros))
}

/// The run as validated: every field here is known to make sense together.
#[derive(Debug, Clone)]
pub struct Config {
    pub addr: String,
    pub resume_addr: Vec<String>,
    pub bots: u32,
    pub duration: Duration,
    pub move_interval: Duration,
    /// `--actions-per-second` as the interval between two actions of one bot; `None`: no
    /// actions (the default, today's behaviour).
    pub action_interval: Option<Duration>,
    pub connect_interval: Duration,
    pub json: Option<std::path::PathBuf>,
    pub seed: u64,
    pub spawn_area: Option<SpawnArea>,
    /// `--battle`: bots stay inside the spawn area.
    pub battle: bool,
    /// `--disperse-after` and `--disperse-share`.
    pub disperse: Option<Disperse>,
    pub warmup: Option<Duration>,
    pub border_x: Vec<u32>,
    pub border_y: Vec<u32>,
    pub source_ips: u32,
    pub name_prefix: String,
    pub drain: Duration,
    pub html: Option<std::path::PathBuf>,
    pub label: String,
    pub ramp: Option<RampConfig>,
    pub transport: Transport,
}

impl Config {
    /// Checks the command line as a whole and lists every problem, not just the first.
    pub fn from_cli(cli: Cli) -> anyhow::Result<Config> {
        let mut problems = Vec::new();
        if cli.bots == 0 {
            problems.push("--bots must be at least 1".to_owned());
        }
        if cli.duration.is_zero() {
            problems.push("--duration must be longer than zero".to_owned());
        }
        if cli.move_interval.is_zero() {
            problems.push("--move-interval must be longer than zero".to_owned());
        }
        for (flag, value) in [
            ("--duration", cli.duration),
            ("--move-interval", cli.move_interval),
            ("--connect-interval", cli.connect_interval),
            ("--drain", cli.drain),
        ] {
            if value > MAX_DURATION {
                problems.push(format!("{flag} must be at most 7 days, got {value:?}"));
            }
        }
        let rate = cli.actions_per_second;
        if !(0.0..=MAX_ACTIONS_PER_SECOND).contains(&rate) {
            problems.push(format!(
                "--actions-per-second must be 0..={MAX_ACTIONS_PER_SECOND}, got {rate}"
            ));
        }
        if cli.source_ips == 0 || cli.source_ips > 65_536 {
            problems.push(format!("--source-ips must be 1..=65536, got {}", cli.source_ips));
        }
        if !cli.addr.contains(':') {
            problems.push(format!("--addr must be HOST:PORT, got {:?}", cli.addr));
        }
        for addr in cli.resume_addr.iter().filter(|a| !a.contains(':')) {
            problems.push(format!("--resume-addr must be HOST:PORT, got {addr:?}"));
        }
        let longest_name = bot_name(&cli.name_prefix, cli.bots.saturating_sub(1));
        if cli.name_prefix.is_empty() {
            problems.push("--name-prefix must not be empty".to_owned());
        } else if longest_name.len() > MAX_NAME_BYTES {
            problems.push(format!(
                "--name-prefix is too long: bot name {longest_name:?} is over {MAX_NAME_BYTES} bytes"
            ));
        }
        let ramp_start = cli.ramp_start.unwrap_or(cli.ramp_step);
        if cli.ramp {
            if cli.ramp_step == 0 {
                problems.push("--ramp-step must be at least 1".to_owned());
            }
            if ramp_start == 0 {
                problems.push("--ramp-start must be at least 1".to_owned());
            }
            if cli.ramp_step_duration.is_zero() || cli.ramp_step_duration > MAX_DURATION {
                problems.push("--ramp-step-duration must be between 1us and 7 days".to_owned());
            }
            if cli.max_p99.is_zero() {
                problems.push("--max-p99 must be longer than zero".to_owned());
            }
        } else if cli.ramp_start.is_some() {
            problems.push("--ramp-start only makes sense with --ramp".to_owned());
        }
        let transport = match cli.transport {
            TransportArg::Tcp | TransportArg::Ws => {
                if cli.insecure || cli.ca.is_some() {
                    problems.push("--insecure and --ca are for --transport quic".to_owned());
                }
                if cli.transport == TransportArg::Ws {
                    Transport::WebSocket
                } else {
                    Transport::Tcp
                }
            }
            TransportArg::Quic => {
                let trust = match (cli.insecure, cli.ca) {
                    (true, _) => crate::quic::Trust::Insecure,
                    (false, Some(path)) => crate::quic::Trust::Ca(path),
                    (false, None) => {
                        problems.push(
                            "--transport quic needs --ca FILE or --insecure (dev certificates)"
                                .to_owned(),
                        );
                        crate::quic::Trust::Insecure
                    }
                };
                Transport::Quic { trust, server_name: cli.server_name }
            }
        };
        if !problems.is_empty() {
            anyhow::bail!("invalid command line:\n  - {}", problems.join("\n  - "));
        }
        Ok(Config {
            addr: cli.addr,
            resume_addr: cli.resume_addr,
            bots: cli.bots,
            duration: cli.duration,
            move_interval: cli.move_interval,
            action_interval: (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate)),
            connect_interval: cli.connect_interval,
            json: cli.json,
            seed: cli.seed,
            spawn_area: cli.spawn_area,
            battle: cli.battle,
            disperse: cli.disperse_after.map(|after| Disperse { after, share: cli.disperse_share }),
            warmup: cli.warmup,
            border_x: cli.border_x,
            border_y: cli.border_y,
            source_ips: cli.source_ips,
            name_prefix: cli.name_prefix,
            drain: cli.drain,
            html: cli.html,
            label: cli.label,
            ramp: cli.ramp.then_some(RampConfig {
                start: ramp_start,
                step: cli.ramp_step,
                step_duration: cli.ramp_step_duration,
                max_p99: cli.max_p99,
                max_bots: cli.bots,
            }),
            transport,
        })
    }
}

/// The login name of bot `index`.
pub fn bot_name(prefix: &str, index: u32) -> String {
    format!("{prefix}-{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_dispersal_sends_its_share_of_every_hundred_bots_away() {
        let disperse = Disperse { after: Duration::from_secs(10), share: 0.75 };
        let leaving = |n| (0..n).filter(|&i| disperse.leaves(i)).count();
        assert_eq!((leaving(1000), leaving(8), leaving(4), leaving(1)), (750, 6, 3, 0));
        let half = Disperse { share: 0.5, ..disperse };
        assert_eq!((0..6).map(|i| half.leaves(i)).collect::<Vec<_>>(), [false, true].repeat(3));
        let everyone = Disperse { share: 1.0, ..disperse };
        assert!((0..100).all(|i| everyone.leaves(i)));
        let nobody = Disperse { share: 0.0, ..disperse };
        assert!((0..100).all(|i| !nobody.leaves(i)));
        assert_eq!(parse_share("1"), Ok(1.0));
        assert!(parse_share("1.5").is_err() && parse_share("-0.1").is_err());
        assert!(parse_share("most").is_err());
    }

    #[test]
    fn durations_without_number_or_unit_are_refused() {
        for bad in ["", "s", "10", "1.5s", "-1s", "10 s", "3d", "1sec", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_duration("18446744073709551615h").unwrap_err().contains("too large"));
    }

    #[test]
    fn spawn_area_parses_and_rejects_empty_rectangles() {
        let area: SpawnArea = "10, 20,30,40".parse().unwrap();
        assert_eq!(area, SpawnArea { x0: 10, y0: 20, x1: 30, y1: 40 });
        assert_eq!(area.to_string(), "10,20,30,40");
        assert!("5,5,5,5".parse::<SpawnArea>().is_ok(), "a single cell is an area");
        assert!("30,0,10,5".parse::<SpawnArea>().is_err());
        assert!("1,2,3".parse::<SpawnArea>().is_err());
        assert!("1,2,3,x".parse::<SpawnArea>().is_err());
    }

    #[test]
    fn config_lists_every_problem() {
        let cli = Cli::try_parse_from([
            "loadtest",
            "--addr",
            "nowhere",
            "--bots",
            "0",
            "--move-interval",
            "0s",
            "--name-prefix",
            "a-very-long-bot-name-prefix-indeed",
            "--drain",
            "8000h",
        ])
        .unwrap();
        let message = Config::from_cli(cli).unwrap_err().to_string();
        for expected in ["--bots", "--move-interval", "--addr", "--name-prefix", "--drain"] {
            assert!(message.contains(expected), "{expected} missing from: {message}");
        }
    }

    #[test]
    fn ramp_flags_become_a_ramp_config_and_are_checked() {
        let cli = Cli::try_parse_from([
            "loadtest",
            "--addr",
            "127.0.0.1:7000",
            "--bots",
            "5000",
            "--ramp",
            "--ramp-step",
            "250",
            "--ramp-step-duration",
            "3s",
            "--max-p99",
            "20ms",
        ])
        .unwrap();
        let ramp = Config::from_cli(cli).unwrap().ramp.expect("--ramp given");
        assert_eq!(ramp.start, 250, "the first step defaults to one step");
        assert_eq!(ramp.step, 250);
        assert_eq!(ramp.max_bots, 5000);
        assert_eq!(ramp.step_duration, Duration::from_secs(3));
        assert_eq!(ramp.max_p99, Duration::from_millis(20));

        let cli = Cli::try_parse_from([
            "loadtest",
            "--addr",
            "127.0.0.1:7000",
            "--bots",
            "10",
            "--ramp",
            "--ramp-step",
            "0",
            "--max-p99",
            "0ms",
        ])
        .unwrap();
        let message = Config::from_cli(cli).unwrap_err().to_string();
        for expected in ["--ramp-step", "--ramp-start", "--max-p99"] {
            assert!(message.contains(expected), "{expected} missing from: {message}");
        }
        let cli = Cli::try_parse_from([
            "loadtest",
            "--addr",
            "127.0.0.1:7000",
            "--bots",
            "10",
            "--ramp-start",
            "5",
        ])
        .unwrap();
        assert!(Config::from_cli(cli).unwrap_err().to_string().contains("only makes sense"));
    }

    #[test]
    fn quic_needs_something_to_trust() {
        let config = |extra: &[&str]| {
            let base = ["loadtest", "--addr", "127.0.0.1:7777", "--bots", "1"];
            Config::from_cli(Cli::try_parse_from(base.iter().chain(extra)).unwrap())
        };
        let message = config(&["--transport", "quic"]).unwrap_err().to_string();
        assert!(message.contains("--ca FILE or --insecure"), "{message}");
        let quic = config(&["--transport", "quic", "--insecure"]).unwrap();
        assert!(matches!(quic.transport, Transport::Quic { .. }));
        assert!(config(&["--insecure"]).is_err(), "--insecure without QUIC is a mistake");
    }

    #[test]
    fn websocket_is_a_transport_without_certificates() {
        let base = ["loadtest", "--addr", "127.0.0.1:7778", "--bots", "1", "--transport", "ws"];
        let config = |extra: &[&str]| {
            Config::from_cli(Cli::try_parse_from(base.iter().chain(extra)).unwrap())
        };
        assert!(matches!(config(&[]).unwrap().transport, Transport::WebSocket));
        let message = config(&["--insecure"]).unwrap_err().to_string();
        assert!(message.contains("--transport quic"), "{message}");
    }

    #[test]
    fn defaults_match_the_paper() {
        let cli =
            Cli::try_parse_from(["loadtest", "--addr", "127.0.0.1:7000", "--bots", "10"]).unwrap();
        let config = Config::from_cli(cli).unwrap();
        assert_eq!(config.connect_interval, Duration::from_millis(1));
        assert_eq!(config.move_interval, Duration::from_secs(1));
        assert_eq!(config.duration, Duration::from_secs(30));
        assert_eq!(config.drain, Duration::from_secs(3));
        assert_eq!(config.source_ips, 1);
        assert_eq!(config.action_interval, None, "no actions unless asked");
        assert_eq!(bot_name(&config.name_prefix, 7), "bot-7");
    }

    #[test]
    fn actions_per_second_becomes_an_interval_and_is_checked() {
        let config = |rate: &str| {
            let flag = format!("--actions-per-second={rate}");
            let args = ["loadtest", "--addr", "127.0.0.1:7000", "--bots", "1", flag.as_str()];
            Config::from_cli(Cli::try_parse_from(args).unwrap())
        };
        assert_eq!(config("4").unwrap().action_interval, Some(Duration::from_millis(250)));
        assert_eq!(config("0.5").unwrap().action_interval, Some(Duration::from_secs(2)));
        assert_eq!(config("0").unwrap().action_interval, None);
        for bad in ["-1", "NaN", "inf", "1001"] {
            let message = config(bad).unwrap_err().to_string();
            assert!(message.contains("--actions-per-second"), "{bad}: {message}");
        }
    }
}
