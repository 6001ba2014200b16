//! A minimal Prometheus registry: counters, gauges and fixed-bucket histograms.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One counter per value of a label (error codes), registered together; counting a value
/// that was not registered does nothing.
#[derive(Debug, Default)]
pub struct CounterFamily {
    counters: Vec<(&'static str, Arc<Counter>)>,
}

impl CounterFamily {
    pub fn add(&self, value: &str, n: u64) {
        if let Some((_, counter)) = self.counters.iter().find(|(v, _)| *v == value) {
            counter.add(n);
        }
    }

    pub fn inc(&self, value: &str) {
        self.add(value, 1);
    }

    /// The count of one value (0 for one not registered).
    pub fn get(&self, value: &str) -> u64 {
        self.counters.iter().find(|(v, _)| *v == value).map_or(0, |(_, counter)| counter.get())
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram over fixed upper bounds (seconds, bytes, ...).
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in millionths of the unit, so it can live in an atomic integer.
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }
}

/// A value read at scrape time from state the node keeps anyway (a registration flag, the
/// partition epoch), so nothing has to copy it into an atomic.
type ReadFn = Box<dyn Fn() -> i64 + Send + Sync>;

/// A value that is not a whole number (seconds of CPU), read at scrape time.
type ReadFloatFn = Box<dyn Fn() -> f64 + Send + Sync>;

/// The Prometheus type of a metric read at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Never goes down (named `_total`).
    Counter,
    Gauge,
}

enum Metric {
    Counter(Arc<Counter>),
    Gauge(Arc<Gauge>),
    CounterFn(ReadFn),
    GaugeFn(ReadFn),
    FloatFn(Kind, ReadFloatFn),
    Histogram(Arc<Histogram>),
}

struct Entry {
    name: String,
    help: String,
    labels: String,
    metric: Metric,
}

/// Where a node's metrics are registered at start and rendered on scrape. The mutex is
/// taken only at registration and scrape time, never on an update.
#[derive(Clone, Default)]
pub struct Registry {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Registry {
    fn push(&self, name: &str, help: &str, labels: &[(&str, &str)], metric: Metric) {
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect::<Vec<_>>()
            .join(",");
        let entry = Entry { name: name.to_string(), help: help.to_string(), labels, metric };
        self.entries.lock().expect("invariant: metrics lock is never poisoned").push(entry);
    }

    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Counter> {
        let counter = Arc::new(Counter::default());
        self.push(name, help, labels, Metric::Counter(Arc::clone(&counter)));
        counter
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Gauge> {
        let gauge = Arc::new(Gauge::default());
        self.push(name, help, labels, Metric::Gauge(Arc::clone(&gauge)));
        gauge
    }

    /// A counter per value of `label` (besides the common `labels`), all at 0.
    pub fn counter_family(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        label: &str,
        values: impl IntoIterator<Item = &'static str>,
    ) -> CounterFamily {
        let counters = values
            .into_iter()
            .map(|value| {
                let all: Vec<(&str, &str)> =
                    labels.iter().copied().chain(std::iter::once((label, value))).collect();
                (value, self.counter(name, help, &all))
            })
            .collect();
        CounterFamily { counters }
    }

    /// A counter whose value `read` computes on every scrape (it must never go down).
    pub fn counter_fn(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        let read = move || i64::try_from(read()).unwrap_or(i64::MAX);
        self.push(name, help, labels, Metric::CounterFn(Box::new(read)));
    }

    /// A gauge whose value `read` computes on every scrape.
    pub fn gauge_fn(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        read: impl Fn() -> i64 + Send + Sync + 'static,
    ) {
        self.push(name, help, labels, Metric::GaugeFn(Box::new(read)));
    }

    /// A metric of `kind` whose value `read` computes on every scrape, not necessarily a
    /// whole number (NaN renders as `NaN`: the value could not be read).
    pub fn float_fn(
        &self,
        name: &str,
        help: &str,
        kind: Kind,
        read: impl Fn() -> f64 + Send + Sync + 'static,
    ) {
        self.push(name, help, &[], Metric::FloatFn(kind, Box::new(read)));
    }

    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
    ) -> Arc<Histogram> {
        let histogram = Arc::new(Histogram::new(bounds));
        self.push(name, help, labels, Metric::Histogram(Arc::clone(&histogram)));
        histogram
    }

