//! The SVG plot of restore time against dirty fraction, parsed as a reader's program would.

use std::collections::BTreeSet;

use kreplay_benches::{BenchRow, Operation, write_svg};
use kreplay_snapshot::{RestoreStrategy, StoreTier};

const FOOTPRINT: u64 = 1 << 30;
const COPY_MS: f64 = 80.0;
const READ_MS: f64 = 40.0;
const FRACTIONS: [f64; 5] = [0.0, 0.001, 0.01, 0.5, 1.0];

fn row(
    op: Operation,
    strategy: Option<RestoreStrategy>,
    tier: Option<StoreTier>,
    dirty: f64,
    ms: f64,
) -> BenchRow {
    BenchRow {
        footprint: FOOTPRINT,
        dirty_fraction: dirty,
        strategy,
        tier,
        operation: op,
        seconds: ms / 1e3,
        gbps: 1.0,
        ceiling_gbps: 1.0,
        ratio: 1.0,
    }
}

/// Ceilings, and restores of three strategies on three tiers: a full restore costs the copy
/// ceiling at every fraction, hash and write-set restores grow with the dirty fraction.
fn rows() -> Vec<BenchRow> {
    let mut rows = vec![
        row(Operation::Memcpy, None, None, 0.0, COPY_MS),
        row(Operation::ReadPass, None, None, 0.0, READ_MS),
        // Another footprint's restore: not on the plot (the largest footprint is).
        BenchRow {
            footprint: 1 << 20,
            ..row(
                Operation::Restore,
                Some(RestoreStrategy::Full),
                Some(StoreTier::Host),
                0.5,
                0.1,
            )
        },
    ];
    for tier in [StoreTier::Host, StoreTier::File, StoreTier::Device] {
        let slow = match tier {
            StoreTier::File => 1.5,
            StoreTier::Device => 0.5,
            _ => 1.0,
        };
        for strategy in [
            RestoreStrategy::Full,
            RestoreStrategy::Hash,
            RestoreStrategy::Writeset,
        ] {
            for f in FRACTIONS {
                let ms = match strategy {
                    RestoreStrategy::Full => COPY_MS,
                    RestoreStrategy::Hash => READ_MS + COPY_MS * f,
                    _ => 0.02 + COPY_MS * f,
                } * slow;
                rows.push(row(Operation::Restore, Some(strategy), Some(tier), f, ms));
            }
        }
    }
    rows
}

