//! Configuration from the environment (docs/abi.md §5).
//!
//! Every variable is optional. A malformed value is an error naming the variable and the value,
//! never a silent default.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `KREPLAY_MAX_SNAPSHOT_BYTES` | bytes, optionally with `K`/`M`/`G`/`T` (binary, `KiB` etc. also accepted); `0` = derive | `0` |
//! | `KREPLAY_DRAIN_TIMEOUT_MS` | milliseconds, at least 1 | `10000` |
//! | `KREPLAY_SNAPSHOT_STORE` | `auto`, `device`, `host`, `file` | `auto` |
//! | `KREPLAY_RESTORE` | `auto`, `full`, `hash`, `writeset`, `writeset-unverified`, `tracked` | `auto` |
//! | `KREPLAY_MAX_PASSES` | a whole number of passes, at least 1 | `1024` |
//! | `KREPLAY_REPLAY_BUDGET_MS` | milliseconds per dispatch, at least 1 | no budget |
//! | `KREPLAY_SPILL_DIR` | a non-empty path (a relative one is taken from the folder kreplay loads in) | the system temporary directory |
//! | `KREPLAY_LOG` | `off`, `warn`, `info`, `debug` | `warn` |
//! | `KREPLAY_SNAPSHOT_SCOPE` | `agent`, `referenced` | `agent` |
//! | `KREPLAY_PASSES` | passes of the built-in tool (every dispatch replayed), at least 1; `KREPLAY_CUDA_PASSES` is read when it is unset | `1` (off) |
//!
//! ```
//! use kreplay::config::Config;
//! use kreplay_snapshot::RestoreStrategy;
//!
//! let config = Config::from_lookup(|name| match name {
//!     "KREPLAY_RESTORE" => Some("writeset".to_owned()),
//!     "KREPLAY_MAX_SNAPSHOT_BYTES" => Some("512M".to_owned()),
//!     _ => None,
//! })
//! .unwrap();
//! assert_eq!(config.restore, RestoreStrategy::Writeset);
//! assert_eq!(config.max_snapshot_bytes, Some(512 << 20));
//!
//! let err = Config::from_lookup(|name| {
//!     (name == "KREPLAY_RESTORE").then(|| "fast".to_owned())
//! })
//! .unwrap_err();
//! assert_eq!(err.variable, "KREPLAY_RESTORE");
//! assert_eq!(err.value, "fast");
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use kreplay_passloop::settings::{BYTE_COUNT_EXPECTED, parse_byte_count, parse_positive};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, SnapshotScope, StoreTier};

use crate::logging::LogLevel;

/// `KREPLAY_MAX_SNAPSHOT_BYTES`.
pub const ENV_MAX_SNAPSHOT_BYTES: &str = "KREPLAY_MAX_SNAPSHOT_BYTES";
/// `KREPLAY_DRAIN_TIMEOUT_MS`.
pub const ENV_DRAIN_TIMEOUT_MS: &str = kreplay_cuda::config::ENV_DRAIN_TIMEOUT_MS;
/// `KREPLAY_SNAPSHOT_STORE`.
pub const ENV_SNAPSHOT_STORE: &str = "KREPLAY_SNAPSHOT_STORE";
/// `KREPLAY_RESTORE`.
pub const ENV_RESTORE: &str = "KREPLAY_RESTORE";
/// `KREPLAY_SPILL_DIR`.
pub const ENV_SPILL_DIR: &str = "KREPLAY_SPILL_DIR";
/// `KREPLAY_LOG`.
pub const ENV_LOG: &str = "KREPLAY_LOG";
/// `KREPLAY_MAX_PASSES`.
pub const ENV_MAX_PASSES: &str = "KREPLAY_MAX_PASSES";
/// `KREPLAY_REPLAY_BUDGET_MS`.
pub const ENV_REPLAY_BUDGET_MS: &str = "KREPLAY_REPLAY_BUDGET_MS";
/// `KREPLAY_SNAPSHOT_SCOPE`.
pub const ENV_SNAPSHOT_SCOPE: &str = "KREPLAY_SNAPSHOT_SCOPE";
/// `KREPLAY_PASSES`.
pub const ENV_PASSES: &str = kreplay_cuda::config::ENV_PASSES;
/// The older, CUDA-only name of [`ENV_PASSES`], read when that is not set.
pub const ENV_CUDA_PASSES: &str = kreplay_cuda::config::ENV_CUDA_PASSES;

/// The drain timeout used when `KREPLAY_DRAIN_TIMEOUT_MS` is not set.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = kreplay_cuda::config::DEFAULT_DRAIN_TIMEOUT;

