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

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not: kreplay refuses a
/// spill file that would leave its file system short (`kreplay_snapshot::spill_room`), so on
/// a machine with little disk free a test of the file tier would fail for the machine, not the
/// code.
#[allow(dead_code)]
pub fn spill_room(dir: &Path, bytes: u64) -> bool {
    let short = kreplay_snapshot::spill_room(dir).filter(|&room| room < bytes + SPILL_SLACK);
    if let Some(room) = short {
        eprintln!(
            "skipped: {} leaves {room} bytes for spill files: too little for {bytes}",
            dir.display()
        );
    }
    short.is_none()
}
