//! `loadtest-report`: combines several `loadtest` JSON summaries into one self-contained
//! HTML page (and, with `--svg-dir`, one SVG file per plot for documents to embed).
//!
//! The input is a manifest: `{"title", "notes": [..], "tables": [{"title", "header",
//! "rows"}], "sections": [{"name", "runs": [{"label", "summary": "run.json"}]}]}`, with
//! summary paths relative to the manifest.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use loadtest::report::{Manifest, Report};

#[derive(Debug, Parser)]
#[command(name = "loadtest-report", version)]
struct Cli {
    /// The manifest naming the runs, grouped into sections (JSON): `{"title": "...",
    /// "sections": [{"name": "...", "runs": [{"label": "...", "summary": "run.json"}]}]}`,
    /// optionally with `"notes": ["..."]` and `"tables": [{"title", "header": [..], "rows":
    /// [[..]]}]`; each summary is a `loadtest --json` file, relative to the manifest. README's
    /// "Load test" section has an example.
    #[arg(long)]
    manifest: PathBuf,
    /// Where to write the HTML page.
    #[arg(long)]
    out: PathBuf,
    /// Also write every plot as an SVG file into this folder.
    #[arg(long)]
    svg_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("loadtest-report: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&cli.manifest)
        .with_context(|| format!("reading {}", cli.manifest.display()))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", cli.manifest.display()))?;
    let base = cli.manifest.parent().map(PathBuf::from).unwrap_or_default();
    let report = Report::from_manifest(manifest, &base)?;
    std::fs::write(&cli.out, report.to_html()?)
        .with_context(|| format!("writing {}", cli.out.display()))?;
    if let Some(dir) = &cli.svg_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (file, _, svg) in report.plots()? {
            let path = dir.join(file);
            std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    eprintln!("loadtest-report: wrote {}", cli.out.display());
    Ok(())
}
