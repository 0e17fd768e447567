//! Snapshot configuration: store tier, restore strategy, chunking, budget.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a snapshot's bytes are kept (`KREPLAY_SNAPSHOT_STORE=auto|device|host|file`).
///
/// `Auto` is a configuration value only; reports always name the tier actually used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreTier {
    /// Try device, then host, then file.
    #[default]
    Auto,
    /// A device-resident shadow allocated on the agent.
    Device,
    /// Host memory (registered with the device when it offers that).
    Host,
    /// A memory-mapped spill file in the spill directory.
    File,
}

impl StoreTier {
    /// The configuration spelling (`auto`, `device`, `host`, `file`).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreTier::Auto => "auto",
            StoreTier::Device => "device",
            StoreTier::Host => "host",
            StoreTier::File => "file",
        }
    }
}

/// How a restore finds what to write back
/// (`KREPLAY_RESTORE=auto|full|hash|writeset|writeset-unverified`).
///
/// `Auto` is a configuration value only; restore reports always name the strategy used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RestoreStrategy {
    /// Chosen per snapshot (see the crate docs for the rule).
    #[default]
    Auto,
    /// Write every byte back.
    Full,
    /// Hash every chunk of live memory and write back the chunks whose hash changed.
    Hash,
    /// Learn the changed chunks from pass 0 and verify before every pass: every live chunk is
    /// hashed, changed chunks are written back, and a change outside the learned set is
    /// reported as a repair. Every pass starts from the snapshotted bytes.
    Writeset,
    /// The opt-in shortcut: learn the changed chunks by hashing after pass 0, then write back
    /// only those without hashing, verifying every K restores and before any pass that may be
    /// the final one. A pass that writes outside the learned set makes the following passes
    /// start from bytes the first pass never saw; restores that skipped verification report
    /// `unverified`.
    WritesetUnverified,
    /// Follow the pages each pass writes (where the device's memory is written only by this
    /// process's CPU, see `Capabilities::cpu_writes`) and write back exactly the chunks of the
    /// written pages, hashing nothing. Where writes cannot be followed, restores as `Hash`.
    Tracked,
}

impl RestoreStrategy {
    /// The configuration spelling (`auto`, `full`, `hash`, `writeset`, `writeset-unverified`).
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreStrategy::Auto => "auto",
            RestoreStrategy::Full => "full",
            RestoreStrategy::Hash => "hash",
            RestoreStrategy::Writeset => "writeset",
            RestoreStrategy::WritesetUnverified => "writeset-unverified",
            RestoreStrategy::Tracked => "tracked",
        }
    }
}

/// What a replay snapshots (`KREPLAY_SNAPSHOT_SCOPE=agent|referenced`).
///
/// Both include everything the dispatch is known to reach: every allocation an address it uses
/// points into (its kernel arguments), whatever its owner or kind, and the writable
/// module-scope variables of code loaded on the agent. Memory reached only through pointers
/// stored in memory is invisible to that scan; `Agent` covers it when it is the agent's own
/// coarse-grained memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SnapshotScope {
    /// The agent's coarse-grained memory plus everything referenced: the safe choice for
    /// kernels that reach memory through pointer tables.
    #[default]
    Agent,
    /// Only what the dispatch references: far smaller snapshots and no contact with unrelated
    /// buffers, for tools that know their kernels.
    Referenced,
}

impl SnapshotScope {
    /// The configuration spelling (`agent`, `referenced`).
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotScope::Agent => "agent",
            SnapshotScope::Referenced => "referenced",
        }
    }
}

impl fmt::Display for SnapshotScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SnapshotScope {
    type Err = ParseEnumError;
    /// Accepts `agent`, `referenced` (ASCII case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_name(
            s,
            "snapshot scope",
            "agent, referenced",
            &[
                ("agent", SnapshotScope::Agent),
                ("referenced", SnapshotScope::Referenced),
            ],
        )
    }
}