fn svg() -> String {
    let mut out = Vec::new();
    write_svg(&rows(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(dir.join("restore-plot.svg"), &text).unwrap();
    text
}

/// A drawn element: its tag, colour (fill, else stroke), whether filled, and its points.
#[derive(Debug)]
struct Shape {
    tag: String,
    color: String,
    filled: bool,
    stroke_width: String,
    points: Vec<(f64, f64)>,
}

fn parse(svg: &str) -> (Vec<Shape>, Vec<(String, f64, f64)>) {
    let doc = roxmltree::Document::parse(svg).expect("the plot is well-formed XML");
    let mut shapes = Vec::new();
    let mut texts = Vec::new();
    let num = |n: roxmltree::Node<'_, '_>, a: &str| {
        n.attribute(a).map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    for n in doc.descendants().filter(roxmltree::Node::is_element) {
        let tag = n.tag_name().name().to_owned();
        let points = match tag.as_str() {
            "polyline" | "polygon" => n
                .attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect(),
            "line" => vec![(num(n, "x1"), num(n, "y1")), (num(n, "x2"), num(n, "y2"))],
            "circle" => vec![(num(n, "cx"), num(n, "cy"))],
            "rect" => vec![(
                num(n, "x") + num(n, "width") / 2.0,
                num(n, "y") + num(n, "height") / 2.0,
            )],
            "text" => {
                let text = n.text().unwrap_or("").trim().to_owned();
                texts.push((text, num(n, "x"), num(n, "y")));
                continue;
            }
            _ => continue,
        };
        let fill = n.attribute("fill").unwrap_or("none");
        let filled = fill != "none";
        let color = if filled {
            fill
        } else {
            n.attribute("stroke").unwrap_or("none")
        };
        shapes.push(Shape {
            tag,
            color: color.to_owned(),
            filled,
            stroke_width: n.attribute("stroke-width").unwrap_or("").to_owned(),
            points,
        });
    }
    (shapes, texts)
}

/// The default matrix's nine series, in legend order.
const SERIES: [&str; 9] = [
    "full / device",
    "full / file",
    "full / host",
    "hash / device",
    "hash / file",
    "hash / host",
    "writeset / device",
    "writeset / file",
    "writeset / host",
];

/// A data line: a polyline of width 2 through a point per measured fraction, across the plot
/// (markers drawn as closed paths are a few pixels wide).
fn is_series_line(s: &Shape) -> bool {
    s.tag == "polyline"
        && s.stroke_width == "2"
        && s.points.len() >= 3
        && s.points[s.points.len() - 1].0 - s.points[0].0 > 100.0
}

fn series_lines(shapes: &[Shape]) -> Vec<&Shape> {
    shapes.iter().filter(|s| is_series_line(s)).collect()
}

/// The line of the series whose points are (restore ms at each fraction) `ms`, found by shape.
fn line_at<'a>(shapes: &'a [Shape], label: &str) -> &'a Shape {
    let i = SERIES.iter().position(|s| *s == label).unwrap();
    series_lines(shapes)[i]
}

#[test]
fn every_series_has_its_own_colour_and_marker_and_a_point_per_fraction() {
    let (shapes, texts) = parse(&svg());
    let lines = series_lines(&shapes);
    assert_eq!(
        lines.len(),
        SERIES.len(),
        "one line per strategy and tier of the largest footprint"
    );
    let colors: BTreeSet<&str> = lines.iter().map(|l| l.color.as_str()).collect();
    assert_eq!(colors.len(), SERIES.len(), "distinct colours: {colors:?}");
    for l in &lines {
        assert_eq!(
            l.points.len(),
            FRACTIONS.len(),
            "the 1 MiB footprint's row is not on the plot"
        );
    }
    // Markers: every element of a series colour that is not its line. A cross is two lines.
    let mut signatures = BTreeSet::new();
    for line in &lines {
        let markers: Vec<&Shape> = shapes
            .iter()
            .filter(|s| s.color == line.color && !is_series_line(s))
            // The legend's line sample.
            .filter(|s| {
                !(s.tag == "polyline" && s.points.len() == 2 && s.points[0].1 == s.points[1].1)
            })
            .collect();
        let kinds: BTreeSet<(String, usize, bool)> = markers
            .iter()
            .map(|m| (m.tag.clone(), m.points.len(), m.filled))
            .collect();
        assert_eq!(kinds.len(), 1, "one marker shape per series: {kinds:?}");
        let per_point = if markers[0].tag == "line" { 2 } else { 1 };
        // A marker on every point, and one in the legend.
        assert_eq!(
            markers.len(),
            per_point * (FRACTIONS.len() + 1),
            "{}",
            line.color
        );
        for p in &line.points {
            assert!(
                markers.iter().any(|m| m
                    .points
                    .iter()
                    .any(|q| (q.0 - p.0).abs() <= 6.0 && (q.1 - p.1).abs() <= 6.0)),
                "a marker at {p:?}"
            );
        }
        signatures.insert(kinds.into_iter().next().unwrap());
    }
    assert_eq!(
        signatures.len(),
        SERIES.len(),
        "distinct markers: {signatures:?}"
    );
    for name in SERIES {
        assert!(texts.iter().any(|t| t.0 == name), "legend entry {name}");
    }
}

fn text_at<'a>(texts: &'a [(String, f64, f64)], label: &str) -> &'a (String, f64, f64) {
    texts
        .iter()
        .find(|t| t.0 == label)
        .unwrap_or_else(|| panic!("tick label {label} in {texts:?}"))
}

