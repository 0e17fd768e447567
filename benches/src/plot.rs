//! The SVG plot of `kreplay bench --svg`: restore time against dirty fraction, drawn with
//! plotters' SVG backend.
//!
//! Both axes are logarithmic: dirty fractions usually span decades (0, 0.1%, 1%, 10%, 100%)
//! and restore times of different strategies differ by orders of magnitude. A dirty fraction of
//! 0 has no logarithm; it is drawn at the left end of the axis, labelled `0%`, a decade below
//! the smallest measured fraction. Every series (strategy / tier) has its own colour and marker;
//! the ceilings are reference lines: the copy and read ceilings of the whole footprint
//! (horizontal) and the copy ceiling scaled by the dirty fraction (what a restore that moves
//! only the dirty bytes would cost at the copy ceiling).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::matrix::{BenchRow, Operation};
use crate::output::{format_bytes, format_percent};

const WIDTH: u32 = 980;
const HEIGHT: u32 = 560;
/// Width of the legend column right of the chart.
const LEGEND_WIDTH: u32 = 270;

/// Series colours: Tableau's ten less its grey (grey is for reference lines), enough for the
/// default matrix (three strategies on three tiers); more series get evenly spaced hues.
const PALETTE: [RGBColor; 9] = [
    RGBColor(0x1F, 0x77, 0xB4),
    RGBColor(0xFF, 0x7F, 0x0E),
    RGBColor(0x2C, 0xA0, 0x2C),
    RGBColor(0xD6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xBD),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0xE3, 0x77, 0xC2),
    RGBColor(0xBC, 0xBD, 0x22),
    RGBColor(0x17, 0xBE, 0xCF),
];

/// The colour of series `i` of `n`.
fn series_color(i: usize, n: usize) -> RGBColor {
    if n <= PALETTE.len() {
        return PALETTE[i];
    }
    // More series than the palette: evenly spaced hues at one lightness.
    let (r, g, b) = HSLColor(i as f64 / n as f64, 0.75, 0.42).rgb();
    RGBColor(r, g, b)
}

/// The marker shapes, one per series in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
    OpenCircle,
    OpenSquare,
    OpenTriangle,
    OpenDiamond,
}

/// As many shapes as [`PALETTE`] has colours.
const MARKERS: [Marker; 9] = [
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
    Marker::OpenCircle,
    Marker::OpenSquare,
    Marker::OpenTriangle,
    Marker::OpenDiamond,
];

/// Runs `$body` with `$draw` bound to a closure that makes the element of marker `$shape` in
/// `$color`, centred on a coordinate (a chart coordinate or, in the legend, a pixel). A macro
/// rather than a function: each shape is its own element type.
macro_rules! with_marker {
    ($shape:expr, $color:expr, |$draw:ident| $body:expr) => {{
        let color: RGBColor = $color;
        let filled = color.filled();
        let outline = color.stroke_width(2);
        match $shape {
            Marker::Circle => {
                let $draw = |at| EmptyElement::at(at) + Circle::new((0, 0), 4, filled);
                $body
            }
            Marker::Square => {
                let $draw = |at| EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], filled);
                $body
            }
            Marker::Triangle => {
                let $draw = |at| EmptyElement::at(at) + TriangleMarker::new((0, 0), 6, filled);
                $body
            }
            Marker::Diamond => {
                let $draw = |at| {
                    EmptyElement::at(at)
                        + Polygon::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0)], filled)
                };
                $body
            }
            Marker::Cross => {
                let $draw = |at| EmptyElement::at(at) + Cross::new((0, 0), 5, outline);
                $body
            }
            Marker::OpenCircle => {
                let $draw = |at| EmptyElement::at(at) + Circle::new((0, 0), 4, outline);
                $body
            }
            Marker::OpenSquare => {
                let $draw = |at| EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], outline);
                $body
            }
            // Polygons are always filled: open ones are closed paths.
            Marker::OpenTriangle => {
                let $draw = |at| {
                    EmptyElement::at(at)
                        + PathElement::new(vec![(0, -6), (5, 3), (-5, 3), (0, -6)], outline)
                };
                $body
            }
            Marker::OpenDiamond => {
                let $draw = |at| {
                    EmptyElement::at(at)
                        + PathElement::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0), (0, -5)], outline)
                };
                $body
            }
        }
    }};
}

/// A logarithmic axis from `start` to `end` (both above 0) with given ticks; values at or below
/// 0 are drawn at `zero` (by default `start`).
#[derive(Clone, Debug)]
struct LogAxis {
    start: f64,
    end: f64,
    zero: f64,
    /// Labelled ticks.
    bold: Vec<f64>,
    /// Unlabelled grid lines between them.
    light: Vec<f64>,
}