impl fmt::Display for StoreTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for RestoreStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A malformed store tier or restore strategy name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseEnumError {
    what: &'static str,
    value: String,
    expected: &'static str,
}

impl fmt::Display for ParseEnumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} {:?}: expected one of {}",
            self.what, self.value, self.expected
        )
    }
}

impl std::error::Error for ParseEnumError {}

fn parse_name<T: Copy>(
    s: &str,
    what: &'static str,
    expected: &'static str,
    table: &[(&str, T)],
) -> Result<T, ParseEnumError> {
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s.trim()))
        .map(|&(_, v)| v)
        .ok_or_else(|| ParseEnumError {
            what,
            value: s.to_owned(),
            expected,
        })
}

impl FromStr for StoreTier {
    type Err = ParseEnumError;
    /// Accepts `auto`, `device`, `host`, `file` (ASCII case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_name(
            s,
            "snapshot store tier",
            "auto, device, host, file",
            &[
                ("auto", StoreTier::Auto),
                ("device", StoreTier::Device),
                ("host", StoreTier::Host),
                ("file", StoreTier::File),
            ],
        )
    }
}

impl FromStr for RestoreStrategy {
    type Err = ParseEnumError;
    /// Accepts `auto`, `full`, `hash`, `writeset`, `writeset-unverified`, `tracked` (ASCII
    /// case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_name(
            s,
            "restore strategy",
            "auto, full, hash, writeset, writeset-unverified, tracked",
            &[
                ("auto", RestoreStrategy::Auto),
                ("full", RestoreStrategy::Full),
                ("hash", RestoreStrategy::Hash),
                ("writeset", RestoreStrategy::Writeset),
                ("writeset-unverified", RestoreStrategy::WritesetUnverified),
                ("tracked", RestoreStrategy::Tracked),
            ],
        )
    }
}

/// A configuration value that cannot be used, naming the variable (or field) at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The environment variable or `SnapshotConfig` field.
    pub variable: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Default chunk size for hashing and partial restores: 64 KiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 64 * 1024;
/// Smallest accepted chunk size.
pub const MIN_CHUNK_SIZE: u64 = 512;
/// The largest chunk size [`SnapshotConfig::validate`] accepts (1 GiB): a chunk is hashed and
/// written back whole, and sizes near the top of the address space overflow its arithmetic.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// Default write-set verification period (`verify_every`).
pub const DEFAULT_VERIFY_EVERY: u32 = 8;

/// How snapshots are stored and restored.
///
/// `#[non_exhaustive]`: it may gain fields, so it is built from [`SnapshotConfig::default`] and
/// the `with_*` methods rather than with a struct literal:
///
/// ```
/// use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
///
/// let config = SnapshotConfig::default()
///     .with_store(StoreTier::Host)
///     .with_strategy(RestoreStrategy::Hash)
///     .with_chunk_size(4096);
/// assert_eq!((config.store, config.chunk_size), (StoreTier::Host, 4096));
/// ```
///
/// ```compile_fail
/// use kreplay_snapshot::{SnapshotConfig, StoreTier};
///
/// let config = SnapshotConfig { store: StoreTier::Host, ..SnapshotConfig::default() };
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotConfig {
    /// Largest snapshot footprint accepted, in bytes; a larger plan is declined with
    /// `footprint_budget`. `None` = no budget (allocation failures are still typed errors).
    /// See [`SnapshotConfig::budget_from_setting`] for `KREPLAY_MAX_SNAPSHOT_BYTES`.
    pub max_bytes: Option<u64>,
    /// Store tier: `Auto` tries device, host, file in that order; any other value forces it.
    pub store: StoreTier,
    /// Restore strategy.
    pub strategy: RestoreStrategy,
    /// Chunk size in bytes for hashing and partial restores (at least [`MIN_CHUNK_SIZE`], at
    /// most [`MAX_CHUNK_SIZE`]).
    pub chunk_size: u64,
    /// Write-set strategy: verify with hashes on every K-th restore (1 = every restore, which is
    /// the hash strategy; 0 = only before a pass that may be the final one). A restore whose
    /// request says the next pass may be final always verifies.
    pub verify_every: u32,
    /// Directory for spill files; `None` = the system temporary directory.
    pub spill_dir: Option<PathBuf>,
    /// Keep the last host or file store when a snapshot drops and reuse it for the next snapshot
    /// that fits (saves allocating and faulting in fresh pages). Device shadows are never kept.
    /// A store whose snapshot followed writes is kept with its footprint still followed (see
    /// [`Snapshotter::following`](crate::Snapshotter::following)); off, nothing stays followed.
    pub keep_store: bool,
    /// Whether `auto` may follow writes page by page where the device allows it (see
    /// `RestoreStrategy::Tracked`); off, it chooses among full, hash and write-set restores
    /// only. `tracked` itself follows them either way.
    pub track_writes: bool,
    /// What a replay snapshots (read by the backend when it builds its [`Filter`](crate::Filter)).
    pub scope: SnapshotScope,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            max_bytes: None,
            store: StoreTier::Auto,
            strategy: RestoreStrategy::Auto,
            chunk_size: DEFAULT_CHUNK_SIZE,
            verify_every: DEFAULT_VERIFY_EVERY,
            spill_dir: None,
            keep_store: true,
            track_writes: true,
            scope: SnapshotScope::Agent,
        }
    }
}

