//! Writers for matrix rows: a text table and CSV (the SVG plot is in `plot`).

use std::fmt::Write as _;
use std::io::{self, Write};

use crate::matrix::BenchRow;

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

/// Columns of the matrix table, each with its minimum width: wide enough for every value the
/// bench prints, so that rows line up when they are printed one by one as they are measured.
const COLUMNS: [(&str, usize); 10] = [
    ("footprint", 9),
    ("dirty", 5),
    ("strategy", 19),
    ("tier", 6),
    ("operation", 13),
    ("time", 10),
    ("GB/s", 7),
    ("ceiling", 12),
    ("ceiling GB/s", 12),
    ("ratio", 6),
];

/// One line of fixed-width fields (text columns left-aligned, the others right-aligned),
/// without trailing spaces.
pub(crate) fn fixed_line(fields: &[String], widths: &[usize], text_columns: &[usize]) -> String {
    let mut out = String::new();
    for (i, (f, &w)) in fields.iter().zip(widths).enumerate() {
        let w = w.max(f.len());
        if text_columns.contains(&i) {
            let _ = write!(out, "{f:<w$}  ");
        } else {
            let _ = write!(out, "{f:>w$}  ");
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

fn matrix_line(fields: &[String]) -> String {
    let widths = COLUMNS.map(|(h, w)| w.max(h.len()));
    fixed_line(fields, &widths, &[0, 1, 2, 3, 4, 7])
}

/// The header line of the matrix table ([`format_table`]).
pub fn table_header() -> String {
    matrix_line(&COLUMNS.map(|(h, _)| h.to_string()))
}

/// One row of the matrix table, aligned under [`table_header`], so that a row can be printed
/// as soon as it is measured.
pub fn table_line(r: &BenchRow) -> String {
    matrix_line(&[
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
    ])
}

/// The rows as an aligned text table, with the ceiling beside every figure: [`table_header`]
/// and a [`table_line`] per row.
pub fn format_table(rows: &[BenchRow]) -> String {
    let mut out = table_header();
    for r in rows {
        out += &table_line(r);
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

/// One line of [`write_csv`]'s CSV: one measurement. Its field names are the header
/// ([`CSV_HEADER`]); `strategy` and `tier` are empty for ceilings, `ceiling` names the operation
/// the row is compared to.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchRecord {
    /// Tracked bytes.
    pub footprint_bytes: u64,
    /// Fraction of chunks the pass changed.
    pub dirty_fraction: f64,
    /// Restore strategy (`None` for ceilings).
    pub strategy: Option<String>,
    /// Store tier (`None` for ceilings).
    pub tier: Option<String>,
    /// What was measured ([`Operation::as_str`](crate::Operation::as_str)).
    pub operation: String,
    /// Best wall time, in seconds (to the nanosecond).
    pub seconds: f64,
    /// Footprint bytes per second, in GB/s (to 4 decimals).
    pub gb_per_s: f64,
    /// The ceiling the row is compared to ([`Operation::as_str`](crate::Operation::as_str)).
    pub ceiling: String,
    /// The ceiling's rate, in GB/s (to 4 decimals).
    pub ceiling_gb_per_s: f64,
    /// `gb_per_s / ceiling_gb_per_s` (to 5 decimals).
    pub ratio: f64,
}

impl BenchRecord {
    /// The record of `row`, its figures rounded as documented on the fields.
    pub fn of(row: &BenchRow) -> Self {
        let round = |v: f64, digits: i32| {
            let scale = 10f64.powi(digits);
            (v * scale).round() / scale
        };
        BenchRecord {
            footprint_bytes: row.footprint,
            dirty_fraction: row.dirty_fraction,
            strategy: row.strategy.map(|s| s.as_str().to_owned()),
            tier: row.tier.map(|t| t.as_str().to_owned()),
            operation: row.operation.as_str().to_owned(),
            seconds: round(row.seconds, 9),
            gb_per_s: round(row.gbps, 4),
            ceiling: row.operation.ceiling().as_str().to_owned(),
            ceiling_gb_per_s: round(row.ceiling_gbps, 4),
            ratio: round(row.ratio, 5),
        }
    }
}

/// The header line of [`write_csv`] (without the newline): the fields of [`BenchRecord`].
pub const CSV_HEADER: &str = "footprint_bytes,dirty_fraction,strategy,tier,operation,seconds,gb_per_s,ceiling,ceiling_gb_per_s,ratio";

/// Write the rows as CSV, one [`BenchRecord`] a line after a header line ([`CSV_HEADER`]).
pub fn write_csv(rows: &[BenchRow], w: impl Write) -> io::Result<()> {
    let mut writer = csv::Writer::from_writer(w);
    if rows.is_empty() {
        writer.write_record(CSV_HEADER.split(','))?;
    }
    for row in rows {
        writer.serialize(BenchRecord::of(row))?;
    }
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Operation;
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
            "1073741824,0.1,hash,host,restore,0.02,1.0,copy_ceiling,2.0,0.5"
        );
        assert_eq!(
            lines[1],
            "1073741824,0.0,,,copy_ceiling,0.05,1.0,copy_ceiling,2.0,0.5"
        );
        let table = format_table(&rows);
        assert_eq!(table.lines().count(), 3);
        assert!(table.contains("ceiling GB/s") && table.contains("10%"));
        assert!(table.lines().nth(2).unwrap().contains("copy_ceiling"));
        assert_eq!(lines[0], CSV_HEADER);
    }

    #[test]
    fn the_csv_reads_back_into_the_records_it_was_written_from() {
        let mut rows = vec![row(Operation::Memcpy, None, 0.0, 0.05)];
        rows.push(row(
            Operation::Restore,
            Some(RestoreStrategy::Writeset),
            0.125,
            1.234_567_891_2e-4,
        ));
        let mut out = Vec::new();
        write_csv(&rows, &mut out).unwrap();
        let mut reader = csv::Reader::from_reader(out.as_slice());
        assert_eq!(
            reader
                .headers()
                .unwrap()
                .iter()
                .collect::<Vec<_>>()
                .join(","),
            CSV_HEADER
        );
        let back: Vec<BenchRecord> = reader.deserialize().map(Result::unwrap).collect();
        let expected: Vec<BenchRecord> = rows.iter().map(BenchRecord::of).collect();
        assert_eq!(back, expected);
        assert_eq!(back[0].strategy, None, "a ceiling has no strategy");
        assert_eq!(back[1].seconds, 0.000_123_457, "seconds to the nanosecond");
        assert_eq!(back[1].ceiling, "copy_ceiling");
    }

    #[test]
    fn no_rows_still_give_the_header() {
        let mut out = Vec::new();
        write_csv(&[], &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap().trim_end(), CSV_HEADER);
    }
}
