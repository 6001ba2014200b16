//! A strict parser of the Prometheus text exposition format (version 0.0.4), for checking
//! what the nodes' `/metrics` serve: every line a valid `# HELP`, `# TYPE` or sample; at
//! most one HELP and one TYPE per family, the TYPE before its first sample; each family's
//! lines in one group; no series twice; counters not negative; histograms with an
//! `le="+Inf"` bucket, cumulative buckets in increasing `le` order, and `+Inf` equal to
//! `_count`, for every label set.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, ensure, Context};

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromSample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A metric family: its TYPE, HELP and samples, in the order served.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromFamily {
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped` (no TYPE line).
    pub kind: String,
    pub help: Option<String>,
    pub samples: Vec<PromSample>,
}

/// A parsed `/metrics` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub families: BTreeMap<String, PromFamily>,
}

impl Exposition {
    /// Parses `text`, failing on the first line that breaks the format (with its number).
    pub fn parse(text: &str) -> anyhow::Result<Exposition> {
        let mut parser = Parser::default();
        for (index, line) in text.lines().enumerate() {
            parser.line(line).with_context(|| format!("line {}: {line:?}", index + 1))?;
        }
        ensure!(text.is_empty() || text.ends_with('\n'), "the last line has no line feed");
        parser.finish()
    }

    /// The sum of every sample named exactly `sample` (all label sets), if there is one.
    pub fn total(&self, sample: &str) -> Option<f64> {
        let values: Vec<f64> = self
            .families
            .values()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == sample)
            .map(|s| s.value)
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// The family `name`, if served.
    pub fn family(&self, name: &str) -> Option<&PromFamily> {
        self.families.get(name)
    }
}

#[derive(Default)]
struct Parser {
    families: BTreeMap<String, PromFamily>,
    /// The family whose lines are being read; a family seen before and left is closed.
    current: Option<String>,
    closed: BTreeSet<String>,
    series: BTreeSet<(String, Vec<(String, String)>)>,
}

impl Parser {
    fn line(&mut self, line: &str) -> anyhow::Result<()> {
        if line.is_empty() {
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let family = self.enter(name)?;
            ensure!(family.help.is_none(), "a second HELP for {name}");
            family.help = Some(help.to_string());
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').context("TYPE without a type")?;
            ensure!(
                matches!(kind, "counter" | "gauge" | "histogram" | "summary" | "untyped"),
                "unknown type {kind:?}"
            );
            let family = self.enter(name)?;
            ensure!(family.kind.is_empty(), "a second TYPE for {name}");
            ensure!(family.samples.is_empty(), "TYPE of {name} after its samples");
            family.kind = kind.to_string();
            return Ok(());
        }
        ensure!(!line.starts_with('#') || line.starts_with("# "), "a malformed comment");
        if line.starts_with('#') {
            return Ok(());
        }
        let sample = parse_sample(line)?;
        let family_name = self.family_of(&sample.name);
        let key = (sample.name.clone(), sample.labels.clone().into_iter().collect());
        ensure!(self.series.insert(key), "the series {} is served twice", sample.name);
        let family = self.enter(&family_name)?;
        if family.kind == "counter" {
            ensure!(sample.value >= 0.0, "a negative counter");
        }
        family.samples.push(sample);
        Ok(())
    }

    /// The family a sample belongs to: `x_bucket`, `x_sum`, `x_count` go to histogram (or
    /// summary) `x` when `x` is declared so.
    fn family_of(&self, sample: &str) -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample.strip_suffix(suffix) {
                if let Some(family) = self.families.get(base) {
                    if family.kind == "histogram"
                        || (family.kind == "summary" && suffix != "_bucket")
                    {
                        return base.to_string();
                    }
                }
            }
        }
        sample.to_string()
    }

    /// Makes `name` the current family; a family's lines must come in one group.
    fn enter(&mut self, name: &str) -> anyhow::Result<&mut PromFamily> {
        ensure!(valid_metric_name(name), "invalid metric name {name:?}");
        if self.current.as_deref() != Some(name) {
            ensure!(!self.closed.contains(name), "the lines of {name} are not in one group");
            if let Some(previous) = self.current.take() {
                self.closed.insert(previous);
            }
            self.current = Some(name.to_string());
        }
        Ok(self.families.entry(name.to_string()).or_default())
    }

    fn finish(mut self) -> anyhow::Result<Exposition> {
        for family in self.families.values_mut().filter(|f| f.kind.is_empty()) {
            family.kind = "untyped".to_string();
        }
        for (name, family) in &self.families {
            if family.kind == "histogram" {
                check_histogram(name, family)?;
            }
        }
        Ok(Exposition { families: self.families })
    }
}

/// Every label set of a histogram: buckets with increasing `le`, cumulative counts, a
/// `+Inf` bucket equal to `_count`, and a `_sum`.
fn check_histogram(name: &str, family: &PromFamily) -> anyhow::Result<()> {
    type Labels = BTreeMap<String, String>;
    let mut buckets: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<Labels, f64> = BTreeMap::new();
    let mut sums: BTreeSet<Labels> = BTreeSet::new();
    for sample in &family.samples {
        let mut labels = sample.labels.clone();
        if sample.name == format!("{name}_bucket") {
            let le = labels.remove("le").with_context(|| format!("{name}_bucket without le"))?;
            let bound = parse_value(&le).with_context(|| format!("{name}: bad le {le:?}"))?;
            buckets.entry(labels).or_default().push((bound, sample.value));
        } else if sample.name == format!("{name}_count") {
            counts.insert(labels, sample.value);
        } else if sample.name == format!("{name}_sum") {
            sums.insert(labels);
        } else {
            bail!("{} is not a sample of histogram {name}", sample.name);
        }
    }
    ensure!(!buckets.is_empty(), "histogram {name} has no buckets");
    for (labels, series) in &buckets {
        for pair in series.windows(2) {
            ensure!(pair[0].0 < pair[1].0, "{name}{labels:?}: le not increasing: {series:?}");
            ensure!(pair[0].1 <= pair[1].1, "{name}{labels:?}: buckets not cumulative: {series:?}");
        }
        let last = series.last().expect("invariant: a series has a bucket");
        ensure!(last.0 == f64::INFINITY, "{name}{labels:?}: no le=\"+Inf\" bucket");
        let count = counts.get(labels).with_context(|| format!("{name}{labels:?}: no _count"))?;
        ensure!(last.1 == *count, "{name}{labels:?}: +Inf bucket {} != _count {count}", last.1);
        ensure!(sums.contains(labels), "{name}{labels:?}: no _sum");
    }
    Ok(())
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(text: &str) -> anyhow::Result<f64> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => {
            let ok = text
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            ensure!(ok && !text.is_empty(), "not a number: {text:?}");
            text.parse().with_context(|| format!("not a number: {text:?}"))
        }
    }
}

/// `name{a="x",b="y"} value [timestamp]`.
fn parse_sample(line: &str) -> anyhow::Result<PromSample> {
    let name_end = line.find(['{', ' ']).context("a sample without a value")?;
    let name = &line[..name_end];
    ensure!(valid_metric_name(name), "invalid metric name {name:?}");
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(after) => parse_labels(after)?,
        None => (BTreeMap::new(), &line[name_end..]),
    };
    let rest = rest.strip_prefix(' ').context("no space before the value")?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().unwrap_or(""))?;
    if let Some(timestamp) = fields.next() {
        ensure!(timestamp.parse::<i64>().is_ok(), "bad timestamp {timestamp:?}");
    }
    ensure!(fields.next().is_none(), "extra fields after the value");
    Ok(PromSample { name: name.to_string(), labels, value })
}

/// The labels of `a="x",b="y"} rest` and the rest after the closing brace.
fn parse_labels(text: &str) -> anyhow::Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut at = 0;
    loop {
        if let Some(rest) = text[at..].strip_prefix('}') {
            return Ok((labels, rest));
        }
        let eq = text[at..].find('=').context("a label without '='")? + at;
        let label = &text[at..eq];
        ensure!(valid_label_name(label), "invalid label name {label:?}");
        ensure!(text[eq + 1..].starts_with('"'), "label value not quoted");
        let mut value = String::new();
        let mut chars = text[eq + 2..].char_indices();
        let end = loop {
            let (i, c) = chars.next().context("unterminated label value")?;
            match c {
                '"' => break eq + 2 + i,
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => bail!("bad escape {other:?} in a label value"),
                },
                c => value.push(c),
            }
        };
        ensure!(labels.insert(label.to_string(), value).is_none(), "label {label} twice");
        at = end + 1;
        match text[at..].chars().next() {
            Some(',') => {
                at += 1;
                ensure!(!text[at..].starts_with('}'), "a trailing ',' in a label set");
            }
            Some('}') => {}
            _ => bail!("expected ',' or '}}' after a label value"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n\
a_total{x=\"q\\\"uote\",y=\"2\"} 4\n# TYPE d histogram\nd_bucket{le=\"0.1\"} 1\n\
d_bucket{le=\"1\"} 2\nd_bucket{le=\"+Inf\"} 2\nd_sum 0.6\nd_count 2\n# TYPE g gauge\ng -1\n";

    #[test]
    fn a_valid_exposition_parses() {
        let e = Exposition::parse(GOOD).unwrap();
        assert_eq!(e.total("a_total"), Some(7.0));
        assert_eq!(e.family("a_total").unwrap().samples[1].labels["x"], "q\"uote");
        assert_eq!(e.family("d").unwrap().kind, "histogram");
        assert_eq!(e.total("d_count"), Some(2.0));
        assert_eq!(e.total("g"), Some(-1.0));
    }

    fn fails(text: &str, why: &str) {
        let error = format!("{:#}", Exposition::parse(text).unwrap_err());
        assert!(error.contains(why), "expected {why:?} in {error:?}");
    }

    #[test]
    fn broken_expositions_are_refused() {
        fails("a 1\n# TYPE a counter\n", "after its samples");
        fails("# TYPE a counter\n# TYPE a counter\n", "second TYPE");
        fails("# TYPE a counter\na 1\n# TYPE b gauge\nb 1\na{x=\"1\"} 2\n", "one group");
        fails("# TYPE a counter\na -1\n", "negative counter");
        fails("# TYPE a counter\na 1\na 2\n", "twice");
        fails("a{x=1} 1\n", "not quoted");
        fails("a{x=\"1\" 1\n", "expected ','");
        fails("a 1 2 3\n", "extra fields");
        fails("a one\n", "not a number");
        fails("9a 1\n", "invalid metric name");
        fails("# TYPE a countr\n", "unknown type");
        fails("#TYPE a counter\n", "malformed comment");
        fails("a 1", "no line feed");
        let h = "# TYPE d histogram\n";
        fails(
            &format!("{h}d_bucket{{le=\"1\"}} 2\nd_bucket{{le=\"0.1\"}} 3\n"),
            "le not increasing",
        );
        fails(&format!("{h}d_bucket{{le=\"1\"}} 2\nd_bucket{{le=\"+Inf\"}} 1\n"), "not cumulative");
        fails(&format!("{h}d_bucket{{le=\"1\"}} 2\nd_sum 1\nd_count 2\n"), "no le=\"+Inf\"");
        fails(&format!("{h}d_bucket{{le=\"+Inf\"}} 2\nd_sum 1\nd_count 3\n"), "!= _count");
        fails(&format!("{h}d_bucket{{le=\"+Inf\"}} 2\nd_count 2\n"), "no _sum");
    }
}
