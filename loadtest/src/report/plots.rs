//! The report's plots, drawn with plotters' SVG backend into strings.
//!
//! Every plot of a section shows all its runs in one colour each, so configurations are
//! compared at a glance: the delay CDF (log-scaled delay), box plots (p1, p25, p50, p75,
//! p99), p50 and p99 delay per second, acks and notifications per second, bots online,
//! and, for ramp runs, p99 per step against the number of bots.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{Run, Section};

const SIZE: (u32, u32) = (640, 360);
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Intervals shorter than this are left out of rate plots.
const MIN_RATE_SPAN_S: f64 = 0.5;

/// An axis label that stays short: 350k, 1.2M, 12.5, 0.25.
pub fn compact(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if magnitude >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn colour(index: usize) -> RGBColor {
    COLOURS[index % COLOURS.len()]
}

/// `(kind, title, svg)` for every plot that has data in this section.
pub fn section_plots(section: &Section) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    let name = &section.name;
    let runs = &section.runs;
    if runs.iter().any(|r| !r.cdf.is_empty()) {
        out.push(("cdf", format!("{name}: own-move delay CDF"), cdf(runs, name)?));
    }
    if runs.iter().any(|r| r.box_ms.is_some()) {
        out.push(("box", format!("{name}: own-move delay box plots"), boxes(runs, name)?));
    }
    let any_seconds = runs.iter().any(|r| !r.seconds.is_empty());
    if any_seconds {
        out.push(("delay", format!("{name}: delay over time"), over_time_delay(runs, name)?));
        out.push((
            "acked",
            format!("{name}: moves acked per second"),
            over_time(runs, &format!("{name}: moves acked / s"), "acks / s", true, |s| s.acked)?,
        ));
        out.push((
            "notifications",
            format!("{name}: notifications per second"),
            over_time(
                runs,
                &format!("{name}: notifications / s"),
                "notifications / s",
                true,
                |s| s.notifications,
            )?,
        ));
        out.push((
            "bots",
            format!("{name}: bots connected"),
            over_time(runs, &format!("{name}: bots online"), "bots", false, |s| s.bots)?,
        ));
    }
    if runs.iter().any(|r| !r.ramp.is_empty()) {
        out.push(("ramp", format!("{name}: ramp steps"), ramp(runs, name)?));
    }
    Ok(out.into_iter().map(|(kind, title, svg)| (kind.to_owned(), title, svg)).collect())
}

/// The padded `[low, high]` of values, never empty.
fn span(values: impl Iterator<Item = f64>, floor: f64) -> (f64, f64) {
    let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        low = low.min(v);
        high = high.max(v);
    }
    if !low.is_finite() {
        return (floor, floor + 1.0);
    }
    if high <= low {
        high = low + 1.0;
    }
    (low.max(floor), high)
}

fn draw_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a plot: {error}")
}

