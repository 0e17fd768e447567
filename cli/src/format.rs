//! Plain-text output helpers: an aligned table and human-readable byte counts and durations.
//!
//! ```
//! use kreplay_cli::format::{Align, Table, format_bytes};
//!
//! let mut table = Table::new(&[("kernel", Align::Left), ("bytes", Align::Right)]);
//! table.row(vec!["axpy".into(), format_bytes(8 << 20)]);
//! assert_eq!(table.render(), "kernel     bytes\naxpy    8.00 MiB\n");
//! ```

use std::time::Duration;

/// How a column's cells are aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Padded on the right.
    Left,
    /// Padded on the left (numbers).
    Right,
}

/// A text table: a header row and data rows, each column as wide as its widest cell, columns
/// separated by two spaces, no trailing spaces.
#[derive(Clone, Debug)]
pub struct Table {
    headers: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and alignments.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(h, _)| (*h).to_string()).collect(),
            aligns: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row. Missing cells are empty; extra cells are dropped.
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as lines of text, each ending in a newline.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|c| {
                std::iter::once(&self.headers[c])
                    .chain(self.rows.iter().map(|r| &r[c]))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for cells in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (c, cell) in cells.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = widths[c] - cell.chars().count();
                match self.aligns[c] {
                    Align::Left => {
                        line.push_str(cell);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Bytes in binary units: `512 B`, `4.00 KiB`, `8.00 MiB`, `1.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// A duration with three significant digits at most: `850ns`, `12.3µs`, `1.25ms`, `2.00s`.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    let (value, unit) = if nanos < 1_000_000 {
        (nanos as f64 / 1e3, "µs")
    } else if nanos < 1_000_000_000 {
        (nanos as f64 / 1e6, "ms")
    } else {
        (nanos as f64 / 1e9, "s")
    };
    if value < 10.0 {
        format!("{value:.2}{unit}")
    } else if value < 100.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

/// A throughput in decimal units per second (`1.23 GB/s`), or `-` for a zero duration.
pub fn format_rate(bytes: u64, duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs <= 0.0 {
        return "-".to_string();
    }
    let rate = bytes as f64 / secs;
    if rate >= 1e9 {
        format!("{:.2} GB/s", rate / 1e9)
    } else {
        format!("{:.1} MB/s", rate / 1e6)
    }
}

/// Why `path` cannot be loaded as a library file, when it is not a regular file (following
/// links): `None` for a file. "no such file" only when nothing is there.
///
/// ```
/// use kreplay_cli::format::not_a_library_file;
///
/// assert_eq!(not_a_library_file("/".as_ref()).as_deref(), Some("is a folder, not a library file"));
/// assert_eq!(not_a_library_file("/no/such/lib.so".as_ref()).as_deref(), Some("no such file"));
/// ```
pub fn not_a_library_file(path: &std::path::Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => None,
        Ok(meta) if meta.is_dir() => Some("is a folder, not a library file".into()),
        Ok(_) => Some("is not a regular file (a device, pipe or socket)".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("no such file".into()),
        Err(e) => Some(format!("cannot be read: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_are_as_wide_as_their_widest_cell() {
        let mut table = Table::new(&[("id", Align::Right), ("name", Align::Left)]);
        table.row(vec!["1".into(), "scale_add".into()]);
        table.row(vec!["12".into(), "x".into()]);
        assert_eq!(table.render(), "id  name\n 1  scale_add\n12  x\n");
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn table_rows_are_padded_to_the_header_count_and_never_end_in_spaces() {
        let mut table = Table::new(&[("a", Align::Left), ("b", Align::Left)]);
        table.row(vec!["long cell".into()]);
        let text = table.render();
        assert_eq!(text, "a          b\nlong cell\n");
        assert!(text.lines().all(|line| !line.ends_with(' ')));
    }

    #[test]
    fn table_counts_characters_not_bytes_when_aligning() {
        let mut table = Table::new(&[("t", Align::Right)]);
        table.row(vec!["1.00µs".into()]);
        table.row(vec!["2ns".into()]);
        assert_eq!(table.render(), "     t\n1.00µs\n   2ns\n");
    }

    #[test]
    fn bytes_use_binary_units_with_two_decimals() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(8 << 20), "8.00 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }

    #[test]
    fn durations_keep_three_significant_digits() {
        assert_eq!(format_duration(Duration::from_nanos(850)), "850ns");
        assert_eq!(format_duration(Duration::from_nanos(12_345)), "12.3µs");
        assert_eq!(format_duration(Duration::from_micros(1_250)), "1.25ms");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2.00s");
    }

    #[test]
    fn rates_are_decimal_and_zero_durations_have_none() {
        assert_eq!(
            format_rate(2_000_000_000, Duration::from_secs(1)),
            "2.00 GB/s"
        );
        assert_eq!(
            format_rate(1_500_000, Duration::from_millis(10)),
            "150.0 MB/s"
        );
        assert_eq!(format_rate(1, Duration::ZERO), "-");
    }
}
