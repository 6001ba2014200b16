use serde_json::json;

use super::*;

fn summary(p99: f64, with_ramp: bool) -> Value {
    let mut value = json!({
        "label": "ignored",
        "bots_connected": 100,
        "moves_sent": 1000, "moves_acked": 998, "moves_lost": 2, "moves_errored": 0,
        "notifications_per_s": 1234.5,
        "delay_ms": {"p50": 1.0, "p90": 2.0, "p99": p99, "p999": 9.0, "max": 12.0, "mean": 1.2},
        "delay_cdf": [[0.5, 0.1], [1.0, 0.5], [p99, 0.99], [12.0, 1.0]],
        "delay_box_ms": {"p1": 0.4, "p25": 0.8, "p50": 1.0, "p75": 1.5, "p99": p99},
        "per_second": [
            {"t": 1.0, "bots": 50, "sent": 40, "acked": 40, "notifications": 400, "p50_ms": 1.0, "p99_ms": p99},
            {"t": 2.0, "bots": 100, "sent": 90, "acked": 89, "notifications": 900, "p50_ms": null, "p99_ms": null}
        ],
        "disconnects": 0, "send_lag_max_ms": 0.3
    });
    if with_ramp {
        value["ramp"] = json!({
            "steps": [
                {"bots_target": 50, "p99_ms": 2.0, "passed": true},
                {"bots_target": 100, "p99_ms": 80.0, "passed": false}
            ],
            "largest_passing": 50
        });
    }
    value
}

#[test]
fn a_summary_becomes_a_run_with_every_series() {
    let run = Run::from_summary("uring", &summary(4.0, true)).unwrap();
    assert_eq!(run.label, "uring");
    assert_eq!(run.cdf.len(), 4);
    assert_eq!(run.box_ms.unwrap().p99, 4.0);
    assert_eq!(run.seconds.len(), 2);
    assert_eq!(run.seconds[1].p99_ms, None, "a second without acks has no percentile");
    assert_eq!(run.ramp.len(), 2);
    assert_eq!(run.largest_passing, Some(50.0));
    let lost = run.figures.iter().find(|(name, _)| name == "lost").unwrap();
    assert_eq!(lost.1, "2");
    assert!(Run::from_summary("x", &json!([1, 2])).is_err(), "not a summary");
}

#[test]
fn an_old_summary_without_new_fields_still_draws() {
    let old = json!({"bots_connected": 3, "delay_ms": {"p50": null}, "per_second": []});
    let run = Run::from_summary("old", &old).unwrap();
    assert!(run.cdf.is_empty() && run.box_ms.is_none() && run.seconds.is_empty());
    let report = Report {
        title: "t".into(),
        notes: vec![],
        tables: vec![],
        sections: vec![Section { name: "s".into(), runs: vec![run] }],
    };
    let html = report.to_html().unwrap();
    assert!(!html.contains("<svg"), "nothing to plot, no empty plots");
}

#[test]
fn the_page_is_self_contained_and_has_every_plot_per_section() {
    let report = Report {
        title: "uring <vs> epoll".into(),
        notes: vec!["machine: 2 cores".into()],
        tables: vec![Table {
            title: "ratios".into(),
            header: vec!["what".into(), "ratio".into()],
            rows: vec![vec!["syscalls/msg".into(), "12.5x".into()]],
        }],
        sections: vec![Section {
            name: "io backend".into(),
            runs: vec![
                Run::from_summary("uring", &summary(4.0, true)).unwrap(),
                Run::from_summary("epoll", &summary(9.0, false)).unwrap(),
            ],
        }],
    };
    let html = report.to_html().unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("uring &lt;vs&gt; epoll"), "the title is escaped");
    assert!(html.contains("<td>12.5x</td>"));
    assert_eq!(
        html.matches("<svg").count(),
        7,
        "cdf, box, delay, acked, notifications, bots, ramp"
    );
    for external in ["http://", "https://", "<script", "src="] {
        let outside_svg_namespace = html.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside_svg_namespace.contains(external), "the page must not load {external}");
    }
    assert!(html.contains("uring") && html.contains("epoll"), "both runs are named");
    let plots = report.plots().unwrap();
    assert_eq!(plots[0].0, "io-backend-cdf.svg");
    assert!(plots.iter().all(|(_, _, svg)| svg.contains("<svg")));
}

#[test]
fn a_manifest_reads_its_summaries_relative_to_itself() {
    let dir = std::env::temp_dir().join(format!("loadtest-report-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.json"), summary(3.0, false).to_string()).unwrap();
    let manifest: Manifest = serde_json::from_value(json!({
        "title": "suite",
        "sections": [{"name": "one", "runs": [{"label": "a", "summary": "a.json"}]}]
    }))
    .unwrap();
    let report = Report::from_manifest(manifest, &dir).unwrap();
    assert_eq!(report.sections[0].runs[0].label, "a");
    let missing: Manifest = serde_json::from_value(json!({
        "title": "suite",
        "sections": [{"name": "one", "runs": [{"label": "b", "summary": "missing.json"}]}]
    }))
    .unwrap();
    let error = Report::from_manifest(missing, &dir).unwrap_err();
    assert!(format!("{error:#}").contains("missing.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn slugs_are_file_names() {
    assert_eq!(slug("Gateway: uring vs epoll!"), "gateway-uring-vs-epoll");
    assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
}

#[test]
fn axis_labels_stay_short() {
    use super::plots::compact;
    assert_eq!(compact(350_000.0), "350k");
    assert_eq!(compact(1_250_000.0), "1.2M");
    assert_eq!(compact(1_500.0), "1500");
    assert_eq!(compact(12.0), "12");
    assert_eq!(compact(0.25), "0.25");
}

/// The manifest README shows is one `loadtest-report` reads (issue 32: the format was
/// undocumented, and a guess failed with "missing field `title`").
#[test]
fn the_manifest_in_the_readme_parses() {
    let readme = include_str!("../../../README.md");
    let from = readme.find("loadtest-report --manifest").expect("README shows loadtest-report");
    let block = &readme[from..];
    let start = block.find("```json\n").expect("a JSON block follows") + "```json\n".len();
    let end = start + block[start..].find("```").expect("the block ends");
    let manifest: Manifest = serde_json::from_str(&block[start..end]).expect("it parses");
    assert_eq!(manifest.sections[0].runs.len(), 2);
    assert_eq!(manifest.tables[0].rows.len(), 2);
}
