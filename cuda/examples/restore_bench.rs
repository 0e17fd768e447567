//! Restore cost on a CUDA GPU, beside ceilings measured in the same run: the measurements of
//! [`kreplay_cuda::bench`] (also `kreplay bench --backend cuda`), from a bare command line.
//!
//! ```sh
//! cargo build --release -p kreplay-cuda --example restore_bench
//! target/release/examples/restore_bench [FOOTPRINTS_GIB] [REPS] [TIERS]
//! # defaults "1,8", 5 and "device"; TIERS from device, host, squeezed
//! ```
//!
//! Written fractions 0.1%, 1%, 10%, 100%; strategies full, hash, writeset and
//! writeset-unverified; the restore targets judged from the rows after them.
//! `KREPLAY_CUDA_TEST_PTX=<file>` loads that PTX instead of the committed one.

use kreplay_cuda::bench::{BenchConfig, judge, run};
use kreplay_cuda::kernels::override_ptx;

fn main() {
    let result = parse().and_then(|config| {
        let figures = run(&config, &mut std::io::stdout().lock())?;
        println!();
        // One line per verdict (`kreplay bench --backend cuda` groups and counts them).
        for c in judge(&config, &figures) {
            println!(
                "{} [{}] {}: {}",
                c.target,
                c.tier.as_str(),
                c.verdict(),
                c.detail
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("restore_bench: {e}");
        std::process::exit(1);
    }
}

fn parse() -> Result<BenchConfig, String> {
    let args: Vec<String> = std::env::args().collect();
    let mut config = BenchConfig::default();
    if let Some(list) = args.get(1) {
        config.footprints = list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<u64>()
                    .map(|gib| gib << 30)
                    .map_err(|e| format!("footprint {s:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(s) = args.get(2) {
        config.reps = s.parse().map_err(|e| format!("reps {s:?}: {e}"))?;
    }
    if let Some(list) = args.get(3) {
        config.tiers = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
    }
    if let Ok(path) = std::env::var("KREPLAY_CUDA_TEST_PTX") {
        override_ptx(std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?);
    }
    Ok(config)
}
