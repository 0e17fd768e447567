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

    /// A budget derived from the host's available memory (`MemAvailable`
    /// from `/proc/meminfo`, or less where the process's memory cgroup leaves less) minus a
    /// safety margin of a quarter of it or 512 MiB, whichever is larger (so a snapshot never
    /// takes the last memory the application and the kernel need). `None` when neither can be
    /// read (no budget; allocation failures are still caught).
    pub fn derived_budget() -> Option<u64> {
        available_memory().map(budget_from_available)
    }

    /// Check the values that have limits, and that a spill folder, when one is set, is a folder
    /// a file can be created in (checked by making an empty spill file), so an unusable
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

/// Whether a spill file can be created in `dir`: an empty probe file is made as spill files are
/// (see `store::unnamed_file`) and dropped.
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
    // Made as spill files are, without a name in the folder where it allows that, so a process
    // ended while it checks leaves nothing there either.
    let (_probe, named) = crate::store::unnamed_file(dir).map_err(|e| unusable(e.to_string()))?;
    if let Some(path) = named {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The derivation rule of [`SnapshotConfig::derived_budget`] on a `/proc/meminfo` text.
#[cfg(test)]
pub(crate) fn budget_from_meminfo(meminfo: &str) -> Option<u64> {
    mem_available(meminfo).map(budget_from_available)
}

/// What may be taken of `available` bytes: all but a quarter of it or 512 MiB, whichever is
/// larger.
pub(crate) fn budget_from_available(available: u64) -> u64 {
    let margin = (available / 4).max(512 << 20);
    available.saturating_sub(margin)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Memory this process may still take before the kernel's OOM killer ends it: the machine's
/// `MemAvailable`, or less where the memory cgroup it runs in (or one above it; v1's memory
/// controller or v2) has less room left under its limit (its usage counting the inactive file
/// cache, which the kernel reclaims before it kills). Read anew at each call. `None` when
/// neither can be read.
pub fn available_memory() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            cgroup_room(&t, std::path::Path::new("/sys/fs/cgroup"), |p| {
                std::fs::read_to_string(p).ok()
            })
        });
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// The least room left under a memory limit among the cgroups of a `/proc/self/cgroup` text
/// and their ancestors, with the cgroup file systems mounted at `root` and files read by
/// `read`; `None` where no limit is set.
fn cgroup_room(
    self_cgroup: &str,
    root: &std::path::Path,
    read: impl Fn(&std::path::Path) -> Option<String>,
) -> Option<u64> {
    // (limit, usage, inactive file cache in memory.stat)
    const V1: [&str; 3] = [
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        "total_inactive_file",
    ];
    const V2: [&str; 3] = ["memory.max", "memory.current", "inactive_file"];
    let mut least: Option<u64> = None;
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (top, files) = if controllers.is_empty() {
            (root.to_path_buf(), V2)
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), V1)
        } else {
            continue;
        };
        let mut dir = top.join(path.trim_start_matches('/'));
        loop {
            let number = |file: &str| read(&dir.join(file))?.trim().parse::<u64>().ok();
            // v1 writes "no limit" as a number near 2^63; v2 as "max" (which does not parse).
            if let Some(limit) = number(files[0]).filter(|l| *l < 1 << 62) {
                let usage = number(files[1]).unwrap_or(0);
                let cache = read(&dir.join("memory.stat"))
                    .and_then(|stat| {
                        stat.lines()
                            .find_map(|l| l.strip_prefix(files[2])?.strip_prefix(' '))
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    })
                    .unwrap_or(0);
                let room = limit.saturating_sub(usage.saturating_sub(cache));
                least = Some(least.map_or(room, |l| l.min(room)));
            }
            if dir == top || !dir.pop() || !dir.starts_with(&top) {
                break;
            }
        }
    }
    least
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
    fn the_room_left_is_the_least_of_every_limited_cgroup_and_its_ancestors() {
        use std::collections::HashMap;
        use std::path::{Path, PathBuf};
        let mib = 1u64 << 20;
        let files: HashMap<PathBuf, String> = [
            // v1: the container's cgroup and the one above it, both limited.
            (
                "/cg/memory/pod/memory.limit_in_bytes",
                format!("{}", 1024 * mib),
            ),
            (
                "/cg/memory/pod/memory.usage_in_bytes",
                format!("{}", 900 * mib),
            ),
            (
                "/cg/memory/pod/memory.stat",
                format!(
                    "cache 1\ninactive_file 7\ntotal_inactive_file {}\n",
                    100 * mib
                ),
            ),
            (
                "/cg/memory/pod/app/memory.limit_in_bytes",
                "9223372036854771712".into(),
            ),
            (
                "/cg/memory/pod/app/memory.usage_in_bytes",
                format!("{}", 10 * mib),
            ),
            (
                "/cg/memory/memory.limit_in_bytes",
                format!("{}", 4096 * mib),
            ),
            (
                "/cg/memory/memory.usage_in_bytes",
                format!("{}", 1000 * mib),
            ),
            // v2: a limit of "max" is none.
            ("/cg/user/memory.max", "max\n".into()),
            ("/cg/user/memory.current", "5\n".into()),
        ]
        .into_iter()
        .map(|(p, t)| (PathBuf::from(p), t))
        .collect();
        let read = |p: &Path| files.get(p).cloned();
        let v1 = "9:pids:/pod\n4:cpu,memory:/pod/app\n0::/user\n";
        // 1024 MiB less (900 - 100) MiB in use; the top's 3096 MiB is more; app is unlimited.
        assert_eq!(cgroup_room(v1, Path::new("/cg"), read), Some(224 * mib));
        assert_eq!(cgroup_room("0::/user\n", Path::new("/cg"), read), None);
        assert_eq!(cgroup_room("", Path::new("/cg"), read), None);
        // v2 under a limit, usage above it: no room.
        let v2: HashMap<PathBuf, String> = [
            ("/cg/a/memory.max", format!("{}", 64 * mib)),
            ("/cg/a/memory.current", format!("{}", 80 * mib)),
            ("/cg/a/b/memory.max", "max".into()),
        ]
        .into_iter()
        .map(|(p, t)| (PathBuf::from(p), t))
        .collect();
        let read = |p: &Path| v2.get(p).cloned();
        assert_eq!(cgroup_room("0::/a/b\n", Path::new("/cg"), read), Some(0));
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
