//! Parsers for the numeric settings every backend reads from its environment, so that one value
//! means the same thing whichever backend reads it.

/// A whole number of at least 1 written as ASCII digits only (no sign, space or unit); `None`
/// otherwise or on overflow. Pass counts and millisecond budgets are read this way.
pub fn parse_positive(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok().filter(|&n| n > 0)
}

/// What [`parse_byte_count`] accepts, for error messages.
pub const BYTE_COUNT_EXPECTED: &str =
    "a byte count such as 0, 1073741824, 512M or 4GiB (0 = derive)";

/// A byte count: decimal digits, optionally followed by a binary unit `K`, `M`, `G` or `T`
/// (also `KB`/`KiB`, ..., any case); spaces around the value and before the unit are allowed.
/// `None` for anything else or on overflow.
pub fn parse_byte_count(text: &str) -> Option<u64> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    number.checked_mul(1u64 << binary_unit_shift(unit.trim())?)
}

/// The power of two of a binary size unit as byte counts write it: none or `B` 0, `K`/`KB`/`KiB`
/// 10, `M`... 20, `G`... 30, `T`... 40, any case; `None` for anything else (spaces included).
pub fn binary_unit_shift(unit: &str) -> Option<u32> {
    match unit.to_ascii_lowercase().as_str() {
        "" | "b" => Some(0),
        "k" | "kb" | "kib" => Some(10),
        "m" | "mb" | "mib" => Some(20),
        "g" | "gb" | "gib" => Some(30),
        "t" | "tb" | "tib" => Some(40),
        _ => None,
    }
}

/// Runs `read` (a configuration reader taking a lookup of variables) over the process
/// environment. A variable it asks for whose value is not valid Unicode is the error
/// `not_unicode(name, value)`, never taken as unset: a malformed value is never a silent
/// default.
pub fn read_env<T, E>(
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T, E>,
    not_unicode: impl FnOnce(&str, String) -> E,
) -> Result<T, E> {
    let bad: std::cell::RefCell<Option<(String, String)>> = std::cell::RefCell::new(None);
    let lookup = |name: &str| match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(raw)) => {
            bad.borrow_mut()
                .get_or_insert_with(|| (name.to_owned(), raw.to_string_lossy().into_owned()));
            None
        }
    };
    let result = read(&lookup);
    match bad.into_inner() {
        Some((name, value)) => Err(not_unicode(&name, value)),
        None => result,
    }
}

/// How much kreplay prints (`KREPLAY_LOG`), read the same way by every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    /// Nothing at all.
    Off,
    /// Errors and warnings, and the CUDA backend's exit summary (the default).
    #[default]
    Warn,
    /// Also one-line notes about what kreplay does (tools found, replays declined, ...).
    Info,
    /// Also per-dispatch detail (on CUDA, every tracked allocation and free).
    Debug,
}

impl LogLevel {
    /// The value as written in `KREPLAY_LOG`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

/// `KREPLAY_LOG` held a value that is not `off`, `warn`, `info` or `debug`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseLogLevelError {
    /// The rejected text.
    pub value: String,
}

impl std::fmt::Display for ParseLogLevelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} is not a log level (expected one of off, warn, info, debug)",
            self.value
        )
    }
}

impl std::error::Error for ParseLogLevelError {}

impl std::str::FromStr for LogLevel {
    type Err = ParseLogLevelError;

    /// Parses `off`, `warn`, `info` or `debug` (ASCII case-insensitive, surrounding spaces
    /// ignored).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        [
            LogLevel::Off,
            LogLevel::Warn,
            LogLevel::Info,
            LogLevel::Debug,
        ]
        .into_iter()
        .find(|level| trimmed.eq_ignore_ascii_case(level.as_str()))
        .ok_or_else(|| ParseLogLevelError {
            value: text.to_owned(),
        })
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_numbers_are_digits_only_and_at_least_one() {
        assert_eq!(parse_positive("38"), Some(38));
        for bad in [
            "",
            "0",
            "+4",
            " 4",
            "4 ",
            "4k",
            "-1",
            "99999999999999999999",
        ] {
            assert_eq!(parse_positive(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn byte_counts_take_binary_units_in_any_case() {
        assert_eq!(parse_byte_count("0"), Some(0));
        assert_eq!(parse_byte_count("512M"), Some(512 << 20));
        assert_eq!(parse_byte_count(" 4 GiB "), Some(4 << 30));
        assert_eq!(parse_byte_count("64kb"), Some(64 << 10));
        assert_eq!(parse_byte_count("2t"), Some(2 << 40));
        for bad in [
            "",
            "G",
            "1X",
            "-1",
            "+5",
            "1.5G",
            "16777216T",
            "99999999999999999999",
        ] {
            assert_eq!(parse_byte_count(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn log_levels_parse_in_any_case_with_spaces_and_nothing_else_is_taken() {
        for (text, level) in [
            ("off", LogLevel::Off),
            (" WARN ", LogLevel::Warn),
            ("Info", LogLevel::Info),
            ("debug\n", LogLevel::Debug),
        ] {
            assert_eq!(text.parse::<LogLevel>(), Ok(level), "{text:?}");
        }
        for bad in ["", "trace", "error", "warning", "de bug", "1"] {
            let err = bad.parse::<LogLevel>().unwrap_err();
            assert!(
                err.to_string().contains("off, warn, info, debug"),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(LogLevel::default(), LogLevel::Warn);
    }
}
