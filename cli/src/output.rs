//! The files the commands write (`run -o`, `profile -o`, `demo --csv/--json`, `bench
//! --csv/--svg`, `bench-dispatch --csv`): each is made whole in memory first, written into a
//! temporary file beside its destination and renamed over it, so that what is left on disk is
//! either the whole new result or the file as it was before.
//!
//! ```
//! let path = std::env::temp_dir().join(format!("kreplay-output-doc-{}.csv", std::process::id()));
//! kreplay_cli::output::write_whole(&path, b"a,b\n").unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"a,b\n");
//! std::fs::remove_file(&path).unwrap();
//! ```

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `text` into `path`, whole or not at all. A text larger than the process's file size
/// limit (`RLIMIT_FSIZE`, `ulimit -f`) is refused before anything is written: past the limit
/// the write would end kreplay with SIGXFSZ. A regular file (or a path that does not exist
/// yet) is replaced through a temporary file beside it (beside the file a symbolic link
/// points to, the link kept), which a failed write (a full disk, a folder that turned
/// read-only) removes: a previous file there is left as it was, and the error says which step
/// failed. Anything else the path names (a device such as `/dev/stdout`, a pipe) is written in
/// place and never removed.
pub fn write_whole(path: &Path, text: &[u8]) -> Result<(), String> {
    let cannot = |why: &dyn std::fmt::Display| format!("cannot write {}: {why}", path.display());
    // What the path leads to, through symbolic links.
    let existing = std::fs::metadata(path).ok();
    if existing.as_ref().is_some_and(|meta| !meta.is_file()) {
        // A device or a pipe: it cannot be replaced, and the file size limit does not hold.
        return std::fs::write(path, text).map_err(|e| cannot(&e));
    }
    // The limit holds for regular files only; a path that does not exist yet becomes one.
    if let Some(limit) = kreplay_snapshot::file_size_limit().filter(|&l| text.len() as u64 > l) {
        return Err(cannot(&format!(
            "its {} bytes exceed the file size limit (RLIMIT_FSIZE) of {limit} bytes",
            text.len()
        )));
    }
    let Some(target) = replaced(path, existing.is_some()) else {
        // A symbolic link to nothing: the file it names is made through it.
        return std::fs::write(path, text).map_err(|e| cannot(&e));
    };
    let temp = temporary_beside(&target);
    let result = write_temporary(&temp, text, existing.as_ref())
        .map_err(|e| format!("writing the temporary file {}: {e}", temp.display()))
        .and_then(|()| {
            std::fs::rename(&temp, &target).map_err(|e| {
                format!(
                    "renaming the temporary file {} over it: {e}",
                    temp.display()
                )
            })
        });
    result.map_err(|why| {
        let _ = std::fs::remove_file(&temp);
        cannot(&why)
    })
}

/// The file a write to `path` replaces: `path`, or the file it leads to where it is a symbolic
/// link (`exists`: to an existing file; `None` for a link to nothing).
fn replaced(path: &Path, exists: bool) -> Option<PathBuf> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_symlink());
    if !is_link {
        return Some(path.to_owned());
    }
    if !exists {
        return None;
    }
    std::fs::canonicalize(path).ok()
}

/// `.NAME.PID.tmp` in `target`'s folder.
fn temporary_beside(target: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(format!(".{}.tmp", std::process::id()));
    target.with_file_name(name)
}

/// Writes `text` into a new file `temp`, with the permissions of `previous` (the file it will
/// replace) where there is one.
fn write_temporary(temp: &Path, text: &[u8], previous: Option<&Metadata>) -> std::io::Result<()> {
    let mut file = File::create(temp)?;
    file.write_all(text)?;
    if let Some(previous) = previous {
        file.set_permissions(previous.permissions())?;
    }
    Ok(())
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
    fn a_replaced_file_keeps_its_permissions_and_no_temporary_file_is_left() {
        use std::os::unix::fs::PermissionsExt;
        let path = scratch("mode.csv");
        std::fs::write(&path, "old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_whole(&path, b"new\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        assert!(!temporary_beside(&path).exists());
    }

    #[test]
    fn a_symbolic_link_is_kept_and_the_file_it_points_to_replaced() {
        let target = scratch("linked.csv");
        let link = scratch("link.csv");
        std::fs::write(&target, "old\n").unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_whole(&link, b"new\n").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new\n");
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
