//! Writers for matrix rows: a text table, CSV, and an SVG plot of restore time against dirty
//! fraction.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::matrix::{BenchRow, Operation};

fn label_or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// A human-readable size: `256MiB`, `1GiB`, `1536KiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    for (unit, name) in UNITS {
        if bytes >= unit {
            return format!("{:.1}{name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes}B")
}

/// The rows as an aligned text table, with the ceiling beside every figure.
pub fn format_table(rows: &[BenchRow]) -> String {
    let header = [
        "footprint",
        "dirty",
        "strategy",
        "tier",
        "operation",
        "time",
        "GB/s",
        "ceiling",
        "ceiling GB/s",
        "ratio",
    ];
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                format_bytes(r.footprint),
                format_percent(r.dirty_fraction),
                label_or_dash(r.strategy),
                label_or_dash(r.tier),
                r.operation.to_string(),
                format_seconds(r.seconds),
                format!("{:.2}", r.gbps),
                r.operation.ceiling().to_string(),
                format!("{:.2}", r.ceiling_gbps),
                format!("{:.3}", r.ratio),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let mut line = |fields: &[String]| {
        for (i, (f, w)) in fields.iter().zip(widths).enumerate() {
            // Text columns left-aligned, numbers right-aligned.
            if i < 5 || i == 7 {
                let _ = write!(out, "{f:<w$}  ");
            } else {
                let _ = write!(out, "{f:>w$}  ");
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &cells {
        line(row);
    }
    out
}

/// A fraction as a percentage: `1%`, `0.5%`, `12.5%`.
pub fn format_percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        let text = format!("{p:.3}");
        format!("{}%", text.trim_end_matches('0'))
    }
}

/// A duration in the most readable unit.
pub fn format_seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3}s")
    } else if s >= 1e-3 {
        format!("{:.3}ms", s * 1e3)
    } else {
        format!("{:.1}us", s * 1e6)
    }
}

/// The header line of [`write_csv`] (without the newline).
pub const CSV_HEADER: &str = "footprint_bytes,dirty_fraction,strategy,tier,operation,seconds,gb_per_s,ceiling,ceiling_gb_per_s,ratio";

