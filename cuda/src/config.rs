//! The injected library's configuration, from `KREPLAY_*` environment variables.

use std::time::Duration;

use kreplay_passloop::settings::{BYTE_COUNT_EXPECTED, parse_byte_count, parse_positive, read_env};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, SnapshotScope, StoreTier};

use crate::devruntime::HeapPolicy;
use crate::memory::ShadowBudget;

pub use kreplay_passloop::settings::LogLevel;

/// Everything the injected library reads at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Passes per kernel launch of the built-in tool (`KREPLAY_PASSES`, or its older CUDA-only
    /// name `KREPLAY_CUDA_PASSES`; default 1 = no replay).
    pub passes: u64,
    /// Snapshot store, strategy, budget and spill directory.
    pub snapshot: SnapshotConfig,
    /// What a device shadow must leave free.
    pub shadow: ShadowBudget,
    /// Log level (`KREPLAY_LOG`).
    pub log: LogLevel,
    /// `auto` on a device shadow: whether detection runs on the device is chosen from what this
    /// process measured (`KREPLAY_CUDA_AUTO_DEVICE=measured`, the default; see
    /// [`crate::choice`]) or from the fitted cost model alone (`model`).
    pub auto_measured: bool,
    /// What launches do once a kernel has used the device heap on their context
    /// (`KREPLAY_CUDA_DEVICE_HEAP`, `decline` or `trust`; see [`crate::devruntime`]).
    pub device_heap: HeapPolicy,
    /// How long the drain before a snapshot is waited for before the replay is declined
    /// (`KREPLAY_DRAIN_TIMEOUT_MS`, shared with the HSA backend; see [`crate::drainer`]).
    pub drain_timeout: Duration,
}

/// Digits only (no sign, space or unit), as every numeric `KREPLAY_*` setting.
fn parse_u64(var: &'static str, value: &str) -> Result<u64, String> {
    let bad = || format!("{var}={value:?}: expected a non-negative integer (digits only)");
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    value.parse::<u64>().map_err(|_| bad())
}

/// `KREPLAY_PASSES`: passes per launch (or dispatch) of the built-in tool.
pub const ENV_PASSES: &str = "KREPLAY_PASSES";
/// The older, CUDA-only name of [`ENV_PASSES`], read when that is not set.
pub const ENV_CUDA_PASSES: &str = "KREPLAY_CUDA_PASSES";
/// What [`built_in_passes`] accepts, for error messages.
pub const PASSES_EXPECTED: &str = "a whole number of passes, at least 1 (digits only)";

/// A setting that is set but not valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadSetting {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What it should have been.
    pub expected: &'static str,
}

impl std::fmt::Display for BadSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={:?}: expected {}",
            self.variable, self.value, self.expected
        )
    }
}

