//! `kreplay bench --backend cuda`: the measurements of [`kreplay_cuda::bench`] (restore cost per
//! tier, strategy and written fraction on a GPU, beside the copy and read ceilings of the same
//! run), written as CSV to standard output and, with `--csv`, to a file as well; then, on
//! standard output only, the restore targets judged from those rows
//! ([`kreplay_cuda::bench::judge`]).

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use kreplay_cuda::bench::BenchConfig;

/// Writes everything to both.
struct Tee<'a> {
    out: &'a mut dyn Write,
    file: Option<File>,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write_all(buf)?;
        if let Some(f) = &mut self.file {
            f.write_all(buf)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()?;
        if let Some(f) = &mut self.file {
            f.flush()?;
        }
        Ok(())
    }
}

/// Runs the measurements; rows go to `out` (and `csv`) as they are measured, the judged
/// targets to `out` after them.
pub fn run(config: &BenchConfig, csv: Option<&Path>, out: &mut dyn Write) -> Result<(), String> {
    config.validate()?;
    // The driver first: no file is created where nothing can be measured.
    kreplay_cuda::demo::driver()?;
    let file = csv
        .map(|p| File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display())))
        .transpose()?;
    let mut tee = Tee { out, file };
    let figures = kreplay_cuda::bench::run(config, &mut tee)?;
    tee.flush()
        .map_err(|e| format!("cannot write the output: {e}"))?;
    let checks = kreplay_cuda::bench::judge(config, &figures);
    write!(
        tee.out,
        "\n{}",
        kreplay_cuda::bench::render_targets(&checks)
    )
    .and_then(|()| tee.out.flush())
    .map_err(|e| format!("cannot write the output: {e}"))
}