/// kreplay's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Snapshot budget in bytes; `None` (`0` in the environment) derives it from the memory
    /// available.
    pub max_snapshot_bytes: Option<u64>,
    /// How long to wait for queues, copies and passes to drain before declining.
    pub drain_timeout: Duration,
    /// Where snapshots are kept (`auto`: device shadow when the agent has room, else host
    /// memory, else a spill file).
    pub snapshot_store: StoreTier,
    /// How memory is restored between passes (`auto`: chosen per dispatch).
    pub restore: RestoreStrategy,
    /// Folder for spill files; `None` means the system temporary directory.
    pub spill_dir: Option<PathBuf>,
    /// How much is printed.
    pub log: LogLevel,
    /// The cap on passes per dispatch: a larger pass count is declined (`invalid_pass_count`)
    /// and an indefinite loop ends after this many passes.
    pub max_passes: u64,
    /// Time per dispatch after which no further pass starts (a running pass always finishes);
    /// `None`: no budget.
    pub replay_budget: Option<Duration>,
    /// What a replay snapshots: the agent's coarse-grained memory plus what the dispatch
    /// references (`agent`), or only what it references (`referenced`).
    pub snapshot_scope: SnapshotScope,
    /// Passes of the built-in tool, which replays every dispatch when no tool owns
    /// KERNEL_REPLAY; 1: off.
    pub passes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_snapshot_bytes: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            snapshot_store: StoreTier::Auto,
            restore: RestoreStrategy::Auto,
            spill_dir: None,
            log: LogLevel::Warn,
            max_passes: kreplay_passloop::DEFAULT_MAX_PASSES,
            replay_budget: None,
            snapshot_scope: SnapshotScope::Agent,
            passes: 1,
        }
    }
}

/// A malformed configuration variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable, e.g. `KREPLAY_RESTORE`.
    pub variable: &'static str,
    /// The value it held.
    pub value: String,
    /// What was expected.
    pub expected: String,
}

