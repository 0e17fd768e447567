//! The store tiers when the process's resources run out: a limit met while a store is made is a
//! declined snapshot (nothing written, nothing left behind), never a signal or an abort that
//! ends the process. Each scenario that changes a process-wide limit runs in a child process of
//! its own (this test binary run again for that one test).

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use kreplay_snapshot::*;

/// Set in a child process to the name of the scenario it runs.
const CHILD_ENV: &str = "KREPLAY_SNAPSHOT_LIMITS_SCENARIO";
/// Printed by a child whose scenario returned.
const DONE_MARK: &str = "kreplay-limits-scenario-done:";
/// The longest a scenario's process may run.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `scenario` in a child process and asserts it exited normally after finishing it.
fn isolated(name: &str, scenario: fn()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        scenario();
        println!("{DONE_MARK}{name}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the scenario's process starts");
    // The pipes close when the child exits; readers report through a channel so the wait is
    // bounded by a deadline.
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let pipes: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().expect("piped stdout")),
        Box::new(child.stderr.take().expect("piped stderr")),
    ];
    for (i, mut pipe) in pipes.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send((i, String::from_utf8_lossy(&bytes).into_owned()));
        });
    }
    drop(tx);
    let deadline = Instant::now() + CHILD_DEADLINE;
    let mut output = [String::new(), String::new()];
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, text)) => output[i] = text,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("scenario {name} did not finish within {CHILD_DEADLINE:?}");
            }
        }
    }
    let status = child.wait().expect("the child is waited for");
    let [stdout, stderr] = output;
    let report = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        status.success(),
        "scenario {name} ended with {status}\n{report}"
    );
    assert!(
        stdout.contains(&format!("{DONE_MARK}{name}")),
        "scenario {name} did not run its body\n{report}"
    );
}

macro_rules! scenarios {
    ($( $(#[$meta:meta])* fn $name:ident() $body:block )*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $name() {
                fn body() $body
                isolated(stringify!($name), body);
            }
        )*
    };
}

/// An empty folder of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("limits-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

fn set_limit(resource: libc::__rlimit_resource_t, bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: `limit` is a valid rlimit; lowering a limit of this (child) process only.
    let rc = unsafe { libc::setrlimit(resource, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// Sets the soft limit of `resource` to `bytes`, returning the soft limit it had.
fn set_soft_limit(resource: libc::__rlimit_resource_t, bytes: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-parameter.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut limit) }, 0);
    let was = limit.rlim_cur;
    limit.rlim_cur = bytes.min(limit.rlim_max);
    // SAFETY: `limit` is a valid rlimit; a soft limit of this (child) process only.
    let rc = unsafe { libc::setrlimit(resource, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
    was
}

fn file_tier(dir: &std::path::Path) -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(StoreTier::File)
        .with_strategy(RestoreStrategy::Full)
        .with_chunk_size(4096)
        .with_spill_dir(Some(dir.to_path_buf()))
}

scenarios! {
    /// A spill file larger than the process may write (`RLIMIT_FSIZE`), in a process that left
    /// SIGXFSZ at its default action (which ends the process): the snapshot is declined as
    /// `snapshot_failed`, no spill file is left behind, device memory is untouched, and the
    /// process lives on, so a smaller snapshot still spills.
    fn a_spill_file_over_the_file_size_limit_declines_without_killing_the_process() {
        let dir = scratch("fsize");
        set_limit(libc::RLIMIT_FSIZE, 256 << 10);
        let dev = TestDevice::new(Caps::default());
        let inv = Arc::new(Inventory::new());
        let big = dev.alloc(&inv, 1 << 20, 1, MemoryKind::CoarseDevice, 3);
        let snap = snapshotter(&dev, &inv, file_tier(&dir));

        let err = snap.snapshot(&Filter::for_replay(1)).err().expect("declined");
        assert_eq!(err.reason(), "snapshot_failed", "{err}");
        assert!(
            matches!(err, SnapshotError::StoreUnavailable { tier: StoreTier::File, .. }),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no spill file left behind");
        assert_eq!(dev.peek(big, 1 << 20), vec![3; 1 << 20], "device memory untouched");

        // Under the limit the file tier works as before.
        dev.free(&inv, big);
        let small = dev.alloc(&inv, 64 << 10, 1, MemoryKind::CoarseDevice, 4);
        let mut s = snap.snapshot(&Filter::for_replay(1)).expect("a small snapshot spills");
        assert_eq!(s.tier(), StoreTier::File);
        dev.poke(small, &[0; 64 << 10]);
        s.restore(&FINAL).unwrap();
        assert_eq!(dev.peek(small, 64 << 10), vec![4; 64 << 10]);
        drop(s);
        drop(snap);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The process's virtual memory size now, from `/proc/self/status`.
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmSize in /proc/self/status");
    kib * 1024
}

scenarios! {
    /// An address-space limit (`RLIMIT_AS`) that leaves room for a small host store but not for
    /// the stack of any thread of the copy pool, met at the first snapshot of the process: the
    /// snapshot is declined (`snapshot_failed`) with memory untouched, nothing panics, and once
    /// the limit is raised again the pool starts and replays snapshot and restore as before.
    fn a_copy_pool_that_cannot_start_a_thread_declines_the_snapshot_without_a_panic() {
        let dev = TestDevice::new(Caps {
            host_visible: true,
            ..Default::default()
        });
        let inv = Arc::new(Inventory::new());
        let bufs: Vec<u64> = (0..4)
            .map(|i| dev.alloc(&inv, 64 << 10, 1, MemoryKind::CoarseDevice, i))
            .collect();
        let config = SnapshotConfig::default()
            .with_store(StoreTier::Host)
            .with_strategy(RestoreStrategy::Hash)
            .with_chunk_size(4096);
        let snap = snapshotter(&dev, &inv, config);
        let unlimited = set_soft_limit(libc::RLIMIT_AS, vm_size() + (1 << 20));

        let err = snap.snapshot(&Filter::for_replay(1)).err().expect("declined");
        assert_eq!(err.reason(), "snapshot_failed", "{err}");
        for (i, &b) in bufs.iter().enumerate() {
            assert_eq!(dev.peek(b, 64 << 10), vec![i as u8; 64 << 10], "untouched");
        }

        set_soft_limit(libc::RLIMIT_AS, unlimited);
        let mut s = snap.snapshot(&Filter::for_replay(1)).expect("a snapshot");
        for &b in &bufs {
            dev.poke(b, &[0xee; 100]);
        }
        s.restore(&FINAL).expect("a restore");
        for (i, &b) in bufs.iter().enumerate() {
            assert_eq!(dev.peek(b, 64 << 10), vec![i as u8; 64 << 10]);
        }
    }
}
