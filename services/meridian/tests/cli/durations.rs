//! One duration format everywhere: `250ms`, `30s`, `1m30s`, `2h`, a bare number as seconds.

use std::process::Command;
use std::time::Duration;

use crate::meridian_bin;

/// Parses `meridian <node> --id 1 <flag> <value>` as the binary does and returns the
/// flag's value, or clap's error message.
fn node_flag(node: &str, flag: &str, value: &str) -> Result<Duration, String> {
    let args = ["meridian", node, "--id", "1", flag, value];
    let matches = meridian::command().try_get_matches_from(args).map_err(|e| e.to_string())?;
    let (_, shard) = matches.subcommand().expect("a subcommand");
    let id = flag.trim_start_matches("--").replace('-', "_");
    Ok(*shard.get_one::<Duration>(&id).expect("the flag has a value"))
}

#[test]
fn every_duration_flag_takes_the_humane_format() {
    let cases = [
        ("--game-tick", "250ms", Duration::from_millis(250)),
        ("--resume-window", "30s", Duration::from_secs(30)),
        ("--drain-timeout", "1m30s", Duration::from_secs(90)),
        ("--save-interval", "2h", Duration::from_secs(7200)),
        ("--lease-ttl", "3s", Duration::from_secs(3)),
        ("--login-timeout", "1m", Duration::from_secs(60)),
        ("--idle-timeout", "1h1m1s", Duration::from_secs(3661)),
        // A bare number is seconds, as `--help` says: what these flags took before.
        ("--drain-timeout", "30", Duration::from_secs(30)),
    ];
    for (flag, value, expected) in cases {
        let node =
            if flag.contains("login") || flag.contains("idle") { "gateway" } else { "shard" };
        assert_eq!(node_flag(node, flag, value), Ok(expected), "{node} {flag} {value}");
    }
    let quic = node_flag("gateway", "--quic-keep-alive", "2500ms");
    assert_eq!(quic, Ok(Duration::from_millis(2500)));
    for bad in ["30x", "1m30", "ms", "1.5s", "s1", ""] {
        let said = node_flag("shard", "--drain-timeout", bad).expect_err(bad);
        assert!(
            said.contains("--drain-timeout") && said.contains(&format!("{bad:?}")),
            "{bad:?} is refused naming the flag and the value: {said}"
        );
    }
    let said = node_flag("shard", "--drain-timeout", "30x").expect_err("30x");
    assert!(said.contains("unknown unit \"x\" (ms, s, m, h)"), "{said}");
    let said = node_flag("shard", "--drain-timeout", "1m30").expect_err("1m30");
    assert!(said.contains("a unit is needed after each number"), "{said}");
}

/// Runs `meridian gateway` with `args` and `env`, expecting it to refuse its configuration
/// before it touches the network; returns what it said.
fn gateway_refuses(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(meridian_bin())
        .args(["gateway", "--id", "1", "--dev", "--listen", "127.0.0.1:0", "--quic", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .output()
        .expect("running meridian gateway");
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} {env:?} was taken: {said}");
    said
}

/// The QUIC timeouts' former millisecond flags and environment variables stand for the new
/// ones: 100 (ms) is refused as the 100ms it means, with the new flag's name.
#[test]
fn the_former_millisecond_flags_still_work() {
    let expected = "--quic-idle-timeout 100ms must be between 500ms and 10m";
    let said = gateway_refuses(&["--quic-idle-timeout", "100ms"], &[]);
    assert!(said.contains(expected), "the new flag: {said}");
    let said = gateway_refuses(&["--quic-idle-timeout-ms", "100"], &[]);
    assert!(said.contains(expected), "the old flag, in milliseconds: {said}");
    let said = gateway_refuses(&[], &[("MERIDIAN_QUIC_IDLE_TIMEOUT_MS", "100")]);
    assert!(said.contains(expected), "the old variable, in milliseconds: {said}");
    let said = gateway_refuses(&[], &[("MERIDIAN_QUIC_IDLE_TIMEOUT", "100ms")]);
    assert!(said.contains(expected), "the new variable: {said}");
    let said = gateway_refuses(&["--quic-keep-alive-ms", "6000"], &[]);
    assert!(said.contains("--quic-keep-alive 6s must be above 0 and at most half"), "{said}");
    let said =
        gateway_refuses(&["--quic-idle-timeout", "1s", "--quic-idle-timeout-ms", "1000"], &[]);
    assert!(said.contains("cannot be used with"), "old and new together: {said}");
    let said = gateway_refuses(&["--lease-ttl", "1500ms"], &[]);
    assert!(said.contains("--lease-ttl 1.5s must be whole seconds between 1s and 60s"), "{said}");
}
