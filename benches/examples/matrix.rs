//! Run the measurement matrix once and print the table; optionally write CSV and SVG.
//!
//! `cargo run --release -p kreplay-benches --example matrix -- [--discrete] [FOOTPRINTS] [OUT_DIR]`
//! where FOOTPRINTS is a comma list like `256M,1G` (default `256M`), OUT_DIR, when given,
//! receives `matrix.csv` and `restore.svg`, and `--discrete` measures a device without host
//! windows (reached through reads and writes only).

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use kreplay_benches::{MatrixConfig, format_table, run_matrix, write_csv, write_svg};

fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KIB" => 10,
        "M" | "MIB" => 20,
        "G" | "GIB" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

fn main() -> ExitCode {
    let mut config = MatrixConfig::default();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--discrete") {
        args.remove(i);
        config.host_windows = false;
    }
    let mut args = args.into_iter();
    if let Some(list) = args.next() {
        match list.split(',').map(parse_size).collect::<Option<Vec<_>>>() {
            Some(sizes) => config.footprints = sizes,
            None => {
                eprintln!("bad footprint list {list:?} (example: 256M,1G)");
                return ExitCode::FAILURE;
            }
        }
    }
    let out_dir = args.next().map(PathBuf::from);
    let rows = match run_matrix(&config) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("matrix failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", format_table(&rows));
    if let Some(dir) = out_dir {
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| write_csv(&rows, BufWriter::new(File::create(dir.join("matrix.csv"))?)))
            .and_then(|()| {
                write_svg(
                    &rows,
                    BufWriter::new(File::create(dir.join("restore.svg"))?),
                )
            });
        if let Err(e) = written {
            eprintln!("cannot write results to {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
