//! The file tier seen from outside its process: a spill file never outlives the process that
//! made it, however that process ends, so nothing is left in the spill folder.

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
    if let Ok(dir) = std::env::var(CHILD_ENV) {
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
