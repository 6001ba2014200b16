//! The command line as an operator meets it (issue 16):
//!
//! - `help`: every argument of every command has a description, in clap's tree and in the
//!   binary's `--help`; the former millisecond flags are hidden.
//! - `durations`: every duration flag takes `250ms`, `30s`, `1m30s`, `2h`, a bare number as
//!   seconds, and refuses what is not a duration; the former `-ms` flags and environment
//!   variables still work, in milliseconds.
//! - `defaults`: every command has the same default cluster name, and after `meridian up`
//!   the `meridian status` command it prints shows that cluster without `--cluster`.
//! - `check`: `meridian status --check` exits 0 on a healthy cluster, 1 with a line per
//!   problem when a shard or the gateway is killed, and 3 when etcd cannot be reached.
//! - `web`: `meridian status --web` serves the live map off loopback only with the token.
//! - `ports`: a game, WebSocket or QUIC port another cluster serves stops `up` and a gateway
//!   at start, naming the port and the flag (issue 32).
//! - `validation`: a bad `--store`, `--resume-key` or `--jwks` is refused before anything
//!   starts, leaving nothing behind (issue 32).
//! - `drain`: `meridian drain --wait` says each step once, and `up` reaps the drained shard.

mod check;
mod defaults;
mod drain;
mod durations;
mod help;
mod ports;
mod validation;
mod web;

use std::path::Path;

/// The binary under test, built by Cargo for these tests.
fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}
