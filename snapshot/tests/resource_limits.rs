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
    run_child(name, &[]);
}

/// Runs the test `name` in a child process with `env` added to its environment, and asserts
/// it exited normally after finishing its scenario.
fn run_child(name: &str, env: &[(&str, &std::ffi::OsStr)]) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .envs(env.iter().copied())
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

        // Exactly at the limit the file tier works as before, where its disk has room.
        if !common::spill_room(&dir, 256 << 10) {
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        dev.free(&inv, big);
        let small = dev.alloc(&inv, 256 << 10, 1, MemoryKind::CoarseDevice, 4);
        let mut s = snap.snapshot(&Filter::for_replay(1)).expect("a snapshot at the limit spills");
        assert_eq!(s.tier(), StoreTier::File);
        dev.poke(small, &[0; 64 << 10]);
        s.restore(&FINAL).unwrap();
        assert_eq!(dev.peek(small, 256 << 10), vec![4; 256 << 10]);
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

/// Set in the child of the cgroup scenario to the memory cgroup it moves itself into.
const CGROUP_ENV: &str = "KREPLAY_SNAPSHOT_LIMITS_CGROUP";
/// Set in the child of the cgroup scenario to its spill folder (the parent removes it).
const SPILL_ENV: &str = "KREPLAY_SNAPSHOT_LIMITS_SPILL";

/// A memory cgroup of its own limited to `limit` bytes (v1's memory controller, or v2), or
/// `None` where this process may not make one (not root, no writable cgroup file system).
fn memory_cgroup(name: &str, limit: u64) -> Option<PathBuf> {
    let name = format!("kreplay-limits-{}-{name}", std::process::id());
    let v1 = PathBuf::from("/sys/fs/cgroup/memory");
    let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.join(name), "memory.limit_in_bytes")
    } else {
        (PathBuf::from("/sys/fs/cgroup").join(name), "memory.max")
    };
    std::fs::create_dir(&dir).ok()?;
    let limited = std::fs::write(dir.join(file), limit.to_string()).is_ok()
        && dir.join("cgroup.procs").exists();
    if !limited {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

/// In the child: a 64 MiB footprint, then the process moves into a cgroup of 32 MiB and
/// snapshots it under the budget derived at start-up (from the whole machine's memory);
/// `declined`: the snapshot must be declined (no tier can hold it). `tier`: the store asked for.
fn snapshot_in_a_small_cgroup(tier: StoreTier, declined: bool) {
    let dev = TestDevice::new(Caps {
        host_visible: true,
        ..Default::default()
    });
    let inv = Arc::new(Inventory::new());
    let len = 64u64 << 20;
    let a = dev.alloc(&inv, len, 1, MemoryKind::CoarseDevice, 7);
    let dir = PathBuf::from(std::env::var(SPILL_ENV).expect("the spill folder"));
    let config = SnapshotConfig::default()
        .with_store(tier)
        .with_strategy(RestoreStrategy::Full)
        .with_spill_dir(Some(dir.clone()))
        .with_max_bytes(SnapshotConfig::budget_from_setting(0));
    let snap = snapshotter(&dev, &inv, config);
    let cgroup = PathBuf::from(std::env::var(CGROUP_ENV).expect("the cgroup"));
    // A cgroup can be made but not entered where the hierarchy is delegated only in part (a
    // container's cgroup namespace): nothing to show there.
    if let Err(e) = std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string()) {
        eprintln!("cannot move into the memory cgroup ({e}): scenario not run");
        return;
    }

    match snap.snapshot(&Filter::for_replay(1)) {
        Ok(mut s) => {
            assert!(!declined, "a store of {:?} was made", s.tier());
            assert_eq!(s.tier(), StoreTier::File, "not a host store over the limit");
            dev.poke(a, &[0; 4096]);
            s.restore(&FINAL).expect("a restore");
        }
        Err(err) => assert_eq!(err.reason(), "snapshot_failed", "{err}"),
    }
    // Read back a MiB at a time: a copy of the whole footprint would not fit the cgroup.
    for at in (0..len).step_by(1 << 20) {
        assert!(
            dev.peek(a + at, 1 << 20).iter().all(|b| *b == 7),
            "memory as it was"
        );
    }
}

