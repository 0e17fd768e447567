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
}
