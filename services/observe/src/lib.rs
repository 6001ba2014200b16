//! Observability shared by every Meridian node: one place that sets up `tracing`, a tiny
//! lock-free metrics registry rendered as Prometheus text, the admin HTTP port
//! (`/healthz`, `/readyz`, `/metrics`, plus node-specific pages), and the tiny client one
//! node uses to read another's admin port.
//!
//! Metrics are plain atomics updated on hot paths with relaxed ordering; rendering walks
//! them on scrape. Nothing here allocates per update or takes a lock per update.

mod admin;
mod client;
mod metrics;

pub use admin::{
    serve_admin, serve_admin_with, Access, Private, Readiness, Reply, ReplyFuture, Routes,
};
pub use client::{admin_get, admin_get_as};
pub use metrics::{Counter, CounterFamily, Gauge, Histogram, Registry};

/// Sets up `tracing` once for the process: `RUST_LOG`-style filter (default `info`),
/// human-readable lines on stderr, or JSON lines when `json` is set.
pub fn init_tracing(json: bool) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second call (tests that start nodes in-process) keeps the first subscriber.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
