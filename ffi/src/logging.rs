//! kreplay's diagnostics, through the [`log` crate](::log) facade, and the stderr sink C hosts get.
//!
//! Every message goes to whatever logger the process has installed (target `kreplay`), so a Rust
//! program using the crates decides where kreplay's diagnostics go. A process without a logger,
//! such as a C application kreplay is loaded into, gets kreplay's own stderr sink, installed by
//! `OnLoad` ([`install_stderr_logger`]): it prints every line prefixed `kreplay:` and keeps only
//! what `KREPLAY_LOG=off|warn|info|debug` (default `warn`), read on first use, or [`set_level`]
//! lets through. Errors are printed at every level but `off`. A malformed `KREPLAY_LOG` is
//! reported once as an error and the default level is used for the sink itself;
//! [`crate::config::Config::from_env`] reports the same value as a startup error.
//!
//! ```
//! use kreplay::logging::{self, LogLevel};
//!
//! logging::install_stderr_logger();
//! logging::set_level(LogLevel::Info);
//! assert!(logging::enabled(LogLevel::Info));
//! assert!(!logging::enabled(LogLevel::Debug));
//! kreplay::kreplay_info!("{} contexts configured", 2);
//! ```

use std::collections::HashSet;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use parking_lot::Mutex;

pub use kreplay_passloop::settings::{LogLevel, ParseLogLevelError};

/// The level stored in [`LEVEL`] as a byte.
fn level_from_u8(value: u8) -> LogLevel {
    match value {
        0 => LogLevel::Off,
        1 => LogLevel::Warn,
        2 => LogLevel::Info,
        _ => LogLevel::Debug,
    }
}

/// The severity of one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something failed; printed unless the level is `off`.
    Error,
    /// Printed at `warn` and above.
    Warn,
    /// Printed at `info` and above.
    Info,
    /// Printed at `debug`.
    Debug,
}

impl Severity {
    fn threshold(self) -> LogLevel {
        match self {
            Severity::Error | Severity::Warn => LogLevel::Warn,
            Severity::Info => LogLevel::Info,
            Severity::Debug => LogLevel::Debug,
        }
    }

    fn level(self) -> log::Level {
        match self {
            Severity::Error => log::Level::Error,
            Severity::Warn => log::Level::Warn,
            Severity::Info => log::Level::Info,
            Severity::Debug => log::Level::Debug,
        }
    }

    /// The severity of a `log` level (trace counts as debug).
    fn of(level: log::Level) -> Severity {
        match level {
            log::Level::Error => Severity::Error,
            log::Level::Warn => Severity::Warn,
            log::Level::Info => Severity::Info,
            log::Level::Debug | log::Level::Trace => Severity::Debug,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warn => "warning",
            Severity::Info => "info",
            Severity::Debug => "debug",
        }
    }
}

