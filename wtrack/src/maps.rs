//! Which kind of mapping covers a range: `/proc/self/maps`, parsed.

use std::ops::Range;

/// One line of `/proc/self/maps`, reduced to what the tracker checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The mapped addresses.
    pub range: Range<usize>,
    /// Writable (`w`) and private (`p`, copy-on-write rather than shared).
    pub private_writable: bool,
    /// No file behind it (inode 0) and memory the process mapped itself: anonymous memory, the
    /// heap, a named anonymous mapping (not the stack or the kernel's other bracketed
    /// mappings).
    pub anonymous: bool,
    /// The path column (empty for plain anonymous memory).
    pub name: String,
}

impl Mapping {
    /// Parses one line (`start-end perms offset dev inode [path]`).
    pub fn parse(line: &str) -> Option<Mapping> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?.as_bytes();
        let _offset = fields.next()?;
        let _dev = fields.next()?;
        let inode = fields.next()?;
        let name = fields.collect::<Vec<_>>().join(" ");
        let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
        Some(Mapping {
            range,
            private_writable: perms.len() >= 4 && perms[1] == b'w' && perms[3] == b'p',
            anonymous: inode == "0"
                && (name.is_empty() || name == "[heap]" || name.starts_with("[anon:")),
            name,
        })
    }
}

impl Mapping {
    /// What kind of memory it is, and its name, in words.
    pub(crate) fn describe(&self) -> String {
        let name = if self.name.is_empty() {
            "anonymous"
        } else {
            &self.name
        };
        let kind = if !self.private_writable {
            "a shared or read-only mapping"
        } else if self.anonymous {
            "a private anonymous mapping"
        } else if self.name.starts_with('[') {
            // Private, writable, no file: the main thread's stack and the like, which the
            // kernel grows and manages itself.
            "a special mapping of the kernel's"
        } else {
            "a file-backed mapping"
        };
        format!("{kind} ({name})")
    }
}

/// Checks that private, writable, anonymous mappings cover every byte of `range` without a gap.
/// `mappings` sorted by address, as `/proc/self/maps` lists them. The error says what is not.
pub fn private_anonymous_cover(mappings: &[Mapping], range: Range<usize>) -> Result<(), String> {
    let mut at = range.start;
    let first = mappings.partition_point(|m| m.range.end <= at);
    for m in &mappings[first..] {
        if at >= range.end {
            break;
        }
        if m.range.start > at {
            return Err(format!("{at:#x} is not mapped"));
        }
        if !m.private_writable || !m.anonymous {
            return Err(format!(
                "{at:#x} lies in {}; only private anonymous writable memory (the heap, \
                 anonymous mmap) can be followed",
                m.describe()
            ));
        }
        at = m.range.end;
    }
    if at < range.end {
        return Err(format!("{at:#x} is not mapped"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps(text: &str) -> Vec<Mapping> {
        text.lines().filter_map(Mapping::parse).collect()
    }

    const SAMPLE: &str = "\
55d0a000-55d0b000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c000-55d0e000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f0000100000-7f0000200000 rw-s 00000000 00:05 77 /memfd:pool (deleted)
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
7f0000400000-7f0000500000 rw-p 00001000 fd:01 99 /data/file
";

    #[test]
    fn private_anonymous_memory_is_accepted_across_adjacent_mappings() {
        let m = maps(SAMPLE);
        assert_eq!(private_anonymous_cover(&m, 0x55d0c000..0x55d0e000), Ok(()));
        assert_eq!(
            private_anonymous_cover(&m, 0x7f0000000000..0x7f0000001000),
            Ok(())
        );
    }

    #[test]
    fn shared_file_backed_and_unmapped_memory_is_refused_with_the_reason() {
        let m = maps(SAMPLE);
        let shared = private_anonymous_cover(&m, 0x7f00000ff000..0x7f0000101000).unwrap_err();
        assert!(
            shared.contains("shared") && shared.contains("memfd"),
            "{shared}"
        );
        let file = private_anonymous_cover(&m, 0x7f0000400000..0x7f0000401000).unwrap_err();
        assert!(file.contains("file-backed"), "{file}");
        let gap = private_anonymous_cover(&m, 0x7f0000200000..0x7f0000301000).unwrap_err();
        assert!(gap.contains("not mapped"), "{gap}");
        let code = private_anonymous_cover(&m, 0x55d0a000..0x55d0b000).unwrap_err();
        assert!(code.contains("read-only"), "{code}");
    }
}
