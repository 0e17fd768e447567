//! The file tier seen from outside its process: a spill file never outlives the process that
//! made it, however that process ends, so nothing is left in the spill folder.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kreplay_snapshot::*;

/// Set in the child process to the spill folder it spills into.
const CHILD_ENV: &str = "KREPLAY_TIERS_SPILL_CHILD";
/// Printed by the child after each snapshot it took.
const TOOK: &str = "kreplay-tiers-spill-took";

/// Device memory that reads as zeros and is never written.
struct Zeros;

impl DeviceMemory for Zeros {
    fn read(&self, _addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        dst.fill(0);
        Ok(())
    }
    fn write(&self, _addr: u64, _src: &[u8]) -> Result<(), CopyError> {
        Ok(())
    }
}

/// In the child: spill snapshots of a 48 MiB allocation, one after another, until killed.
fn spill_until_killed(dir: &Path) -> ! {
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: 0x10_0000,
        size: 48 << 20,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let config = SnapshotConfig::default()
        .with_store(StoreTier::File)
        .with_strategy(RestoreStrategy::Full)
        .with_keep_store(false)
        .with_spill_dir(Some(dir.to_path_buf()));
    let snapshotter = Snapshotter::new(inventory, Arc::new(Zeros), config).expect("a snapshotter");
    loop {
        let snapshot = snapshotter
            .snapshot(&Filter::for_replay(1))
            .expect("the snapshot spills");
        assert_eq!(snapshot.tier(), StoreTier::File);
        drop(snapshot);
        println!("{TOOK}");
    }
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("the spill folder")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// A process killed while it makes a spill file (the file is filled before it is mapped, which
/// for a large store takes a while) used to leave that file in the spill folder under its
/// name, for good: it was unlinked only once filled and mapped. Now the file has no name in
/// the folder at any moment, so a kill at any point leaves nothing.
#[test]
fn a_process_killed_while_it_spills_leaves_no_file_in_the_spill_folder() {
    if let (Ok(dir), Err(_)) = (std::env::var(CHILD_ENV), std::env::var(LIMIT_ENV)) {
        spill_until_killed(Path::new(&dir));
    }
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "tiers-spill-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Where the file system cannot make a file without a name, kreplay names the file for the
    // moment between its creation and its removal, which a watcher may see: nothing to check.
    if !unnamed_files_supported(&dir) {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "skipped: {} cannot hold files without a name (O_TMPFILE)",
            dir.display()
        );
        return;
    }
    // The child spills 48 MiB at a time.
    if !common::spill_room(&dir, 48 << 20) {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "a_process_killed_while_it_spills_leaves_no_file_in_the_spill_folder",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the child starts");
    let took = Arc::new(AtomicU64::new(0));
    let stdout = child.stdout.take().expect("piped stdout");
    let counter = took.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) if l.contains(TOOK) => {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    // Kill the child the moment a spill file shows in the folder; else once it has taken a
    // few snapshots (each made a spill file while the folder was watched) or the deadline
    // passed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while Instant::now() < deadline && took.load(Ordering::SeqCst) < 5 {
        seen = entries(&dir);
        if !seen.is_empty() {
            break;
        }
        if child.try_wait().expect("the child's status").is_some() {
            break;
        }
        std::thread::yield_now();
    }
    let _ = child.kill();
    let status = child.wait().expect("the child is waited for");
    let left = entries(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.code().is_none(),
        "the child spilled until it was killed, but ended with {status}"
    );
    assert!(
        took.load(Ordering::SeqCst) >= 1 || !seen.is_empty(),
        "the child took no snapshot before the deadline"
    );
    assert!(
        seen.is_empty() && left.is_empty(),
        "a spill file showed in the folder ({seen:?}) and was left there after the kill: {left:?}"
    );
}

/// Whether `dir`'s file system makes files without a name (`O_TMPFILE`), as the spill tier
/// asks for where it can.
fn unnamed_files_supported(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .is_ok()
}

/// Set in a child process to the file size limit it runs under.
const LIMIT_ENV: &str = "KREPLAY_TIERS_SPILL_FSIZE";

/// In a child whose file size limit (`RLIMIT_FSIZE`, SIGXFSZ at its default action, which ends
/// the process) is `limit`: spills a snapshot of one 64 KiB allocation and prints what came of
/// it.
fn spill_under_file_size_limit(dir: &Path, limit: u64) {
    let mut rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rlimit` is a valid out-parameter.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut rlimit) };
    assert_eq!(got, 0);
    rlimit.rlim_cur = limit;
    // SAFETY: a valid rlimit, lowering this child process's soft limit only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) }, 0);
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: 0x10_0000,
        size: 64 << 10,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let config = SnapshotConfig::default()
        .with_store(StoreTier::File)
        .with_spill_dir(Some(dir.to_path_buf()));
    let snapshotter = Snapshotter::new(inventory, Arc::new(Zeros), config).expect("a snapshotter");
    match snapshotter.snapshot(&Filter::for_replay(1)) {
        Ok(snapshot) => println!("outcome: spilled {}", snapshot.bytes()),
        Err(e) => println!("outcome: declined {}: {e}", e.reason()),
    }
}

/// Runs [`spill_under_file_size_limit`] in a child and returns its outcome line.
fn spill_in_child(limit: u64) -> String {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "tiers-fsize-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "a_spill_file_exactly_at_the_file_size_limit_is_made_and_one_byte_more_is_declined",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .env(LIMIT_ENV, limit.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the child starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let lines: Vec<String> = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect();
        let _ = tx.send(lines);
    });
    let lines = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(lines) => lines,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not finish within 60 s");
        }
    };
    let status = child.wait().expect("the child is waited for");
    let left = entries(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "the child ended with {status}: {lines:?}");
    assert!(
        left.is_empty(),
        "nothing left in the spill folder: {left:?}"
    );
    // The test harness may print its "test ... " line before it on the same line.
    lines
        .iter()
        .find_map(|l| l.find("outcome: ").map(|at| l[at..].to_string()))
        .expect("the child printed its outcome")
}

/// The file size limit is a limit on bytes written: a spill file of exactly that many bytes
/// may be made; one byte more would raise SIGXFSZ and is declined instead.
#[test]
fn a_spill_file_exactly_at_the_file_size_limit_is_made_and_one_byte_more_is_declined() {
    if let (Ok(dir), Ok(limit)) = (std::env::var(CHILD_ENV), std::env::var(LIMIT_ENV)) {
        spill_under_file_size_limit(Path::new(&dir), limit.parse().unwrap());
        return;
    }
    // Spilling at the limit needs room on the disk of the spill folders (the target's scratch
    // folder); the decline one byte over it does not.
    if common::spill_room(Path::new(env!("CARGO_TARGET_TMPDIR")), 64 << 10) {
        let at = spill_in_child(64 << 10);
        assert_eq!(at, format!("outcome: spilled {}", 64 << 10));
    }
    let under = spill_in_child((64 << 10) - 1);
    assert!(
        under.starts_with("outcome: declined snapshot_failed") && under.contains("RLIMIT_FSIZE"),
        "{under}"
    );
}
