//! What the benches' tests share (also the matrix's unit tests, which include this file).

use std::path::Path;

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not: kreplay refuses a
/// spill file that would leave its file system short (`kreplay_snapshot::spill_room`), so on
/// a machine with little disk free a test of the file tier would fail for the machine, not the
/// code.
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
