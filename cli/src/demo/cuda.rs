//! `kreplay demo --backend cuda`: `x += 1` over a footprint on a GPU, replayed and verified.
//!
//! The work is [`kreplay_cuda::demo`]'s: this reads the snapshot settings from the environment
//! (checked before the driver is looked for), runs it and prints its table.

use std::io::Write;

use kreplay_cuda::demo::{DemoConfig, DemoReport};

use crate::args::CudaDemoOptions;

/// Runs the demo on the GPU and writes its table to `out`. `Err` when it could not run (bad
/// `KREPLAY_*` settings, no driver or device, an allocation or driver call failed); the
/// report's [`DemoReport::passed`] says whether verification passed.
pub fn run(options: &CudaDemoOptions, out: &mut dyn Write) -> Result<DemoReport, String> {
    let config = DemoConfig::new(
        options.device,
        options.footprint,
        options.written,
        options.passes,
        |k| std::env::var(k).ok(),
    )?;
    let report = kreplay_cuda::demo::run(&config)?;
    out.write_all(report.table().as_bytes())
        .map_err(|e| format!("cannot write the output: {e}"))?;
    Ok(report)
}
