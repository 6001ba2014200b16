//! The load test's report: one or several runs (their JSON summaries) drawn into a
//! self-contained HTML page with SVG plots, as the source paper's figures (delay CDF per
//! run, box plots per configuration) plus delay, throughput and bots over time and the
//! ramp's steps.
//!
//! The `loadtest` binary uses it for `--html`; `loadtest-report` combines the runs of a
//! benchmark suite into one page. It never touches the network: the page loads nothing.

pub mod report;
