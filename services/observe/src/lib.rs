//! Observability shared by every Meridian node: one place that sets up `tracing`, a tiny
//! lock-free metrics registry rendered as Prometheus text, the admin HTTP port
//! (`/healthz`, `/readyz`, `/metrics`, plus node-specific pages), and the tiny client one
//! node uses to read another's admin port.
//!
//! Metrics are plain atomics updated on hot paths with relaxed ordering; rendering walks
//! them on scrape. Nothing here allocates per update or takes a lock per update.

#[cfg(feature = "http")]
mod admin;
#[cfg(feature = "http")]
mod client;
#[cfg(feature = "http")]
pub mod gate;
mod metrics;
pub mod process;

#[cfg(feature = "http")]
pub use admin::{
    serve_admin, serve_admin_with, Access, Private, Readiness, Reply, ReplyFuture, Routes,
};
#[cfg(feature = "http")]
pub use client::{admin_get, admin_get_as};
#[cfg(feature = "http")]
pub use gate::{Cut, Gate, GateLimits, Pass};
pub use metrics::{Counter, CounterFamily, Gauge, Histogram, Kind, Registry};
pub use process::set_build_info;

/// What is logged when `RUST_LOG` is not set: Meridian's own events from `info` up, the
/// libraries under it (HTTP/2, gRPC, QUIC, TLS, PostgreSQL, WebSocket) only from `warn`:
/// their `info` lines are per connection and say nothing an operator acts on.
pub const DEFAULT_LOG_FILTER: &str = "info,h2=warn,hyper=warn,hyper_util=warn,tower=warn,\
     tonic=warn,etcd_client=warn,quinn=warn,quinn_proto=warn,rustls=warn,tokio_postgres=warn,\
     tungstenite=warn,tokio_tungstenite=warn";

/// Sets up `tracing` once for the process: the `RUST_LOG` filter if set (e.g.
/// `info,meridian_shard=debug`), else [`DEFAULT_LOG_FILTER`]; human-readable lines on
/// stderr, or JSON lines when `json` is set.
pub fn init_tracing(json: bool) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colour only for a person at a terminal: a log written to a file or a pipe (a service
    // manager, `up`'s log, a test) would carry the escape codes as text. NO_COLOR
    // (no-color.org) turns it off at a terminal too.
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    // A second call (tests that start nodes in-process) keeps the first subscriber.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