/// The built-in tool's passes: `KREPLAY_PASSES`, else its older CUDA-only name
/// `KREPLAY_CUDA_PASSES`; `None` when neither is set. The one reader of these two variables:
/// libkreplay's configuration (both backends) and the CUDA backend's call it.
pub fn built_in_passes(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<u64>, BadSetting> {
    let Some((variable, value)) = lookup(ENV_PASSES)
        .map(|v| (ENV_PASSES, v))
        .or_else(|| lookup(ENV_CUDA_PASSES).map(|v| (ENV_CUDA_PASSES, v)))
    else {
        return Ok(None);
    };
    match parse_positive(&value) {
        Some(n) => Ok(Some(n)),
        None => Err(BadSetting {
            variable,
            value,
            expected: PASSES_EXPECTED,
        }),
    }
}

/// `KREPLAY_DRAIN_TIMEOUT_MS`: how long a drain before a snapshot may wait.
pub const ENV_DRAIN_TIMEOUT_MS: &str = "KREPLAY_DRAIN_TIMEOUT_MS";
/// The drain timeout used when [`ENV_DRAIN_TIMEOUT_MS`] is not set.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_millis(10_000);
/// What [`drain_timeout`] accepts, for error messages.
pub const DRAIN_TIMEOUT_EXPECTED: &str = "a whole number of milliseconds, at least 1";

/// The drain timeout, `None` when [`ENV_DRAIN_TIMEOUT_MS`] is not set. The one reader of the
/// variable: libkreplay's configuration (both backends) and the CUDA backend's call it.
pub fn drain_timeout(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Duration>, BadSetting> {
    let Some(value) = lookup(ENV_DRAIN_TIMEOUT_MS) else {
        return Ok(None);
    };
    match parse_positive(&value) {
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
        None => Err(BadSetting {
            variable: ENV_DRAIN_TIMEOUT_MS,
            value,
            expected: DRAIN_TIMEOUT_EXPECTED,
        }),
    }
}

/// `KREPLAY_CUDA_PTX` names a file the kernels can be read from: text with no NUL byte. Read
/// only when the kernels are first needed, a file that is not would leave every hash to the
/// host without a word; whether the driver compiles it is known only then.
fn check_ptx_file(path: &str) -> Result<(), String> {
    let var = crate::kernels::PTX_ENV;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{var}={path:?}: {e}; expected a readable PTX text file"))?;
    if text.contains('\0') {
        return Err(format!(
            "{var}={path:?}: holds a NUL byte; expected a PTX text file"
        ));
    }
    Ok(())
}

impl Config {
    /// Read the configuration through `lookup` (the environment in production).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let passes = built_in_passes(&lookup)
            .map_err(|e| e.to_string())?
            .unwrap_or(1);
        let mut snapshot = SnapshotConfig::default();
        if let Some(v) = lookup("KREPLAY_SNAPSHOT_STORE") {
            snapshot.store = v
                .parse::<StoreTier>()
                .map_err(|e| format!("KREPLAY_SNAPSHOT_STORE: {e}"))?;
        }
        if let Some(v) = lookup("KREPLAY_RESTORE") {
            snapshot.strategy = v
                .parse::<RestoreStrategy>()
                .map_err(|e| format!("KREPLAY_RESTORE: {e}"))?;
        }
        snapshot.max_bytes = match lookup("KREPLAY_MAX_SNAPSHOT_BYTES") {
            Some(v) => {
                SnapshotConfig::budget_from_setting(parse_byte_count(&v).ok_or_else(|| {
                    format!("KREPLAY_MAX_SNAPSHOT_BYTES={v:?}: expected {BYTE_COUNT_EXPECTED}")
                })?)
            }
            None => SnapshotConfig::derived_budget(),
        };
        if let Some(v) = lookup("KREPLAY_SNAPSHOT_SCOPE") {
            snapshot.scope = v
                .parse::<SnapshotScope>()
                .map_err(|e| format!("KREPLAY_SNAPSHOT_SCOPE: {e}"))?;
        }
        if let Some(v) = lookup("KREPLAY_SPILL_DIR") {
            // Absolute from here on, as libkreplay's configuration reads it: the same folder at
            // every spill, whatever folder the program moves to.
            let path = std::path::PathBuf::from(v);
            snapshot.spill_dir = Some(std::path::absolute(&path).unwrap_or(path));
        }
        let mut shadow = ShadowBudget::default();
        if let Some(v) = lookup("KREPLAY_CUDA_SHADOW_HEADROOM_MIB") {
            shadow.min_headroom = parse_u64("KREPLAY_CUDA_SHADOW_HEADROOM_MIB", &v)?
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("KREPLAY_CUDA_SHADOW_HEADROOM_MIB={v:?}: too large"))?;
        }
        // One parser for both readers of the variable in a process (libkreplay's logging too).
        let log = match lookup("KREPLAY_LOG") {
            None => LogLevel::Warn,
            Some(v) => v
                .parse::<LogLevel>()
                .map_err(|e| format!("KREPLAY_LOG: {e}"))?,
        };
        // Any ASCII case, spaces around ignored, as every other choice is read.
        let auto_device = lookup("KREPLAY_CUDA_AUTO_DEVICE");
        let auto_measured = match auto_device
            .as_deref()
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("measured") => true,
            Some("model") => false,
            Some(_) => {
                return Err(format!(
                    "KREPLAY_CUDA_AUTO_DEVICE={:?}: expected measured or model",
                    auto_device.unwrap_or_default()
                ));
            }
        };
        let device_heap = match lookup("KREPLAY_CUDA_DEVICE_HEAP") {
            Some(v) => v
                .parse::<HeapPolicy>()
                .map_err(|e| format!("KREPLAY_CUDA_DEVICE_HEAP={e}"))?,
            None => HeapPolicy::Decline,
        };
        if let Some(path) = lookup(crate::kernels::PTX_ENV) {
            check_ptx_file(&path)?;
        }
        let drain_timeout = drain_timeout(&lookup)
            .map_err(|e| e.to_string())?
            .unwrap_or(DEFAULT_DRAIN_TIMEOUT);
        snapshot.validate().map_err(|e| match e.variable {
            "spill_dir" => format!("invalid KREPLAY_SPILL_DIR: {}", e.message),
            _ => format!("snapshot configuration: {e}"),
        })?;
        Ok(Config {
            passes,
            snapshot,
            shadow,
            log,
            auto_measured,
            device_heap,
            drain_timeout,
        })
    }

    /// Read the configuration from the environment. A value that is not valid Unicode is an
    /// error naming its variable, never taken as unset.
    pub fn from_env() -> Result<Config, String> {
        read_env(
            |lookup| Config::from_lookup(lookup),
            |name, value| format!("{name}={value:?}: expected a UTF-8 value"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn auto_chooses_device_detection_from_measurements_unless_asked_for_the_model() {
        assert!(with(&[]).unwrap().auto_measured);
        assert!(
            with(&[("KREPLAY_CUDA_AUTO_DEVICE", "measured")])
                .unwrap()
                .auto_measured
        );
        assert!(
            !with(&[("KREPLAY_CUDA_AUTO_DEVICE", " model ")])
                .unwrap()
                .auto_measured
        );
        let e = with(&[("KREPLAY_CUDA_AUTO_DEVICE", "fitted")]).unwrap_err();
        assert!(
            e.contains("KREPLAY_CUDA_AUTO_DEVICE") && e.contains("fitted"),
            "{e}"
        );
    }

    #[test]
    fn a_relative_spill_folder_is_taken_from_the_folder_kreplay_loads_in() {
        // The crate's folder, where the tests run, has `src`.
        let c = with(&[("KREPLAY_SPILL_DIR", "src")]).unwrap();
        let expected = std::env::current_dir().unwrap().join("src");
        assert_eq!(c.snapshot.spill_dir, Some(expected));
        let e = with(&[("KREPLAY_SPILL_DIR", "no-such-folder")]).unwrap_err();
        assert!(e.starts_with("invalid KREPLAY_SPILL_DIR: "), "{e}");
    }

    #[test]
    fn defaults_mean_no_replay_and_auto_tiers() {
        let c = with(&[]).unwrap();
        assert_eq!(c.passes, 1);
        assert_eq!(c.snapshot.store, StoreTier::Auto);
        assert_eq!(c.snapshot.strategy, RestoreStrategy::Auto);
        assert_eq!(c.log, LogLevel::Warn);
        assert_eq!(c.shadow, ShadowBudget::default());
        assert_eq!(c.snapshot.scope, SnapshotScope::Agent);
        assert_eq!(c.device_heap, HeapPolicy::Decline);
        assert_eq!(c.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
        let short = with(&[("KREPLAY_DRAIN_TIMEOUT_MS", "250")]).unwrap();
        assert_eq!(short.drain_timeout, Duration::from_millis(250));
        let trusted = with(&[("KREPLAY_CUDA_DEVICE_HEAP", "trust")]).unwrap();
        assert_eq!(trusted.device_heap, HeapPolicy::Trust);
    }

    #[test]
    fn the_snapshot_scope_is_read_and_checked() {
        let c = with(&[("KREPLAY_SNAPSHOT_SCOPE", "referenced")]).unwrap();
        assert_eq!(c.snapshot.scope, SnapshotScope::Referenced);
        let err = with(&[("KREPLAY_SNAPSHOT_SCOPE", "device")]).unwrap_err();
        assert!(
            err.contains("KREPLAY_SNAPSHOT_SCOPE") && err.contains("referenced"),
            "{err}"
        );
    }

    #[test]
    fn settings_are_read() {
        let c = with(&[
            ("KREPLAY_CUDA_PASSES", "4"),
            ("KREPLAY_SNAPSHOT_STORE", "host"),
            ("KREPLAY_RESTORE", "full"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "1048576"),
            ("KREPLAY_CUDA_SHADOW_HEADROOM_MIB", "512"),
            ("KREPLAY_LOG", "info"),
        ])
        .unwrap();
        assert_eq!(c.passes, 4);
        assert_eq!(c.snapshot.store, StoreTier::Host);
        assert_eq!(c.snapshot.strategy, RestoreStrategy::Full);
        assert_eq!(c.snapshot.max_bytes, Some(1 << 20));
        assert_eq!(c.shadow.min_headroom, 512 << 20);
        assert_eq!(c.log, LogLevel::Info);
    }

    #[test]
    fn kreplay_passes_is_read_before_the_older_cuda_name() {
        assert_eq!(with(&[("KREPLAY_PASSES", "6")]).unwrap().passes, 6);
        let both = with(&[("KREPLAY_PASSES", "6"), ("KREPLAY_CUDA_PASSES", "3")]).unwrap();
        assert_eq!(both.passes, 6);
        let err = with(&[("KREPLAY_PASSES", "0")]).unwrap_err();
        assert!(
            err.contains("KREPLAY_PASSES") && err.contains("at least 1"),
            "{err}"
        );
    }

    #[test]
    fn the_snapshot_budget_takes_the_same_units_as_the_c_abi_configuration() {
        for (value, bytes) in [
            ("512M", 512u64 << 20),
            ("4GiB", 4 << 30),
            ("64k", 64 << 10),
            ("1048576", 1 << 20),
        ] {
            let c = with(&[("KREPLAY_MAX_SNAPSHOT_BYTES", value)]).unwrap();
            assert_eq!(c.snapshot.max_bytes, Some(bytes), "{value}");
        }
    }

    #[test]
    fn a_ptx_file_that_cannot_be_read_is_refused_at_start() {
        // Unreadable, the kernels would fail to load at the first launch that needs them, and
        // every hash would be taken on the host instead, with nothing said.
        let missing = std::env::temp_dir().join("kreplay-no-such-dir/kernels.ptx");
        for value in [missing.to_str().unwrap(), ""] {
            let err = with(&[("KREPLAY_CUDA_PTX", value)]).unwrap_err();
            assert!(err.contains("KREPLAY_CUDA_PTX"), "{err}");
        }
        let dir = std::env::temp_dir().join(format!("kreplay-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join("binary.ptx");
        std::fs::write(&binary, b"\x7fELF\0\0").unwrap();
        let err = with(&[("KREPLAY_CUDA_PTX", binary.to_str().unwrap())]).unwrap_err();
        assert!(err.contains("KREPLAY_CUDA_PTX"), "{err}");
        let text = dir.join("kernels.ptx");
        std::fs::write(&text, ".version 8.0\n").unwrap();
        assert!(with(&[("KREPLAY_CUDA_PTX", text.to_str().unwrap())]).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_values_name_the_variable_and_what_was_expected() {
        for (var, value, expect) in [
            ("KREPLAY_CUDA_PASSES", "four", "whole number"),
            ("KREPLAY_CUDA_PASSES", "+4", "digits only"),
            ("KREPLAY_CUDA_PASSES", " 4", "digits only"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "1X", "512M"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "-1G", "512M"),
            ("KREPLAY_CUDA_PASSES", "0", "at least 1"),
            ("KREPLAY_SNAPSHOT_STORE", "gpu", "auto, device, host, file"),
            ("KREPLAY_RESTORE", "fast", "writeset"),
            ("KREPLAY_LOG", "loud", "off, warn, info, debug"),
            ("KREPLAY_CUDA_DEVICE_HEAP", "ignore", "decline or trust"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "0", "at least 1"),
            ("KREPLAY_DRAIN_TIMEOUT_MS", "soon", "milliseconds"),
            ("KREPLAY_CUDA_SHADOW_HEADROOM_MIB", "-1", "non-negative"),
        ] {
            let err = with(&[(var, value)]).unwrap_err();
            assert!(err.contains(var) && err.contains(expect), "{err}");
        }
    }
}
