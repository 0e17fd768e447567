//! The files the commands write (`run -o`, `profile -o`, `demo --csv/--json`, `bench
//! --csv/--svg`, `bench-dispatch --csv`): each is made whole in memory first and written at
//! once, so that what is left on disk is either the whole result or nothing.
//!
//! ```
//! let path = std::env::temp_dir().join(format!("kreplay-output-doc-{}.csv", std::process::id()));
//! kreplay_cli::output::write_whole(&path, b"a,b\n").unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"a,b\n");
//! std::fs::remove_file(&path).unwrap();
//! ```

use std::path::Path;

/// Writes `text` into `path`, whole or not at all. A text larger than the process's file size
/// limit (`RLIMIT_FSIZE`, `ulimit -f`) is refused before the file is touched: past the limit the
/// write would end kreplay with SIGXFSZ and leave half a file. A regular file that a failed
/// write (a full disk) left half written is removed, so that no truncated output is taken for a
/// result; anything else the path names (a device such as `/dev/stdout`, a pipe, the file a
/// symbolic link points to) is never removed.
pub fn write_whole(path: &Path, text: &[u8]) -> Result<(), String> {
    let cannot = |why: &dyn std::fmt::Display| format!("cannot write {}: {why}", path.display());
    // The limit holds for regular files only; a path that does not exist yet becomes one.
    let regular = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta.is_file(),
        Err(_) => true,
    };
    let limited = std::fs::metadata(path).map_or(true, |meta| meta.is_file());
    if let Some(limit) =
        kreplay_snapshot::file_size_limit().filter(|&limit| limited && text.len() as u64 > limit)
    {
        return Err(cannot(&format!(
            "its {} bytes exceed the file size limit (RLIMIT_FSIZE) of {limit} bytes",
            text.len()
        )));
    }
    std::fs::write(path, text).map_err(|e| {
        if regular {
            let _ = std::fs::remove_file(path);
        }
        cannot(&e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kreplay-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn a_whole_text_replaces_the_file_and_a_missing_folder_is_named() {
        let path = scratch("out.csv");
        std::fs::write(&path, "an older, longer file\n").unwrap();
        write_whole(&path, b"k\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"k\n");
        let missing = scratch("missing").join("out.csv");
        let err = write_whole(&missing, b"k\n").unwrap_err();
        assert!(err.contains(&missing.display().to_string()), "{err}");
    }

    #[test]
    fn a_failed_write_into_a_device_leaves_the_device() {
        // /dev/full refuses every write with ENOSPC, as a full disk would: the error is
        // returned, and the device node is not removed (kreplay runs as root in containers).
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let err = write_whole(full, b"k\n").unwrap_err();
        assert!(err.contains("/dev/full"), "{err}");
        assert!(full.exists(), "/dev/full was removed");
    }
}