fn cdf(runs: &[Run], name: &str) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let (low, high) = span(runs.iter().flat_map(|r| r.cdf.iter().map(|p| p.0)), 0.01);
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{name}: own-move delay CDF"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((low * 0.9..high * 1.1).log_scale(), 0.0..1.0)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc("delay (ms, log scale)")
            .y_desc("fraction of moves")
            .draw()
            .map_err(draw_error)?;
        for (index, run) in runs.iter().enumerate() {
            let c = colour(index);
            // A step function: each point's fraction holds up to the next value.
            let mut points = Vec::with_capacity(run.cdf.len() * 2 + 1);
            let mut previous = 0.0;
            for &(value, fraction) in &run.cdf {
                points.push((value.max(low), previous));
                points.push((value.max(low), fraction));
                previous = fraction;
            }
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(draw_error)?
                .label(run.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(draw_error)
}

fn boxes(runs: &[Run], name: &str) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let (low, high) =
            span(runs.iter().filter_map(|r| r.box_ms).flat_map(|b| [b.p1, b.p99]), 0.0);
        let n = runs.len().max(1) as f64;
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{name}: delay p1 / p25 / p50 / p75 / p99"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(-0.5..n - 0.5, 0.0..high * 1.1 + low * 0.0)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .disable_x_mesh()
            .x_labels(runs.len().max(1))
            .x_label_formatter(&|x| {
                let index = x.round();
                if (x - index).abs() < 0.01 && index >= 0.0 {
                    labels.get(index as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("delay (ms)")
            .draw()
            .map_err(draw_error)?;
        for (index, run) in runs.iter().enumerate() {
            let Some(b) = run.box_ms else { continue };
            let c = colour(index);
            let x = index as f64;
            let half = 0.25;
            chart
                .draw_series([
                    Rectangle::new([(x - half, b.p25), (x + half, b.p75)], c.mix(0.3).filled()),
                    Rectangle::new([(x - half, b.p25), (x + half, b.p75)], c.stroke_width(2)),
                ])
                .map_err(draw_error)?;
            let line = |points: Vec<(f64, f64)>, width: u32| {
                PathElement::new(points, c.stroke_width(width))
            };
            chart
                .draw_series([
                    line(vec![(x - half, b.p50), (x + half, b.p50)], 3),
                    line(vec![(x, b.p75), (x, b.p99)], 1),
                    line(vec![(x, b.p1), (x, b.p25)], 1),
                    line(vec![(x - half / 2.0, b.p99), (x + half / 2.0, b.p99)], 1),
                    line(vec![(x - half / 2.0, b.p1), (x + half / 2.0, b.p1)], 1),
                ])
                .map_err(draw_error)?;
        }
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

type LinearChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A plot on linear axes from 0: the frame, the mesh and the legend are the same for
/// every such plot; `draw` adds the series.
fn linear_plot(
    caption: &str,
    (x_max, y_max): (f64, f64),
    (x_desc, y_desc): (&str, &str),
    draw: impl FnOnce(&mut LinearChart<'_, '_>) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max * 1.1)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .y_label_formatter(&|v| compact(*v))
            .draw()
            .map_err(draw_error)?;
        draw(&mut chart)?;
        // Time series and ramps start low on the left; the legend covers least there.
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// Draws one run's line in its colour, with a legend entry.
fn labelled_line(
    chart: &mut LinearChart<'_, '_>,
    points: impl IntoIterator<Item = (f64, f64)>,
    index: usize,
    label: String,
) -> anyhow::Result<()> {
    let c = colour(index);
    chart
        .draw_series(LineSeries::new(points, c.stroke_width(2)))
        .map_err(draw_error)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    Ok(())
}

fn over_time_delay(runs: &[Run], name: &str) -> anyhow::Result<String> {
    let t_max = span(runs.iter().flat_map(|r| r.seconds.iter().map(|s| s.t)), 0.0).1;
    let high = span(runs.iter().flat_map(|r| r.seconds.iter().filter_map(|s| s.p99_ms)), 0.0).1;
    let caption = format!("{name}: delay per second (thick p99, thin p50)");
    linear_plot(&caption, (t_max, high), ("time (s)", "delay (ms)"), |chart| {
        for (index, run) in runs.iter().enumerate() {
            let p99 = run.seconds.iter().filter_map(|s| Some((s.t, s.p99_ms?)));
            labelled_line(chart, p99, index, run.label.clone())?;
            let p50 = run.seconds.iter().filter_map(|s| Some((s.t, s.p50_ms?)));
            chart
                .draw_series(LineSeries::new(p50, colour(index).stroke_width(1)))
                .map_err(draw_error)?;
        }
        Ok(())
    })
}

/// A per-second series of every run; `rate` divides each value by its interval's length.
fn over_time(
    runs: &[Run],
    caption: &str,
    y_desc: &str,
    rate: bool,
    value: impl Fn(&super::Second) -> f64,
) -> anyhow::Result<String> {
    let series: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|run| {
            let mut previous_t = 0.0;
            run.seconds
                .iter()
                .filter_map(|s| {
                    let span = s.t - previous_t;
                    previous_t = s.t;
                    match rate {
                        // A last, partial interval makes a meaningless spike or dip.
                        true if span < MIN_RATE_SPAN_S => None,
                        true => Some((s.t, value(s) / span)),
                        false => Some((s.t, value(s))),
                    }
                })
                .collect()
        })
        .collect();
    let t_max = span(series.iter().flatten().map(|p| p.0), 0.0).1;
    let high = span(series.iter().flatten().map(|p| p.1), 0.0).1;
    linear_plot(caption, (t_max, high), ("time (s)", y_desc), |chart| {
        for (index, (run, points)) in runs.iter().zip(series).enumerate() {
            labelled_line(chart, points, index, run.label.clone())?;
        }
        Ok(())
    })
}

fn ramp(runs: &[Run], name: &str) -> anyhow::Result<String> {
    let bots_max = span(runs.iter().flat_map(|r| r.ramp.iter().map(|s| s.bots)), 0.0).1;
    let high = span(runs.iter().flat_map(|r| r.ramp.iter().filter_map(|s| s.p99_ms)), 0.0).1;
    let caption = format!("{name}: ramp, p99 per step (hollow = failed)");
    linear_plot(&caption, (bots_max * 1.05, high), ("bots", "p99 delay (ms)"), |chart| {
        for (index, run) in runs.iter().enumerate() {
            let c = colour(index);
            let points: Vec<(f64, f64, bool)> =
                run.ramp.iter().filter_map(|s| Some((s.bots, s.p99_ms?, s.passed))).collect();
            let label = match run.largest_passing {
                Some(n) => format!("{} (largest passing {n})", run.label),
                None => format!("{} (no step passed)", run.label),
            };
            labelled_line(chart, points.iter().map(|p| (p.0, p.1)), index, label)?;
            chart
                .draw_series(points.iter().map(|&(x, y, passed)| {
                    let style = if passed { c.filled() } else { c.stroke_width(2) };
                    Circle::new((x, y), 4, style)
                }))
                .map_err(draw_error)?;
        }
        Ok(())
    })
}
