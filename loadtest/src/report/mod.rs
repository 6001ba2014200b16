//! Runs in, one self-contained HTML page out.
//!
//! The input is the `loadtest` JSON summary (read as `serde_json::Value`, so a report can
//! be drawn from older summaries that lack newer fields); plots are drawn by `plots` with
//! plotters' SVG backend and inlined, so the page needs no network, script or font file.

pub(crate) mod plots;

use std::fmt::Write as _;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

/// One second of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Second {
    pub t: f64,
    pub bots: f64,
    pub sent: f64,
    pub acked: f64,
    pub notifications: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Box-plot numbers in ms (whiskers p1 and p99).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoxStats {
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
}

/// One ramp step: bots, p99 ms, passed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RampStep {
    pub bots: f64,
    pub p99_ms: Option<f64>,
    pub passed: bool,
}

/// What the report draws of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub label: String,
    /// `(delay ms, fraction)`.
    pub cdf: Vec<(f64, f64)>,
    pub box_ms: Option<BoxStats>,
    pub seconds: Vec<Second>,
    pub ramp: Vec<RampStep>,
    pub largest_passing: Option<f64>,
    /// Headline numbers for the run table, in display order.
    pub figures: Vec<(String, String)>,
}

/// Runs compared with one another: one set of plots.
#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub runs: Vec<Run>,
}

/// A table given by the caller (the benchmark suite's ratios), drawn above the plots.
#[derive(Debug, Clone, Deserialize)]
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub title: String,
    pub notes: Vec<String>,
    pub tables: Vec<Table>,
    pub sections: Vec<Section>,
}

fn number(value: &Value) -> Option<f64> {
    value.as_f64()
}

fn shown(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            Some(f) => format!("{f:.2}"),
            None => n.to_string(),
        },
        other => other.to_string(),
    }
}