impl LogAxis {
    /// An axis covering `lo..=hi` (both above 0) with a margin of `pad` decades on each side:
    /// labels at 1, 2 and 5 times the powers of ten when fewer than three decades are covered,
    /// at the powers of ten otherwise.
    fn covering(lo: f64, hi: f64, pad: f64) -> LogAxis {
        let (start, end) = (lo / 10f64.powf(pad), hi * 10f64.powf(pad));
        let decades = (end / start).log10();
        let steps: &[f64] = if decades < 3.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let (mut bold, mut light) = (Vec::new(), Vec::new());
        let mut power = 10f64.powf(start.log10().floor());
        while power <= end {
            for m in 1..10 {
                let v = power * m as f64;
                if v >= start && v <= end {
                    if steps.contains(&(m as f64)) {
                        bold.push(v);
                    } else {
                        light.push(v);
                    }
                }
            }
            power *= 10.0;
        }
        LogAxis {
            start,
            end,
            zero: start,
            bold,
            light,
        }
    }

    /// Where `v` lies along the axis, 0 at `start` and 1 at `end`.
    fn position(&self, v: f64) -> f64 {
        let v = if v > 0.0 { v } else { self.zero };
        (v.log10() - self.start.log10()) / (self.end.log10() - self.start.log10())
    }
}

impl Ranged for LogAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = f64::from(limit.1 - limit.0);
        limit.0 + (span * self.position(*value)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.start..self.end
    }
}

/// The dirty-fraction axis: decades from the smallest measured non-zero fraction to 100%, and
/// 0 (when measured) a decade further left, at the axis' start.
fn dirty_axis(fractions: &[f64]) -> LogAxis {
    let smallest = fractions
        .iter()
        .copied()
        .filter(|&f| f > 0.0)
        .fold(1.0f64, f64::min);
    let first_decade = 10f64.powf(smallest.log10().floor()).min(0.1);
    let mut axis = LogAxis::covering(first_decade, 1.0, 0.0);
    // Powers of ten only (the 1-2-5 steps would crowd a percentage axis).
    axis.light.extend(axis.bold.iter().copied().filter(|&v| {
        let exponent = v.log10();
        (exponent - exponent.round()).abs() > 1e-9
    }));
    axis.bold.retain(|&v| {
        let exponent = v.log10();
        (exponent - exponent.round()).abs() < 1e-9
    });
    axis.light.sort_by(f64::total_cmp);
    if fractions.contains(&0.0) {
        // 0 sits a decade below the first decade (no grid lines between: the stretch is not
        // logarithmic), with a little room left of it for its markers.
        axis.zero = first_decade / 10.0;
        axis.start = axis.zero / 10f64.powf(0.08);
        axis.bold.insert(0, 0.0);
    } else {
        axis.start = first_decade / 10f64.powf(0.08);
    }
    // As much room right of 100%.
    axis.end = 10f64.powf(0.08);
    axis
}