/// Runs the test `name` in a child process that snapshots in a memory cgroup of 32 MiB,
/// spilling into `spill` (removed afterwards); where no memory cgroup can be made, says so
/// and checks nothing.
fn in_small_cgroup(name: &str, spill: PathBuf) {
    let Some(cgroup) = memory_cgroup(name, 32 << 20) else {
        eprintln!("no memory cgroup can be made here: scenario not run");
        let _ = std::fs::remove_dir_all(&spill);
        return;
    };
    let result = std::panic::catch_unwind(|| {
        run_child(
            name,
            &[
                (CGROUP_ENV, cgroup.as_os_str()),
                (SPILL_ENV, spill.as_os_str()),
            ],
        )
    });
    let _ = std::fs::remove_dir(&cgroup);
    let _ = std::fs::remove_dir_all(&spill);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A process whose memory cgroup has less room than the machine (a container) snapshots a
/// footprint larger than that room in host memory: the host store, which the kernel would
/// grant and then kill the process for touching, is not made; the snapshot is declined and the
/// process lives on. (Under `auto` it spills to a file instead; that is not shown here, since
/// the file's dirty pages are charged to the cgroup too, and writing 64 MiB of them under a
/// 32 MiB limit was seen to end in the kernel's OOM kill when the disk was slow to take them:
/// docs/RELIABILITY.md.) Needs permission to make a memory cgroup; elsewhere it says so and
/// checks nothing.
#[test]
fn a_host_store_larger_than_the_cgroups_memory_is_not_made() {
    const NAME: &str = "a_host_store_larger_than_the_cgroups_memory_is_not_made";
    if std::env::var(CHILD_ENV).as_deref() == Ok(NAME) {
        snapshot_in_a_small_cgroup(StoreTier::Host, true);
        println!("{DONE_MARK}{NAME}");
        return;
    }
    in_small_cgroup(NAME, scratch("cgroup"));
}

/// The same with the spill folder on a tmpfs (`/dev/shm`; `/tmp` is one on many systems),
/// whose files are memory too: the spill file is not made either, the snapshot is declined
/// and the process lives on. Needs a memory cgroup and a tmpfs at `/dev/shm`.
#[test]
fn a_spill_file_on_tmpfs_larger_than_the_cgroups_memory_is_not_made() {
    const NAME: &str = "a_spill_file_on_tmpfs_larger_than_the_cgroups_memory_is_not_made";
    if std::env::var(CHILD_ENV).as_deref() == Ok(NAME) {
        snapshot_in_a_small_cgroup(StoreTier::Auto, true);
        println!("{DONE_MARK}{NAME}");
        return;
    }
    let spill = PathBuf::from(format!("/dev/shm/kreplay-limits-{}", std::process::id()));
    if std::fs::create_dir(&spill).is_err() {
        eprintln!("no folder can be made in /dev/shm: scenario not run");
        return;
    }
    in_small_cgroup(NAME, spill);
}

scenarios! {
    /// An address-space limit met after the copy pool runs: neither a host store nor a spill
    /// file's mapping (nor the buffer that fills the file) fits, so every tier says no and the
    /// snapshot is declined, nothing is left in the spill folder and the process lives on; a
    /// snapshot that fits is taken and restored as before.
    fn an_address_space_limit_declines_every_tier_without_an_abort() {
        let dir = scratch("as");
        let dev = TestDevice::new(Caps {
            host_visible: true,
            ..Default::default()
        });
        let inv = Arc::new(Inventory::new());
        let small = dev.alloc(&inv, 64 << 10, 1, MemoryKind::CoarseDevice, 5);
        let config = SnapshotConfig::default()
            .with_store(StoreTier::Auto)
            .with_strategy(RestoreStrategy::Full)
            .with_chunk_size(4096)
            .with_keep_store(false)
            .with_spill_dir(Some(dir.clone()));
        let snap = snapshotter(&dev, &inv, config);
        drop(snap.snapshot(&Filter::for_replay(1)).expect("the pool starts"));
        let big = dev.alloc(&inv, 64 << 20, 1, MemoryKind::CoarseDevice, 6);
        let unlimited = set_soft_limit(libc::RLIMIT_AS, vm_size());

        let err = snap.snapshot(&Filter::for_replay(1)).err().expect("declined");
        assert_eq!(err.reason(), "snapshot_failed", "{err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no spill file left");

        set_soft_limit(libc::RLIMIT_AS, unlimited);
        dev.free(&inv, big);
        let mut s = snap.snapshot(&Filter::for_replay(1)).expect("a snapshot that fits");
        dev.poke(small, &[0; 100]);
        s.restore(&FINAL).unwrap();
        assert_eq!(dev.peek(small, 64 << 10), vec![5; 64 << 10]);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