#[test]
fn both_axes_are_logarithmic_with_zero_at_the_left_end_and_readable_ticks() {
    let (shapes, texts) = parse(&svg());
    for tick in ["0%", "0.1%", "1%", "10%", "100%", "0.1", "1", "10", "100"] {
        text_at(&texts, tick);
    }
    let xs: Vec<f64> = line_at(&shapes, "full / host")
        .points
        .iter()
        .map(|p| p.0)
        .collect();
    // Fractions 0, 0.1%, 1%, 50%, 100%: 0.1% → 1% is a decade, 50% → 100% a factor of 2.
    let decade = xs[2] - xs[1];
    assert!(decade > 100.0, "{xs:?}");
    let factor_two = (xs[4] - xs[3]) / decade;
    assert!((factor_two - 2f64.log10()).abs() < 0.02, "{xs:?}");
    assert!(xs[0] < xs[1], "0% left of 0.1%");
    assert!(
        ((xs[1] - xs[0]) / decade - 1.0).abs() < 0.02,
        "0 drawn a decade below 0.1%: {xs:?}"
    );
    // Tick labels sit at the points of their fraction.
    assert!((text_at(&texts, "1%").1 - xs[2]).abs() <= 1.0);
    assert!((text_at(&texts, "0%").1 - xs[0]).abs() <= 1.0);
    // Restore time: 80 ms (full) and 40 ms (hash at 0%) are log10(2) of a decade apart.
    let y_decade = text_at(&texts, "1").2 - text_at(&texts, "10").2;
    let y80 = line_at(&shapes, "full / host").points[0].1;
    let y40 = line_at(&shapes, "hash / host").points[0].1;
    assert!(
        (((y40 - y80) / y_decade) - 2f64.log10()).abs() < 0.02,
        "{y40} {y80} {y_decade}"
    );
}

#[test]
fn the_ceilings_are_drawn_as_reference_lines_at_their_times() {
    let (shapes, texts) = parse(&svg());
    for label in [
        "copy ceiling, whole footprint",
        "read ceiling, whole footprint",
        "copy ceiling × dirty fraction",
    ] {
        assert!(texts.iter().any(|t| t.0 == label), "legend entry {label}");
    }
    let full = &line_at(&shapes, "full / host").points;
    let hash = &line_at(&shapes, "hash / host").points;
    let (left, right) = (full[0].0, full[FRACTIONS.len() - 1].0);
    // The dashes of one reference line: short thin segments of one colour.
    let dashes = |color: &str| -> Vec<&Shape> {
        shapes
            .iter()
            .filter(|s| {
                s.tag == "polyline"
                    && s.color == color
                    && s.stroke_width == "1"
                    && s.points.len() == 2
            })
            .filter(|s| s.points[0].0 >= left - 20.0 && s.points[1].0 <= right + 20.0)
            .collect()
    };
    let horizontal_at = |color: &str, y: f64| {
        let on_line: Vec<&Shape> = dashes(color)
            .into_iter()
            .filter(|s| s.points.iter().all(|p| (p.1 - y).abs() <= 1.0))
            .collect();
        assert!(on_line.len() >= 10, "dashed line of {color} at y {y}");
        let from = on_line
            .iter()
            .map(|s| s.points[0].0)
            .fold(f64::INFINITY, f64::min);
        let to = on_line.iter().map(|s| s.points[1].0).fold(0.0, f64::max);
        assert!(
            from <= left && to >= right - 12.0,
            "{color} spans the plot: {from}..{to}"
        );
    };
    // The copy ceiling's time is a full restore's (80 ms), the read ceiling's a hash restore at
    // 0% (40 ms).
    horizontal_at("#000000", full[0].1);
    horizontal_at("#9A9A9A", hash[0].1);
    // Copy ceiling × dirty fraction: rises from 0.1% to meet the copy ceiling at 100%.
    let scaled = dashes("#606060");
    assert!(scaled.len() >= 10);
    let first = scaled
        .iter()
        .map(|s| s.points[0])
        .fold((f64::INFINITY, 0.0), |a, p| if p.0 < a.0 { p } else { a });
    let last = scaled
        .iter()
        .map(|s| s.points[1])
        .fold((0.0, 0.0), |a, p| if p.0 > a.0 { p } else { a });
    assert!(
        (first.0 - full[1].0).abs() <= 2.0 && (last.0 - right).abs() <= 12.0,
        "{first:?} {last:?}"
    );
    assert!(
        (last.1 - full[4].1).abs() <= 12.0 && first.1 > last.1 + 200.0,
        "{first:?} {last:?}"
    );
}

#[test]
fn a_plot_without_rows_is_still_a_valid_svg() {
    let mut out = Vec::new();
    write_svg(&[], &mut out).unwrap();
    parse(&String::from_utf8(out).unwrap());
}