impl SnapshotConfig {
    /// This configuration with a footprint budget (`None`: no budget).
    pub fn with_max_bytes(mut self, max_bytes: Option<u64>) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// This configuration with a store tier.
    pub fn with_store(mut self, store: StoreTier) -> Self {
        self.store = store;
        self
    }

    /// This configuration with a restore strategy.
    pub fn with_strategy(mut self, strategy: RestoreStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// This configuration with a chunk size in bytes (checked by [`validate`](Self::validate)).
    pub fn with_chunk_size(mut self, chunk_size: u64) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// This configuration with a write-set verification period.
    pub fn with_verify_every(mut self, verify_every: u32) -> Self {
        self.verify_every = verify_every;
        self
    }

    /// This configuration with a spill directory (`None`: the system temporary directory).
    pub fn with_spill_dir(mut self, spill_dir: Option<PathBuf>) -> Self {
        self.spill_dir = spill_dir;
        self
    }

    /// This configuration keeping (or not) the last host or file store for reuse.
    pub fn with_keep_store(mut self, keep_store: bool) -> Self {
        self.keep_store = keep_store;
        self
    }

    /// This configuration letting `auto` follow writes (or not).
    pub fn with_track_writes(mut self, track_writes: bool) -> Self {
        self.track_writes = track_writes;
        self
    }

    /// This configuration with a snapshot scope.
    pub fn with_scope(mut self, scope: SnapshotScope) -> Self {
        self.scope = scope;
        self
    }

    /// The budget for a `KREPLAY_MAX_SNAPSHOT_BYTES` value: `0` derives it from available memory
    /// ([`SnapshotConfig::derived_budget`]), any other value is the budget in bytes.
    pub fn budget_from_setting(value: u64) -> Option<u64> {
        if value == 0 {
            Self::derived_budget()
        } else {
            Some(value)
        }
    }

    /// A budget derived from the host's available memory: `MemAvailable` from `/proc/meminfo`
    /// minus a safety margin of a quarter of it or 512 MiB, whichever is larger (so a snapshot
    /// never takes the last memory the application and the kernel need). `None` when
    /// `/proc/meminfo` cannot be read (no budget; allocation failures are still caught).
    pub fn derived_budget() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        budget_from_meminfo(&text)
    }