/// A setting read by the parsers libkreplay shares with the CUDA backend.
impl From<kreplay_cuda::config::BadSetting> for ConfigError {
    fn from(e: kreplay_cuda::config::BadSetting) -> ConfigError {
        ConfigError {
            variable: e.variable,
            value: e.value,
            expected: e.expected.to_owned(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}={:?}: expected {}",
            self.variable, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// Every variable [`Config::from_lookup`] reads.
const READ: [&str; 11] = [
    ENV_MAX_SNAPSHOT_BYTES,
    ENV_DRAIN_TIMEOUT_MS,
    ENV_SNAPSHOT_STORE,
    ENV_RESTORE,
    ENV_SPILL_DIR,
    ENV_LOG,
    ENV_MAX_PASSES,
    ENV_REPLAY_BUDGET_MS,
    ENV_SNAPSHOT_SCOPE,
    ENV_PASSES,
    ENV_CUDA_PASSES,
];

impl Config {
    /// Reads the process environment. A variable that is set but not valid Unicode is an error.
    pub fn from_env() -> Result<Config, ConfigError> {
        for variable in READ {
            if let Err(std::env::VarError::NotUnicode(raw)) = std::env::var(variable) {
                return Err(ConfigError {
                    variable,
                    value: raw.to_string_lossy().into_owned(),
                    expected: "a UTF-8 value".to_owned(),
                });
            }
        }
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (`None` = not set).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        if let Some(value) = lookup(ENV_MAX_SNAPSHOT_BYTES) {
            let bytes = parse_byte_count(&value).ok_or_else(|| ConfigError {
                variable: ENV_MAX_SNAPSHOT_BYTES,
                value: value.clone(),
                expected: BYTE_COUNT_EXPECTED.to_owned(),
            })?;
            config.max_snapshot_bytes = (bytes != 0).then_some(bytes);
        }
        if let Some(timeout) = kreplay_cuda::config::drain_timeout(&lookup)? {
            config.drain_timeout = timeout;
        }
        if let Some(value) = lookup(ENV_SNAPSHOT_STORE) {
            config.snapshot_store = parse_choice(
                ENV_SNAPSHOT_STORE,
                &value,
                "one of auto, device, host, file",
            )?;
        }
        if let Some(value) = lookup(ENV_RESTORE) {
            config.restore = parse_choice(
                ENV_RESTORE,
                &value,
                "one of auto, full, hash, writeset, writeset-unverified, tracked",
            )?;
        }
        if let Some(value) = lookup(ENV_SNAPSHOT_SCOPE) {
            config.snapshot_scope =
                parse_choice(ENV_SNAPSHOT_SCOPE, &value, "one of agent, referenced")?;
        }
        if let Some(value) = lookup(ENV_SPILL_DIR) {
            if value.trim().is_empty() {
                return Err(ConfigError {
                    variable: ENV_SPILL_DIR,
                    value,
                    expected: "a directory path".to_owned(),
                });
            }
            // Absolute from here on (as the record folder is): checked at load, it must name
            // the same folder at every spill, whatever folder the program moves to.
            let path = PathBuf::from(value);
            config.spill_dir = Some(std::path::absolute(&path).unwrap_or(path));
        }
        if let Some(value) = lookup(ENV_MAX_PASSES) {
            config.max_passes = parse_positive(&value).ok_or_else(|| ConfigError {
                variable: ENV_MAX_PASSES,
                value: value.clone(),
                expected: "a whole number of passes, at least 1 (digits only)".to_owned(),
            })?;
        }
        if let Some(value) = lookup(ENV_REPLAY_BUDGET_MS) {
            let millis = parse_positive(&value).ok_or_else(|| ConfigError {
                variable: ENV_REPLAY_BUDGET_MS,
                value: value.clone(),
                expected: "a whole number of milliseconds, at least 1 (digits only)".to_owned(),
            })?;
            config.replay_budget = Some(Duration::from_millis(millis));
        }
        // `KREPLAY_CUDA_PASSES` is the CUDA backend's older name for the same setting, read
        // when `KREPLAY_PASSES` is not set; the CUDA backend's configuration reads both
        // through the same function.
        if let Some(passes) = kreplay_cuda::config::built_in_passes(&lookup)? {
            config.passes = passes;
        }
        if let Some(value) = lookup(ENV_LOG) {
            config.log = value.parse().map_err(|_| ConfigError {
                variable: ENV_LOG,
                value: value.clone(),
                expected: "one of off, warn, info, debug".to_owned(),
            })?;
        }
        Ok(config)
    }

    /// The snapshot crate's configuration these settings give (budget, tier, strategy, spill
    /// folder; chunk size and verification interval at their defaults).
    pub fn snapshot_config(&self) -> SnapshotConfig {
        SnapshotConfig::default()
            // None (0 in the environment) derives the budget from the memory available.
            .with_max_bytes(SnapshotConfig::budget_from_setting(
                self.max_snapshot_bytes.unwrap_or(0),
            ))
            .with_store(self.snapshot_store)
            .with_strategy(self.restore)
            .with_spill_dir(self.spill_dir.clone())
            .with_scope(self.snapshot_scope)
    }

    /// The snapshot configuration's own checks (a spill folder no file can be created in), the
    /// error naming the variable that set the value at fault (`KREPLAY_SPILL_DIR`, not the
    /// field `spill_dir`).
    pub fn check_snapshot_config(&self) -> Result<(), String> {
        self.snapshot_config()
            .validate()
            .map_err(|e| match e.variable {
                "spill_dir" => format!("invalid {ENV_SPILL_DIR}: {}", e.message),
                _ => format!("invalid snapshot configuration: {e}"),
            })
    }

    /// The spill folder to use: `spill_dir`, else the system temporary directory.
    pub fn spill_dir_or_temp(&self) -> PathBuf {
        self.spill_dir.clone().unwrap_or_else(std::env::temp_dir)
    }
}

/// Parses a choice with its own `FromStr` (the snapshot crate's names, any ASCII case).
fn parse_choice<T: std::str::FromStr>(
    variable: &'static str,
    value: &str,
    expected: &str,
) -> Result<T, ConfigError> {
    value.parse().map_err(|_| ConfigError {
        variable,
        value: value.to_owned(),
        expected: expected.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config_from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn every_variable_read_is_checked_for_unicode_first() {
        // from_env refuses a value that is not UTF-8 in the variables it lists; one read but
        // not listed was taken as unset (KREPLAY_PASSES was): the list must be what is read.
        let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
        Config::from_lookup(|name| {
            asked.borrow_mut().insert(name.to_owned());
            None
        })
        .unwrap();
        let listed: std::collections::BTreeSet<String> =
            READ.iter().map(|s| s.to_string()).collect();
        assert_eq!(asked.into_inner(), listed);
    }

    #[test]
    fn unset_environment_gives_documented_defaults() {
        let config = config_from(&[]).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.max_snapshot_bytes, None);
        assert_eq!(config.drain_timeout, Duration::from_secs(10));
        assert_eq!(config.snapshot_store, StoreTier::Auto);
        assert_eq!(config.restore, RestoreStrategy::Auto);
        assert_eq!(config.spill_dir, None);
        assert_eq!(config.log, LogLevel::Warn);
        assert_eq!(config.max_passes, 1024);
        assert_eq!(config.replay_budget, None);
    }

    #[test]
    fn the_built_in_tools_passes_come_from_kreplay_passes_or_its_older_cuda_name() {
        assert_eq!(config_from(&[]).unwrap().passes, 1);
        assert_eq!(config_from(&[("KREPLAY_PASSES", "6")]).unwrap().passes, 6);
        assert_eq!(
            config_from(&[("KREPLAY_CUDA_PASSES", "38")])
                .unwrap()
                .passes,
            38
        );
        let both = config_from(&[("KREPLAY_PASSES", "6"), ("KREPLAY_CUDA_PASSES", "3")]);
        assert_eq!(both.unwrap().passes, 6);
        let err = config_from(&[("KREPLAY_CUDA_PASSES", "0")]).unwrap_err();
        assert_eq!(err.variable, "KREPLAY_CUDA_PASSES");
    }

    #[test]
    fn the_cap_on_passes_and_the_replay_budget_are_read() {
        let config = config_from(&[
            ("KREPLAY_MAX_PASSES", "64"),
            ("KREPLAY_REPLAY_BUDGET_MS", "1500"),
        ])
        .unwrap();
        assert_eq!(config.max_passes, 64);
        assert_eq!(config.replay_budget, Some(Duration::from_millis(1500)));
        assert_eq!(
            config_from(&[("KREPLAY_MAX_PASSES", "18446744073709551615")])
                .unwrap()
                .max_passes,
            u64::MAX
        );
    }

    #[test]
    fn the_built_in_tools_passes_are_read_and_zero_is_refused() {
        assert_eq!(Config::default().passes, 1);
        assert_eq!(config_from(&[("KREPLAY_PASSES", "38")]).unwrap().passes, 38);
        for bad in ["0", "four", "-1", " 4"] {
            let err = config_from(&[("KREPLAY_PASSES", bad)]).unwrap_err();
            assert_eq!(err.variable, "KREPLAY_PASSES", "{bad}");
        }
    }

    #[test]
    fn a_relative_spill_folder_is_taken_from_the_folder_kreplay_loads_in() {
        // Kept relative, it was checked at load against the folder the program was in then and
        // used at every spill against the folder it is in at that moment: a program that
        // changed folder had every replay that spills declined, or spilled somewhere else.
        let config = config_from(&[("KREPLAY_SPILL_DIR", "spill")]).unwrap();
        let expected = std::env::current_dir().unwrap().join("spill");
        assert_eq!(config.spill_dir, Some(expected));
    }

    #[test]
    fn every_variable_is_read() {
        let config = config_from(&[
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "4096"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "250"),
            ("KREPLAY_SNAPSHOT_STORE", "file"),
            ("KREPLAY_RESTORE", "Hash"),
            ("KREPLAY_SPILL_DIR", "/var/tmp/kreplay"),
            ("KREPLAY_LOG", "debug"),
        ])
        .unwrap();
        assert_eq!(config.max_snapshot_bytes, Some(4096));
        assert_eq!(config.drain_timeout, Duration::from_millis(250));
        assert_eq!(config.snapshot_store, StoreTier::File);
        assert_eq!(config.restore, RestoreStrategy::Hash);
        assert_eq!(config.spill_dir, Some(PathBuf::from("/var/tmp/kreplay")));
        assert_eq!(config.log, LogLevel::Debug);
    }

    #[test]
    fn the_snapshot_configuration_carries_budget_tier_strategy_and_spill_folder() {
        let config = config_from(&[
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "4K"),
            ("KREPLAY_SNAPSHOT_STORE", "file"),
            ("KREPLAY_RESTORE", "writeset"),
            ("KREPLAY_SPILL_DIR", "/var/tmp/kreplay"),
        ])
        .unwrap()
        .snapshot_config();
        assert_eq!(config.max_bytes, Some(4096));
        assert_eq!(config.store, StoreTier::File);
        assert_eq!(config.strategy, RestoreStrategy::Writeset);
        assert_eq!(config.spill_dir, Some(PathBuf::from("/var/tmp/kreplay")));
        let derived = config_from(&[]).unwrap().snapshot_config();
        // MemAvailable moves between reads: compare whether a budget was derived, not its value.
        assert_eq!(
            derived.max_bytes.is_some(),
            SnapshotConfig::derived_budget().is_some(),
            "0 derives the budget from available memory"
        );
    }

    #[test]
    fn snapshot_budget_zero_means_derive_and_units_are_binary() {
        let budget = |v: &str| {
            config_from(&[("KREPLAY_MAX_SNAPSHOT_BYTES", v)])
                .unwrap()
                .max_snapshot_bytes
        };
        assert_eq!(budget("0"), None);
        assert_eq!(budget("1k"), Some(1024));
        assert_eq!(budget("3MiB"), Some(3 << 20));
        assert_eq!(budget(" 2 G "), Some(2 << 30));
        assert_eq!(budget("1TB"), Some(1 << 40));
        assert_eq!(budget("18446744073709551615"), Some(u64::MAX));
    }

    #[test]
    fn every_store_and_restore_choice_parses() {
        for (text, store) in [
            ("auto", StoreTier::Auto),
            ("device", StoreTier::Device),
            ("HOST", StoreTier::Host),
            ("file", StoreTier::File),
        ] {
            let config = config_from(&[("KREPLAY_SNAPSHOT_STORE", text)]).unwrap();
            assert_eq!(config.snapshot_store, store);
        }
        for (text, mode) in [
            ("auto", RestoreStrategy::Auto),
            ("full", RestoreStrategy::Full),
            ("hash", RestoreStrategy::Hash),
            ("writeset", RestoreStrategy::Writeset),
            ("writeset-unverified", RestoreStrategy::WritesetUnverified),
            ("tracked", RestoreStrategy::Tracked),
        ] {
            assert_eq!(
                config_from(&[("KREPLAY_RESTORE", text)]).unwrap().restore,
                mode
            );
        }
    }

    #[test]
    fn snapshot_scope_takes_agent_or_referenced_and_refuses_anything_else() {
        assert_eq!(
            config_from(&[]).unwrap().snapshot_config().scope,
            SnapshotScope::Agent
        );
        let config = config_from(&[("KREPLAY_SNAPSHOT_SCOPE", "referenced")]).unwrap();
        assert_eq!(config.snapshot_scope, SnapshotScope::Referenced);
        assert_eq!(config.snapshot_config().scope, SnapshotScope::Referenced);
        for bad in ["", "all", "device", "referenced,agent"] {
            let err = config_from(&[("KREPLAY_SNAPSHOT_SCOPE", bad)]).unwrap_err();
            assert_eq!(err.variable, "KREPLAY_SNAPSHOT_SCOPE");
            assert_eq!(err.value, bad);
            assert!(err.to_string().contains("agent, referenced"), "{err}");
        }
    }

    #[test]
    fn malformed_values_are_errors_naming_variable_and_value() {
        let cases = [
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "lots"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "-1"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "12X"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", ""),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "18446744073709551616"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "17179869184G"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "0"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "1.5"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "soon"),
            ("KREPLAY_SNAPSHOT_STORE", "gpu"),
            ("KREPLAY_SNAPSHOT_STORE", ""),
            ("KREPLAY_RESTORE", "fast"),
            ("KREPLAY_SPILL_DIR", ""),
            ("KREPLAY_SPILL_DIR", "  "),
            ("KREPLAY_LOG", "trace"),
            ("KREPLAY_MAX_PASSES", "0"),
            ("KREPLAY_MAX_PASSES", ""),
            ("KREPLAY_MAX_PASSES", "-5"),
            ("KREPLAY_MAX_PASSES", "+5"),
            ("KREPLAY_MAX_PASSES", " 5"),
            ("KREPLAY_MAX_PASSES", "5k"),
            ("KREPLAY_MAX_PASSES", "18446744073709551616"),
            ("KREPLAY_REPLAY_BUDGET_MS", "0"),
            ("KREPLAY_REPLAY_BUDGET_MS", "1.5"),
            ("KREPLAY_REPLAY_BUDGET_MS", "10s"),
            ("KREPLAY_RESTORE", "writeset_unverified"),
        ];
        for (variable, value) in cases {
            let err = config_from(&[(variable, value)]).unwrap_err();
            assert_eq!(err.variable, variable, "{variable}={value:?}");
            assert_eq!(err.value, value);
            let message = err.to_string();
            assert!(message.contains(variable), "{message}");
            assert!(message.contains(&format!("{value:?}")), "{message}");
        }
    }

    #[test]
    fn choice_errors_list_the_accepted_values() {
        let err = config_from(&[("KREPLAY_SNAPSHOT_STORE", "gpu")]).unwrap_err();
        assert_eq!(err.expected, "one of auto, device, host, file");
        let err = config_from(&[("KREPLAY_RESTORE", "fast")]).unwrap_err();
        assert_eq!(
            err.expected,
            "one of auto, full, hash, writeset, writeset-unverified, tracked"
        );
    }
}