const LEVEL_UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(LEVEL_UNSET);
static ONCE_KEYS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`).
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 1] = [&ONCE_KEYS];

/// The current level (reads `KREPLAY_LOG` on first use).
pub fn level() -> LogLevel {
    let raw = LEVEL.load(Ordering::Relaxed);
    if raw != LEVEL_UNSET {
        return level_from_u8(raw);
    }
    let from_env = std::env::var("KREPLAY_LOG").ok();
    let (chosen, bad) = match from_env.as_deref().map(str::parse::<LogLevel>) {
        None => (LogLevel::default(), None),
        Some(Ok(level)) => (level, None),
        Some(Err(err)) => (LogLevel::default(), Some(err)),
    };
    // Only the first thread to resolve the level reports a malformed value.
    if LEVEL
        .compare_exchange(
            LEVEL_UNSET,
            chosen as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        if let Some(err) = bad {
            emit(
                Severity::Error,
                format_args!("invalid KREPLAY_LOG: {err}; using \"warn\""),
            );
        }
        chosen
    } else {
        level_from_u8(LEVEL.load(Ordering::Relaxed))
    }
}

/// Sets the level of the stderr sink, overriding `KREPLAY_LOG`.
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    if SINK_INSTALLED.load(Ordering::Relaxed) {
        log::set_max_level(filter(level));
    }
}

/// Would the stderr sink print a message needing `level`?
pub fn enabled(level: LogLevel) -> bool {
    level != LogLevel::Off && self::level() >= level
}

/// Would the stderr sink print a message of `severity`?
pub fn severity_enabled(severity: Severity) -> bool {
    enabled(severity.threshold())
}

/// The line the stderr sink prints for a message, without the trailing newline:
/// `kreplay: <error|warning|info|debug>: <message>`.
pub fn format_line(severity: Severity, message: fmt::Arguments<'_>) -> String {
    format!("kreplay: {}: {}", severity.tag(), message)
}

/// Hands `message` at `severity` to the process's logger (target `kreplay`); returns whether
/// the logger takes messages of that severity.
pub fn log(severity: Severity, message: fmt::Arguments<'_>) -> bool {
    let level = severity.level();
    if !log::log_enabled!(target: TARGET, level) {
        return false;
    }
    log::log!(target: TARGET, level, "{message}");
    true
}

/// A failure that stops kreplay (a refused `OnLoad`, a panic while unloading), reported as an
/// error like every other diagnostic: kreplay's stderr sink is installed first unless the
/// process has a logger, so a C host always sees it (unless `KREPLAY_LOG=off`) and a Rust host's
/// logger receives it.
pub fn report_failure(message: fmt::Arguments<'_>) {
    install_stderr_logger();
    log(Severity::Error, message);
}

/// The `log` target of kreplay's own messages.
pub const TARGET: &str = "kreplay";

/// Installs kreplay's stderr sink as the process's logger, unless the process already has a
/// logger (which then keeps receiving kreplay's messages). Returns whether the sink is the
/// logger now. `OnLoad` calls it; a Rust host that wants kreplay's diagnostics elsewhere
/// installs its own logger first.
pub fn install_stderr_logger() -> bool {
    if SINK_INSTALLED.load(Ordering::Relaxed) {
        return true;
    }
    if log::set_logger(&StderrSink).is_err() {
        return false;
    }
    SINK_INSTALLED.store(true, Ordering::Relaxed);
    log::set_max_level(filter(level()));
    true
}

static SINK_INSTALLED: AtomicBool = AtomicBool::new(false);

/// The facade's filter for a `KREPLAY_LOG` level.
fn filter(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Off => log::LevelFilter::Off,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
    }
}

/// kreplay's stderr sink: `kreplay: <severity>: <message>` lines, filtered by `KREPLAY_LOG`.
struct StderrSink;

impl log::Log for StderrSink {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        severity_enabled(Severity::of(metadata.level()))
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            emit(Severity::of(record.level()), *record.args());
        }
    }

    fn flush(&self) {}
}

fn emit(severity: Severity, message: fmt::Arguments<'_>) {
    let mut line = format_line(severity, message);
    line.push('\n');
    // A closed or full stderr must not turn into a panic: the message is dropped.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs a warning the first time it is called with `key`, and never again for that key in this
/// process. Returns whether it was logged. Keys whose warning the logger would not take are
/// not spent.
pub fn warn_once(key: &'static str, message: fmt::Arguments<'_>) -> bool {
    if !log::log_enabled!(target: TARGET, log::Level::Warn) {
        return false;
    }
    let first = {
        let mut keys = ONCE_KEYS.lock();
        keys.get_or_insert_with(HashSet::new).insert(key)
    };
    first && log(Severity::Warn, message)
}

/// Prints an error (unless `KREPLAY_LOG=off`).
#[macro_export]
macro_rules! kreplay_error {
    ($($arg:tt)*) => {
        $crate::logging::log($crate::logging::Severity::Error, format_args!($($arg)*))
    };
}

/// Prints a warning (at `KREPLAY_LOG=warn` and above).
#[macro_export]
macro_rules! kreplay_warn {
    ($($arg:tt)*) => {
        $crate::logging::log($crate::logging::Severity::Warn, format_args!($($arg)*))
    };
}

/// Prints a note (at `KREPLAY_LOG=info` and above).
#[macro_export]
macro_rules! kreplay_info {
    ($($arg:tt)*) => {
        $crate::logging::log($crate::logging::Severity::Info, format_args!($($arg)*))
    };
}

/// Prints detail (at `KREPLAY_LOG=debug`).
#[macro_export]
macro_rules! kreplay_debug {
    ($($arg:tt)*) => {
        $crate::logging::log($crate::logging::Severity::Debug, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_parse_case_insensitively_and_reject_others() {
        assert_eq!("off".parse::<LogLevel>(), Ok(LogLevel::Off));
        assert_eq!(" WARN ".parse::<LogLevel>(), Ok(LogLevel::Warn));
        assert_eq!("Info".parse::<LogLevel>(), Ok(LogLevel::Info));
        assert_eq!("debug".parse::<LogLevel>(), Ok(LogLevel::Debug));
        let err = "verbose".parse::<LogLevel>().unwrap_err();
        assert_eq!(err.value, "verbose");
        assert!(err.to_string().contains("off, warn, info, debug"));
        assert!("".parse::<LogLevel>().is_err());
    }

    #[test]
    fn lines_carry_the_kreplay_prefix_and_severity() {
        assert_eq!(
            format_line(Severity::Warn, format_args!("x = {}", 3)),
            "kreplay: warning: x = 3"
        );
        assert_eq!(
            format_line(Severity::Error, format_args!("lost")),
            "kreplay: error: lost"
        );
    }

    // The level is process-wide, so every level-dependent check lives in this one test.
    #[test]
    fn level_filters_messages_and_warn_once_fires_once_per_key() {
        assert!(install_stderr_logger());
        set_level(LogLevel::Off);
        assert!(!kreplay_error!("hidden"));
        assert!(!warn_once("logging-test-key", format_args!("hidden")));

        set_level(LogLevel::Warn);
        assert!(kreplay_error!("logging test: an error line"));
        assert!(kreplay_warn!("logging test: a warning line"));
        assert!(!kreplay_info!("hidden"));
        assert!(!kreplay_debug!("hidden"));
        assert!(warn_once(
            "logging-test-key",
            format_args!("logging test: once")
        ));
        assert!(!warn_once(
            "logging-test-key",
            format_args!("never printed")
        ));
        assert!(warn_once(
            "logging-test-other-key",
            format_args!("logging test: other")
        ));

        set_level(LogLevel::Debug);
        assert!(kreplay_info!("logging test: info line"));
        assert!(kreplay_debug!("logging test: debug line"));
        assert!(enabled(LogLevel::Debug));
        assert!(!enabled(LogLevel::Off));
        set_level(LogLevel::Warn);
    }
}