    /// Check the values that have limits, and that a spill folder, when one is set, is a folder
    /// a file can be created in (checked by creating and removing an empty file), so an unusable
    /// folder is an error at start-up rather than a declined replay at every dispatch that
    /// spills.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.chunk_size < MIN_CHUNK_SIZE {
            return Err(ConfigError {
                variable: "chunk_size",
                message: format!(
                    "{} bytes is below the minimum of {MIN_CHUNK_SIZE}",
                    self.chunk_size
                ),
            });
        }
        if self.chunk_size > MAX_CHUNK_SIZE {
            return Err(ConfigError {
                variable: "chunk_size",
                message: format!(
                    "{} bytes is above the maximum of {MAX_CHUNK_SIZE}",
                    self.chunk_size
                ),
            });
        }
        if let Some(dir) = &self.spill_dir {
            check_spill_dir(dir)?;
        }
        Ok(())
    }

    /// The spill directory to use.
    pub(crate) fn spill_dir(&self) -> PathBuf {
        self.spill_dir.clone().unwrap_or_else(std::env::temp_dir)
    }
}

/// Whether a spill file can be created in `dir`: an empty probe file is created and removed.
fn check_spill_dir(dir: &std::path::Path) -> Result<(), ConfigError> {
    let unusable = |why: String| ConfigError {
        variable: "spill_dir",
        message: format!("{} cannot hold spill files: {why}", dir.display()),
    };
    if !dir.is_dir() {
        return Err(unusable(if dir.exists() {
            "it is not a folder".into()
        } else {
            "no such folder".into()
        }));
    }
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe = dir.join(format!(
        "kreplay-spill-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| unusable(e.to_string()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The derivation rule of [`SnapshotConfig::derived_budget`] on a `/proc/meminfo` text.
pub(crate) fn budget_from_meminfo(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    let available = kib.checked_mul(1024)?;
    let margin = (available / 4).max(512 << 20);
    Some(available.saturating_sub(margin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_parse_known_names_and_reject_others_clearly() {
        assert_eq!("host".parse::<StoreTier>(), Ok(StoreTier::Host));
        assert_eq!(" File ".parse::<StoreTier>(), Ok(StoreTier::File));
        assert_eq!(
            "writeset".parse::<RestoreStrategy>(),
            Ok(RestoreStrategy::Writeset)
        );
        let err = "gpu".parse::<StoreTier>().unwrap_err().to_string();
        assert!(
            err.contains("\"gpu\"") && err.contains("auto, device, host, file"),
            "{err}"
        );
        let err = "fast".parse::<RestoreStrategy>().unwrap_err().to_string();
        assert!(
            err.contains("restore strategy") && err.contains("writeset"),
            "{err}"
        );
        for t in [
            StoreTier::Auto,
            StoreTier::Device,
            StoreTier::Host,
            StoreTier::File,
        ] {
            assert_eq!(t.as_str().parse::<StoreTier>(), Ok(t));
        }
    }

    #[test]
    fn derived_budget_keeps_a_quarter_or_512_mib_free() {
        let gib = 1u64 << 30;
        let text = format!("MemTotal: 99 kB\nMemAvailable:   {} kB\n", 8 * gib / 1024);
        assert_eq!(budget_from_meminfo(&text), Some(6 * gib));
        let small = format!("MemAvailable: {} kB\n", gib / 1024);
        assert_eq!(budget_from_meminfo(&small), Some(gib - (512 << 20)));
        assert_eq!(budget_from_meminfo("MemAvailable: 1000 kB\n"), Some(0));
        assert_eq!(budget_from_meminfo("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn chunk_sizes_below_the_minimum_or_above_the_maximum_are_rejected() {
        let with = |chunk_size| {
            SnapshotConfig {
                chunk_size,
                ..Default::default()
            }
            .validate()
        };
        assert!(with(100).is_err());
        assert!(with(MIN_CHUNK_SIZE).is_ok());
        assert!(with(MAX_CHUNK_SIZE).is_ok());
        // Sizes that overflowed the hashing's arithmetic (a snapshot then panicked).
        for huge in [MAX_CHUNK_SIZE + 1, 1 << 62, u64::MAX] {
            let err = with(huge).unwrap_err();
            assert!(err.to_string().contains("maximum"), "{err}");
        }
    }
}
