//! A spill folder that cannot hold spill files is a configuration error when the snapshotter is
//! made, not a declined snapshot at every dispatch that would spill.

use std::path::PathBuf;
use std::sync::Arc;

use kreplay_snapshot::*;

struct NoDevice;

impl DeviceMemory for NoDevice {
    fn read(&self, _addr: u64, _dst: &mut [u8]) -> Result<(), CopyError> {
        unreachable!("no copy is made while configuring")
    }
    fn write(&self, _addr: u64, _src: &[u8]) -> Result<(), CopyError> {
        unreachable!("no copy is made while configuring")
    }
}

fn snapshotter(spill_dir: Option<PathBuf>) -> Result<Snapshotter, ConfigError> {
    let config = SnapshotConfig::default()
        .with_store(StoreTier::File)
        .with_spill_dir(spill_dir);
    Snapshotter::new(Arc::new(Inventory::new()), Arc::new(NoDevice), config)
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("spill-dir-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&dir);
    dir
}

#[test]
fn a_missing_spill_folder_is_a_configuration_error_naming_it() {
    let dir = scratch("missing");
    let error = snapshotter(Some(dir.clone())).err().expect("an error");
    assert_eq!(error.variable, "spill_dir");
    assert!(
        error.message.contains(&dir.display().to_string()) && error.message.contains("no such"),
        "{error}"
    );
}

#[test]
fn a_file_in_place_of_the_spill_folder_is_a_configuration_error() {
    let path = scratch("a-file");
    std::fs::write(&path, b"not a folder").unwrap();
    let error = snapshotter(Some(path.clone())).err().expect("an error");
    assert!(error.to_string().contains("not a folder"), "{error}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"not a folder",
        "left as it was"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_usable_spill_folder_is_accepted_and_left_empty() {
    let dir = scratch("usable");
    std::fs::create_dir_all(&dir).unwrap();
    snapshotter(Some(dir.clone())).expect("a usable folder");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the probe file is gone"
    );
    std::fs::remove_dir(dir).unwrap();
    // No folder set: the system temporary folder, not checked.
    snapshotter(None).expect("the default folder");
}

/// A spill file larger than what its folder's disk has free used to be written with zeros until
/// the disk was full (a minute and more for a large store, every other writer on that disk
/// failing meanwhile) before it was declined.
#[test]
fn a_spill_file_larger_than_the_room_on_its_disk_is_declined_at_once_without_writing_it() {
    let dir = scratch("no-room");
    std::fs::create_dir_all(&dir).unwrap();
    let inventory = Arc::new(Inventory::new());
    // A petabyte: more than any disk this runs on has free.
    inventory.on_alloc(NewAllocation {
        base: 0x1000,
        size: 1 << 50,
        owner_agent: 1,
        kind: MemoryKind::CoarseDevice,
    });
    let config = SnapshotConfig::default()
        .with_store(StoreTier::File)
        .with_spill_dir(Some(dir.clone()));
    let snapshotter = Snapshotter::new(inventory, Arc::new(NoDevice), config).unwrap();
    let started = std::time::Instant::now();
    let error = snapshotter
        .snapshot(&Filter::for_replay(1))
        .err()
        .expect("declined");
    assert_eq!(error.reason(), "snapshot_failed", "{error}");
    assert!(error.to_string().contains("free"), "{error}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "declined only after {:?}",
        started.elapsed()
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file left");
    std::fs::remove_dir(dir).unwrap();
}
