//! What the CLI's test files share: running the built `kreplay` binary with none of the caller's
//! `KREPLAY_*` settings or injection variables leaking in.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs the built `kreplay` with `args`, every inherited `KREPLAY_*` variable and injection
/// variable (`CUDA_INJECTION64_PATH`, `HSA_TOOLS_LIB`) removed and `env` set instead.
pub fn kreplay_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kreplay"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n.starts_with("KREPLAY_") || n == "CUDA_INJECTION64_PATH" || n == "HSA_TOOLS_LIB" {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("the kreplay binary runs")
}

/// Writes an executable script at `path` through a child process, so that this test process,
/// whose other threads fork all the time, never holds it open for writing: a child forked at
/// that moment keeps the descriptor until its exec, and executing the script then fails with
/// ETXTBSY ("Text file busy").
#[allow(dead_code)]
pub fn write_executable(path: &Path, text: &str) {
    let mut child = Command::new("sh")
        .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "{} written",
        path.display()
    );
}

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test's
/// `kreplay` uses), printing why the test is skipped when they do not. kreplay makes a spill
/// file only where it leaves the larger of 512 MiB and a quarter of the free space (declining
/// the snapshot otherwise), so on a machine with little disk free a test of the file tier would
/// fail for the machine, not the code. Where the free space cannot be read the test runs.
#[allow(dead_code)]
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
         (kreplay leaves the larger of 512 MiB and a quarter of the free space)",
        dir.display()
    );
    false
}