impl Run {
    /// Reads what the report needs from a `loadtest` JSON summary.
    pub fn from_summary(label: &str, summary: &Value) -> anyhow::Result<Run> {
        if !summary.is_object() {
            anyhow::bail!("a loadtest summary is a JSON object");
        }
        let cdf = summary["delay_cdf"]
            .as_array()
            .map(|points| {
                points.iter().filter_map(|p| Some((number(&p[0])?, number(&p[1])?))).collect()
            })
            .unwrap_or_default();
        let b = &summary["delay_box_ms"];
        let box_ms = (|| {
            Some(BoxStats {
                p1: number(&b["p1"])?,
                p25: number(&b["p25"])?,
                p50: number(&b["p50"])?,
                p75: number(&b["p75"])?,
                p99: number(&b["p99"])?,
            })
        })();
        let seconds = summary["per_second"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|e| {
                        Some(Second {
                            t: number(&e["t"])?,
                            bots: number(&e["bots"]).unwrap_or(0.0),
                            sent: number(&e["sent"]).unwrap_or(0.0),
                            acked: number(&e["acked"]).unwrap_or(0.0),
                            notifications: number(&e["notifications"]).unwrap_or(0.0),
                            p50_ms: number(&e["p50_ms"]),
                            p99_ms: number(&e["p99_ms"]),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ramp = summary["ramp"]["steps"]
            .as_array()
            .map(|steps| {
                steps
                    .iter()
                    .filter_map(|s| {
                        Some(RampStep {
                            bots: number(&s["bots_target"])?,
                            p99_ms: number(&s["p99_ms"]),
                            passed: s["passed"].as_bool().unwrap_or(false),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let d = &summary["delay_ms"];
        let mut figures = vec![
            ("bots".to_owned(), shown(&summary["bots_connected"])),
            ("moves sent".to_owned(), shown(&summary["moves_sent"])),
            ("acked".to_owned(), shown(&summary["moves_acked"])),
            ("lost".to_owned(), shown(&summary["moves_lost"])),
            ("errored".to_owned(), shown(&summary["moves_errored"])),
            ("notifications/s".to_owned(), shown(&summary["notifications_per_s"])),
            ("p50 ms".to_owned(), shown(&d["p50"])),
            ("p99 ms".to_owned(), shown(&d["p99"])),
            ("p99.9 ms".to_owned(), shown(&d["p999"])),
            ("max ms".to_owned(), shown(&d["max"])),
            ("disconnects".to_owned(), shown(&summary["disconnects"])),
            ("send lag max ms".to_owned(), shown(&summary["send_lag_max_ms"])),
        ];
        let largest_passing = number(&summary["ramp"]["largest_passing"]);
        if summary["ramp"].is_object() {
            figures.push((
                "ramp: largest passing".to_owned(),
                shown(&summary["ramp"]["largest_passing"]),
            ));
        }
        Ok(Run { label: label.to_owned(), cdf, box_ms, seconds, ramp, largest_passing, figures })
    }
}

/// The suite's manifest for `loadtest-report`: sections of labelled summary files.
#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub title: String,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub tables: Vec<Table>,
    pub sections: Vec<ManifestSection>,
}

#[derive(Debug, Deserialize)]
pub struct ManifestSection {
    pub name: String,
    pub runs: Vec<ManifestRun>,
}

#[derive(Debug, Deserialize)]
pub struct ManifestRun {
    pub label: String,
    /// Path of the run's JSON summary, relative to the manifest's folder.
    pub summary: std::path::PathBuf,
}

impl Report {
    /// Builds a report from a manifest, reading each run's summary file.
    pub fn from_manifest(manifest: Manifest, base: &std::path::Path) -> anyhow::Result<Report> {
        let mut sections = Vec::new();
        for section in manifest.sections {
            let mut runs = Vec::new();
            for run in section.runs {
                let path = base.join(&run.summary);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let value: Value = serde_json::from_str(&text)
                    .with_context(|| format!("parsing {}", path.display()))?;
                runs.push(Run::from_summary(&run.label, &value)?);
            }
            sections.push(Section { name: section.name, runs });
        }
        Ok(Report {
            title: manifest.title,
            notes: manifest.notes,
            tables: manifest.tables,
            sections,
        })
    }

    /// Every plot of the report as `(file name, SVG)`, in page order.
    pub fn plots(&self) -> anyhow::Result<Vec<(String, String, String)>> {
        let mut out = Vec::new();
        for section in &self.sections {
            let slug = slug(&section.name);
            for (kind, title, svg) in plots::section_plots(section)? {
                out.push((format!("{slug}-{kind}.svg"), title, svg));
            }
        }
        Ok(out)
    }

    /// The whole page: title, notes, the caller's tables, then per section a table of its
    /// runs and its plots.
    pub fn to_html(&self) -> anyhow::Result<String> {
        let mut html = String::new();
        let _ = write!(
            html,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>{title}</title><style>\
             body{{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}}\
             table{{border-collapse:collapse;margin:0.5em 0 1.5em}}\
             td,th{{border:1px solid #bbb;padding:3px 8px;text-align:right}}\
             th{{background:#eee}} td:first-child{{text-align:left}}\
             .plots{{display:flex;flex-wrap:wrap;gap:12px}} .plot{{border:1px solid #ddd}}\
             </style></head><body>\n<h1>{title}</h1>\n",
            title = escape(&self.title)
        );
        if !self.notes.is_empty() {
            html.push_str("<ul>\n");
            for note in &self.notes {
                let _ = writeln!(html, "<li>{}</li>", escape(note));
            }
            html.push_str("</ul>\n");
        }
        for table in &self.tables {
            let _ = writeln!(html, "<h2>{}</h2>", escape(&table.title));
            push_table(&mut html, &table.header, &table.rows);
        }
        for section in &self.sections {
            let _ = writeln!(html, "<h2>{}</h2>", escape(&section.name));
            if let Some(first) = section.runs.first() {
                let mut header = vec!["run".to_owned()];
                header.extend(first.figures.iter().map(|(name, _)| name.clone()));
                let rows: Vec<Vec<String>> = section
                    .runs
                    .iter()
                    .map(|run| {
                        let mut row = vec![run.label.clone()];
                        row.extend(run.figures.iter().map(|(_, value)| value.clone()));
                        row
                    })
                    .collect();
                push_table(&mut html, &header, &rows);
            }
            html.push_str("<div class=\"plots\">\n");
            for (_, title, svg) in plots::section_plots(section)? {
                let _ = writeln!(
                    html,
                    "<div class=\"plot\" title=\"{}\">{}</div>",
                    escape(&title),
                    strip_xml_declaration(&svg)
                );
            }
            html.push_str("</div>\n");
        }
        html.push_str("</body></html>\n");
        Ok(html)
    }
}

fn push_table(html: &mut String, header: &[String], rows: &[Vec<String>]) {
    html.push_str("<table><tr>");
    for cell in header {
        let _ = write!(html, "<th>{}</th>", escape(cell));
    }
    html.push_str("</tr>\n");
    for row in rows {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(cell));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
}

fn strip_xml_declaration(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(start) => &svg[start..],
        None => svg,
    }
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A file-name-safe version of a section name.
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests;
