//! Snapshot and restore benchmarks for kreplay.
//!
//! This library measures what replay's memory work costs and sets every figure beside a ceiling
//! of the machine measured in the same run by code independent of kreplay's: the copy ceiling
//! and the read ceiling, each the best of several methods ([`copy_ceiling`], [`read_ceiling`]).
//! It provides
//!
//! * [`HostDevice`]: a device whose memory is host memory (optionally with host windows,
//!   device shadows, a "device" hash and batched writes), implementing
//!   [`kreplay_snapshot::DeviceMemory`];
//! * [`run_matrix`]: footprints × tiers × strategies × dirty fractions, returning [`BenchRow`]s;
//! * [`run_all`]: the matrix plus the cost of whole replays ([`ReplayConfig`]: snapshot and every
//!   restore of N-pass replays, first and later dispatches of a kernel, dirty [`Pattern`]s);
//! * [`format_table`], [`write_csv`] and [`write_svg`] (restore time against dirty fraction);
//! * [`check_targets`]: the design's snapshot/restore targets judged from one run's rows;
//! * [`run_scope_case`]: snapshot bytes and restore time under both snapshot scopes for a kernel
//!   that references 1% of a large footprint.
//!
//! The criterion benches live in `benches/` (`cargo bench -p kreplay-benches`; the `large`
//! feature or `KREPLAY_BENCH_LARGE=1` adds 256 MiB to 4 GiB). `kreplay bench` runs the matrix
//! once from the command line and prints the table and the targets.
//!
//! # Example
//!
//! ```
//! use kreplay_benches::*;
//! use kreplay_snapshot::{RestoreStrategy, StoreTier};
//!
//! let config = MatrixConfig {
//!     footprints: vec![1 << 20],
//!     dirty_fractions: vec![0.0, 0.5],
//!     strategies: vec![RestoreStrategy::Full, RestoreStrategy::Hash],
//!     tiers: vec![StoreTier::Host],
//!     chunk_size: 16 << 10,
//!     repeats: 1,
//!     ..Default::default()
//! };
//! let rows = run_matrix(&config).unwrap();
//! // 2 ceilings, then per strategy: cold and warm snapshot + 2 restores, + 1 detect row for hash.
//! assert_eq!(rows.len(), 2 + 2 * 4 + 1);
//! assert!(rows.iter().all(|r| r.seconds > 0.0 && r.ceiling_gbps > 0.0));
//!
//! let mut csv = Vec::new();
//! write_csv(&rows, &mut csv).unwrap();
//! assert_eq!(String::from_utf8(csv).unwrap().lines().count(), rows.len() + 1);
//! let mut svg = Vec::new();
//! write_svg(&rows, &mut svg).unwrap();
//! assert!(String::from_utf8(svg).unwrap().starts_with("<svg"));
//! println!("{}", format_table(&rows));
//! ```

mod ceiling;
mod device;
mod matrix;
mod output;
mod paired;
mod plot;
mod replay;
mod scope;
mod targets;
mod workload;

pub use ceiling::{Ceiling, CeilingMethod, copy_ceiling, read_ceiling};
pub use device::{DeviceStats, HostDevice, HostDeviceOptions};
pub use matrix::{
    BenchResults, BenchRow, FootprintCeilings, MatrixConfig, Operation, Progress, run_all,
    run_matrix,
};
pub use output::{
    BenchRecord, CSV_HEADER, format_bytes, format_percent, format_seconds, format_table,
    table_header, table_line, write_csv,
};
pub use paired::{
    DEFAULT_PAIRED_SAMPLES, HASH_PASS, PAIRED_STATISTIC, PairedRatio, interleave, median,
};
pub use plot::write_svg;
pub use replay::{
    AUTO_MAX_OVER_BEST, AutoCheck, Choices, Pattern, ReplayConfig, ReplayRow, check_auto,
    check_control, format_replay_table, low_quartile_words, replay_table_header, replay_table_line,
};
pub use scope::{SCOPE_REGIONS, ScopeRow, run_scope_case};
pub use targets::{
    DETECTION_MIN_RATIO, FULL_COPY_MIN_RATIO, HASH_RESTORE_COPY_FACTOR, Target, TargetCheck,
    WRITESET_IDLE_MAX_RATIO, WRITESET_MAX_RATIO, check_targets,
};
pub use workload::{ChunkMap, SplitMix64};
