//! What the benches' tests share (also the matrix's unit tests, which include this file).

use std::path::Path;

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not. A spill file is
/// made only where it leaves the larger of 512 MiB and a quarter of the free space (declined
/// with `snapshot_failed` otherwise), so on a machine with little disk free a test of the file
/// tier would fail for the machine, not the code. Where the free space cannot be read the test
/// runs.
pub fn spill_room(dir: &Path, bytes: u64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `stat` points to
    // writable memory of a `statvfs`'s size, which the call fills when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return true;
    }
    // SAFETY: statvfs returned 0, so it filled the whole struct.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // c_ulong and fsblkcnt_t are not u64 everywhere
    let free = (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64);
    let room = free.saturating_sub((free / 4).max(512 << 20));
    if room >= bytes + SPILL_SLACK {
        return true;
    }
    eprintln!(
        "skipped: {} has {free} bytes free: too little for {bytes} bytes of spill files \
         (a spill file leaves the larger of 512 MiB and a quarter of the free space)",
        dir.display()
    );
    false
}