/// Write the rows as CSV with a header line ([`CSV_HEADER`]); `ceiling` names the operation the
/// row is compared to.
pub fn write_csv(rows: &[BenchRow], mut w: impl Write) -> io::Result<()> {
    writeln!(w, "{CSV_HEADER}")?;
    for r in rows {
        writeln!(
            w,
            "{},{},{},{},{},{:.9},{:.4},{},{:.4},{:.5}",
            r.footprint,
            r.dirty_fraction,
            r.strategy.map_or("", |s| s.as_str()),
            r.tier.map_or("", |t| t.as_str()),
            r.operation,
            r.seconds,
            r.gbps,
            r.operation.ceiling(),
            r.ceiling_gbps,
            r.ratio
        )?;
    }
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Write an SVG plot of restore time (ms) against dirty fraction for the largest footprint
/// among the rows: one line per strategy and tier, and a dashed line at the time of a copy of
/// the whole footprint at the copy ceiling.
pub fn write_svg(rows: &[BenchRow], mut w: impl Write) -> io::Result<()> {
    let footprint = rows
        .iter()
        .filter(|r| r.operation == Operation::Restore)
        .map(|r| r.footprint)
        .max()
        .unwrap_or(0);
    let restores: Vec<&BenchRow> = rows
        .iter()
        .filter(|r| r.operation == Operation::Restore && r.footprint == footprint)
        .collect();
    let mut fractions: Vec<f64> = restores.iter().map(|r| r.dirty_fraction).collect();
    fractions.sort_by(f64::total_cmp);
    fractions.dedup();
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &restores {
        let name = format!("{} / {}", label_or_dash(r.strategy), label_or_dash(r.tier));
        series
            .entry(name)
            .or_default()
            .push((r.dirty_fraction, r.seconds * 1e3));
    }
    let memcpy_ms = rows
        .iter()
        .find(|r| r.operation == Operation::Memcpy && r.footprint == footprint)
        .map(|r| r.seconds * 1e3);

    let (width, height) = (760.0, 460.0);
    let (left, right, top, bottom) = (70.0, 200.0, 40.0, 60.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let y_max = series
        .values()
        .flatten()
        .map(|p| p.1)
        .chain(memcpy_ms)
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.1;
    // Dirty fractions are spread evenly (they usually span decades: 0, 1%, 10%, 100%).
    let x_of = |f: f64| {
        let i = fractions.iter().position(|&x| x == f).unwrap_or(0) as f64;
        let n = (fractions.len().max(2) - 1) as f64;
        left + plot_w * i / n
    };
    let y_of = |ms: f64| top + plot_h * (1.0 - ms / y_max);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Restore time vs dirty fraction ({} footprint)</text>"#,
        left + plot_w / 2.0,
        escape(&format_bytes(footprint))
    );
    // Axes and grid.
    let _ = writeln!(
        s,
        r#"<path d="M{left} {top} V{} H{}" stroke="black" fill="none"/>"#,
        top + plot_h,
        left + plot_w
    );
    for i in 0..=5 {
        let v = y_max * i as f64 / 5.0;
        let y = y_of(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.2}</text>"##,
            left + plot_w,
            left - 6.0,
            y + 4.0
        );
    }
    for &f in &fractions {
        let x = x_of(f);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="black"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            top + plot_h,
            top + plot_h + 5.0,
            top + plot_h + 20.0,
            format_percent(f)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">dirty fraction of chunks</text>"#,
        left + plot_w / 2.0,
        height - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">restore time (ms)</text>"#,
        top + plot_h / 2.0
    );
    // Ceiling.
    let mut legend_y = top + 10.0;
    let legend_x = left + plot_w + 20.0;
    if let Some(ms) = memcpy_ms {
        let y = y_of(ms);
        let _ = writeln!(
            s,
            r#"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="black" stroke-dasharray="6 4"/>"#,
            left + plot_w
        );
        let _ = writeln!(
            s,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="black" stroke-dasharray="6 4"/><text x="{}" y="{}">copy ceiling</text>"#,
            legend_x + 24.0,
            legend_x + 30.0,
            legend_y + 4.0
        );
        legend_y += 20.0;
    }
    for (i, (name, points)) in series.iter_mut().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = points
            .iter()
            .map(|&(f, ms)| format!("{:.1},{:.1}", x_of(f), y_of(ms)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(f, ms) in points.iter() {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x_of(f),
                y_of(ms)
            );
        }
        let _ = writeln!(
            s,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            legend_x + 24.0,
            legend_x + 30.0,
            legend_y + 4.0,
            escape(name)
        );
        legend_y += 20.0;
    }
    s.push_str("</svg>\n");
    w.write_all(s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_snapshot::{RestoreStrategy, StoreTier};

    fn row(op: Operation, strategy: Option<RestoreStrategy>, dirty: f64, seconds: f64) -> BenchRow {
        BenchRow {
            footprint: 1 << 30,
            dirty_fraction: dirty,
            strategy,
            tier: strategy.map(|_| StoreTier::Host),
            operation: op,
            seconds,
            gbps: 1.0,
            ceiling_gbps: 2.0,
            ratio: 0.5,
        }
    }

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(format_bytes(256 << 20), "256MiB");
        assert_eq!(format_bytes(1 << 30), "1GiB");
        assert_eq!(format_bytes(1536 << 10), "1536KiB");
        assert_eq!(format_bytes((3 << 19) + 1), "1.5MiB");
        assert_eq!(format_bytes(100), "100B");
        assert_eq!(format_seconds(0.0123), "12.300ms");
        assert_eq!(format_percent(0.1), "10%");
        assert_eq!(format_percent(0.005), "0.5%");
        assert_eq!(format_percent(0.125), "12.5%");
        assert_eq!(format_seconds(2.5e-6), "2.5us");
    }

    #[test]
    fn svg_draws_one_line_per_series_and_the_memcpy_ceiling() {
        let mut rows = vec![row(Operation::Memcpy, None, 0.0, 0.05)];
        for (s, t) in [
            (RestoreStrategy::Full, 0.05),
            (RestoreStrategy::Writeset, 0.001),
        ] {
            for d in [0.0, 0.01, 1.0] {
                rows.push(row(Operation::Restore, Some(s), d, t * (1.0 + d)));
            }
        }
        let mut out = Vec::new();
        write_svg(&rows, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(svg.contains("copy ceiling") && svg.contains("stroke-dasharray"));
        assert!(svg.contains("full / host") && svg.contains("writeset / host"));
        assert!(svg.contains(">1%<") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn csv_and_table_carry_every_row_with_its_ceiling() {
        let rows = vec![
            row(Operation::Memcpy, None, 0.0, 0.05),
            row(Operation::Restore, Some(RestoreStrategy::Hash), 0.1, 0.02),
        ];
        let mut out = Vec::new();
        write_csv(&rows, &mut out).unwrap();
        let csv = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("footprint_bytes,dirty_fraction,strategy"));
        assert_eq!(
            lines[2],
            "1073741824,0.1,hash,host,restore,0.020000000,1.0000,copy_ceiling,2.0000,0.50000"
        );
        let table = format_table(&rows);
        assert_eq!(table.lines().count(), 3);
        assert!(table.contains("ceiling GB/s") && table.contains("10%"));
        assert!(table.lines().nth(2).unwrap().contains("copy_ceiling"));
        assert_eq!(lines[0], CSV_HEADER);
    }
}