/// A restore time tick in milliseconds, with as many decimals as it needs.
fn format_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-v.log10() - 1e-9).ceil().max(1.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// A reference line of the plot.
struct Reference {
    label: String,
    /// (dirty fraction, restore ms) end points.
    points: Vec<(f64, f64)>,
    color: RGBColor,
    /// Dash length and gap, in pixels.
    dash: (u32, u32),
}

/// Write an SVG plot of restore time (ms) against dirty fraction for the largest footprint
/// among the rows: one line per strategy and tier, each with its own colour and marker, and the
/// ceilings as dashed reference lines: the copy and read ceilings of the whole footprint
/// (horizontal) and the copy ceiling scaled by the dirty fraction.
///
/// Both axes are logarithmic; a dirty fraction of 0 is drawn at the left end of its axis,
/// labelled `0%`, a decade below the smallest measured non-zero fraction.
pub fn write_svg(rows: &[BenchRow], mut w: impl Write) -> io::Result<()> {
    let text = render_svg(rows).map_err(io::Error::other)?;
    w.write_all(text.as_bytes())
}

fn render_svg(rows: &[BenchRow]) -> Result<String, String> {
    let footprint = rows
        .iter()
        .filter(|r| r.operation == Operation::Restore)
        .map(|r| r.footprint)
        .max()
        .unwrap_or(0);
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.operation == Operation::Restore && r.footprint == footprint)
    {
        let name = |v: Option<&'static str>| v.unwrap_or("-");
        let label = format!(
            "{} / {}",
            name(r.strategy.map(|s| s.as_str())),
            name(r.tier.map(|t| t.as_str()))
        );
        series
            .entry(label)
            .or_default()
            .push((r.dirty_fraction, r.seconds * 1e3));
    }
    for points in series.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let mut fractions: Vec<f64> = series.values().flatten().map(|p| p.0).collect();
    fractions.sort_by(f64::total_cmp);
    fractions.dedup();

    let ceiling_ms = |op: Operation| {
        rows.iter()
            .find(|r| r.operation == op && r.footprint == footprint)
            .map(|r| r.seconds * 1e3)
    };
    let x = dirty_axis(&fractions);
    let (x_lo, x_hi) = (x.start, x.end);
    let mut references = Vec::new();
    if let Some(ms) = ceiling_ms(Operation::Memcpy) {
        references.push(Reference {
            label: "copy ceiling, whole footprint".into(),
            points: vec![(x_lo, ms), (x_hi, ms)],
            color: BLACK,
            dash: (10, 5),
        });
    }
    if let Some(ms) = ceiling_ms(Operation::ReadPass) {
        references.push(Reference {
            label: "read ceiling, whole footprint".into(),
            points: vec![(x_lo, ms), (x_hi, ms)],
            color: RGBColor(0x9A, 0x9A, 0x9A),
            dash: (10, 5),
        });
    }
    // The time axis covers the series and the horizontal ceilings.
    let times = series
        .values()
        .flatten()
        .map(|p| p.1)
        .chain(references.iter().flat_map(|r| r.points.iter().map(|p| p.1)))
        .filter(|&ms| ms > 0.0 && ms.is_finite());
    let (lo, hi) = times.fold((f64::INFINITY, 0.0f64), |(lo, hi), ms| {
        (lo.min(ms), hi.max(ms))
    });
    let (lo, hi) = if lo <= hi {
        (lo, hi.max(lo * 1.01))
    } else {
        (1e-3, 1.0)
    };
    let y = LogAxis::covering(lo, hi, 0.12);
    if let Some(ms) = ceiling_ms(Operation::Memcpy) {
        // From the first decade of the dirty axis, or from where it enters the time axis.
        let first = x.bold.iter().copied().find(|&f| f > 0.0).unwrap_or(0.01);
        let first = first.max(y.start / ms);
        if first < 1.0 {
            references.push(Reference {
                label: "copy ceiling × dirty fraction".into(),
                points: vec![(first, ms * first), (1.0, ms)],
                color: RGBColor(0x60, 0x60, 0x60),
                dash: (3, 4),
            });
        }
    }

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| format!("cannot draw the plot: {e}");
        root.fill(&WHITE).map_err(e)?;
        let root = root
            .titled(
                &format!(
                    "Restore time vs dirty fraction ({} footprint)",
                    format_bytes(footprint)
                ),
                ("sans-serif", 24),
            )
            .map_err(e)?;
        let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("dirty fraction of chunks (log scale; 0 at the left end)")
            .y_desc("restore time, ms (log scale)")
            .x_label_formatter(&|v| format_percent(*v))
            .y_label_formatter(&|v| format_ms(*v))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .bold_line_style(BLACK.mix(0.18))
            .light_line_style(BLACK.mix(0.06))
            .draw()
            .map_err(e)?;
        let n = series.len();
        for (i, points) in series.values().enumerate() {
            let color = series_color(i, n);
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(e)?;
            let shape = MARKERS[i % MARKERS.len()];
            with_marker!(shape, color, |draw| chart
                .draw_series(points.iter().map(|&p| draw(p)))
                .map(drop))
            .map_err(e)?;
        }

        // The reference lines last, thin, so a series running along a ceiling does not hide it.
        for r in &references {
            chart
                .draw_series(DashedLineSeries::new(
                    r.points.iter().copied(),
                    r.dash.0,
                    r.dash.1,
                    r.color.stroke_width(1),
                ))
                .map_err(e)?;
        }

        // The legend, beside the chart: series first, then the reference lines.
        let line_x = (8, 40);
        let mut row_y = 70;
        let legend_text = ("sans-serif", 16).into_font();
        let heading = ("sans-serif", 16).into_font().style(FontStyle::Bold);
        legend_area
            .draw(&Text::new(
                "strategy / tier",
                (line_x.0, row_y - 30),
                heading.clone(),
            ))
            .map_err(e)?;
        for (i, name) in series.keys().enumerate() {
            let color = series_color(i, n);
            legend_area
                .draw(&PathElement::new(
                    vec![(line_x.0, row_y), (line_x.1, row_y)],
                    color.stroke_width(2),
                ))
                .map_err(e)?;
            let at = ((line_x.0 + line_x.1) / 2, row_y);
            with_marker!(MARKERS[i % MARKERS.len()], color, |draw| legend_area
                .draw(&draw(at)))
            .map_err(e)?;
            legend_area
                .draw(&Text::new(
                    name.clone(),
                    (line_x.1 + 8, row_y - 7),
                    legend_text.clone(),
                ))
                .map_err(e)?;
            row_y += 22;
        }
        row_y += 30;
        legend_area
            .draw(&Text::new(
                "reference lines",
                (line_x.0, row_y - 30),
                heading,
            ))
            .map_err(e)?;
        for r in &references {
            legend_area
                .draw(&DashedPathElement::new(
                    vec![(line_x.0, row_y), (line_x.1, row_y)],
                    r.dash.0,
                    r.dash.1,
                    r.color.stroke_width(2),
                ))
                .map_err(e)?;
            legend_area
                .draw(&Text::new(
                    r.label.clone(),
                    (line_x.1 + 8, row_y - 7),
                    legend_text.clone(),
                ))
                .map_err(e)?;
            row_y += 22;
        }
        root.present().map_err(e)?;
    }
    Ok(svg)
}