    /// Prometheus text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        let entries = self.entries.lock().expect("invariant: metrics lock is never poisoned");
        let mut out = String::with_capacity(entries.len() * 96);
        // One group per name, in the order names were first registered: a family whose
        // members were registered apart (the admin port's gate, then the QUIC front's) is
        // still one group, as the exposition format requires.
        let mut first_of: std::collections::HashMap<&str, usize> = Default::default();
        let mut order: Vec<(usize, usize)> = Vec::with_capacity(entries.len());
        for (at, entry) in entries.iter().enumerate() {
            let group = *first_of.entry(entry.name.as_str()).or_insert(at);
            order.push((group, at));
        }
        order.sort_unstable();
        let mut last_name = "";
        for entry in order.iter().map(|&(_, at)| &entries[at]) {
            let kind = match entry.metric {
                Metric::Counter(_) | Metric::CounterFn(_) => "counter",
                Metric::FloatFn(Kind::Counter, _) => "counter",
                Metric::Gauge(_) | Metric::GaugeFn(_) => "gauge",
                Metric::FloatFn(Kind::Gauge, _) => "gauge",
                Metric::Histogram(_) => "histogram",
            };
            if entry.name != last_name {
                let _ = writeln!(out, "# HELP {} {}", entry.name, entry.help);
                let _ = writeln!(out, "# TYPE {} {kind}", entry.name);
                last_name = &entry.name;
            }
            let braces = |extra: &str| {
                let all = [entry.labels.as_str(), extra]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(",");
                if all.is_empty() {
                    String::new()
                } else {
                    format!("{{{all}}}")
                }
            };
            match &entry.metric {
                Metric::Counter(c) => {
                    let _ = writeln!(out, "{}{} {}", entry.name, braces(""), c.get());
                }
                Metric::Gauge(g) => {
                    let _ = writeln!(out, "{}{} {}", entry.name, braces(""), g.get());
                }
                Metric::GaugeFn(read) | Metric::CounterFn(read) => {
                    let _ = writeln!(out, "{}{} {}", entry.name, braces(""), read());
                }
                Metric::FloatFn(_, read) => {
                    let _ = writeln!(out, "{}{} {}", entry.name, braces(""), read());
                }
                Metric::Histogram(h) => {
                    let mut cumulative = 0;
                    for (bound, bucket) in h.bounds.iter().zip(&h.buckets) {
                        cumulative += bucket.load(Ordering::Relaxed);
                        let le = format!("le=\"{bound}\"");
                        let _ = writeln!(out, "{}_bucket{} {cumulative}", entry.name, braces(&le));
                    }
                    let count = h.count.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{}_bucket{} {count}", entry.name, braces("le=\"+Inf\""));
                    let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
                    let _ = writeln!(out, "{}_sum{} {sum}", entry.name, braces(""));
                    let _ = writeln!(out, "{}_count{} {count}", entry.name, braces(""));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let registry = Registry::default();
        let logins = registry.counter("meridian_logins_total", "Logins accepted.", &[]);
        let errors = registry.counter_family(
            "meridian_errors_total",
            "Errors.",
            &[],
            "code",
            ["MALFORMED", "RATE_LIMITED"],
        );
        let latency = registry.histogram("meridian_delay_seconds", "Delay.", &[], &[0.001, 0.01]);
        registry.gauge_fn("meridian_epoch", "Epoch.", &[("node", "a")], || 7);
        logins.add(3);
        errors.inc("MALFORMED");
        errors.inc("NOT_A_CODE");
        latency.observe(0.005);
        let text = registry.render();
        assert!(text.contains("# TYPE meridian_logins_total counter\nmeridian_logins_total 3\n"));
        assert!(text.contains("meridian_errors_total{code=\"MALFORMED\"} 1\n"));
        assert!(text.contains("meridian_errors_total{code=\"RATE_LIMITED\"} 0\n"));
        assert!(text.contains("meridian_delay_seconds_bucket{le=\"0.001\"} 0\n"));
        assert!(text.contains("meridian_delay_seconds_bucket{le=\"0.01\"} 1\n"));
        assert!(text.contains("meridian_delay_seconds_count 1\n"));
        assert!(text.contains("# TYPE meridian_epoch gauge\nmeridian_epoch{node=\"a\"} 7\n"));
    }

    /// Members of one family registered apart still render as one group, where the name
    /// first appeared.
    #[test]
    fn a_family_registered_apart_renders_as_one_group() {
        let registry = Registry::default();
        registry.counter("meridian_a_total", "A.", &[("port", "admin")]).inc();
        registry.counter("meridian_b_total", "B.", &[]);
        registry.counter("meridian_a_total", "A.", &[("port", "quic")]).add(2);
        let text = registry.render();
        let want = "# HELP meridian_a_total A.\n# TYPE meridian_a_total counter\n\
                    meridian_a_total{port=\"admin\"} 1\nmeridian_a_total{port=\"quic\"} 2\n\
                    # HELP meridian_b_total B.\n";
        assert!(text.starts_with(want), "{text}");
        assert_eq!(text.matches("# HELP meridian_a_total").count(), 1, "{text}");
    }
}
