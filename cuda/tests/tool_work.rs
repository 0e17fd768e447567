//! Work a tool issues from its callbacks inside a replay window (docs/abi.md §3 rule 10), over
//! the host fake of `window_host.rs`: the "kernel" adds 1 to every word, and the tool sets some
//! words from one of its callbacks, bracketed the way the injected library brackets a tool's
//! driver call (`toolwork::before` at API ENTER, `toolwork::after` at API EXIT). What the tool
//! set must survive every later restore, and the kernel's own writes must still be undone.

use std::sync::{Arc, Mutex};

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::toolwork::{self, Before, Target, ToolWorkIo};
use kreplay_cuda::{LaunchOps, Window};
use kreplay_passloop::{
    ContinueChange, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome, ReplayTool, RestoreRequest,
    ToolAnswer,
};
use kreplay_snapshot::{
    Capture, CopyError, Delta, DeviceMemory, Footprint, Inventory, RestoreStrategy, SnapshotConfig,
    Snapshotter, StoreTier,
};

mod fake_device;
use fake_device::{HostMemory, OneDevice};

const AGENT: u64 = 0;
/// Tracked words (one allocation at address 0).
const WORDS: usize = 4096;
/// Words past the allocation: memory kreplay does not track (a buffer the tool allocated).
const EXTRA: usize = 64;
/// The words the tool sets, and to what.
const SET: std::ops::Range<usize> = 1000..1100;
/// No byte of it equals the byte a pass leaves in the set words (`i + 1` for `i` in [`SET`]): a
/// capture cannot see a byte written with the value it held.
const VALUE: u32 = 0xABCD_EF77;

/// Reads the fake's memory around the tool's work with a snapshotter of its own over the same
/// memory and inventory; `fail` makes every capture fail.
struct HostIo {
    snapshotter: Snapshotter,
    fail: bool,
    lost: Arc<Mutex<Vec<String>>>,
}

impl ToolWorkIo for HostIo {
    fn quiesce(&self) -> Result<(), String> {
        Ok(())
    }
    fn capture(&self, footprint: &Footprint) -> Result<Capture, String> {
        if self.fail {
            return Err("no host memory".into());
        }
        self.snapshotter
            .capture(footprint)
            .map_err(|e| e.to_string())
    }
    fn changes(&self, since: &Capture) -> Result<Delta, String> {
        self.snapshotter.changes(since).map_err(|e| e.to_string())
    }
    fn written(&self, footprint: &Footprint, addr: u64, len: u64) -> Result<Delta, String> {
        if self.fail {
            return Err("no host memory".into());
        }
        self.snapshotter
            .written_within(footprint, addr, len)
            .map_err(|e| e.to_string())
    }
    fn lost(&self, call: &str, why: &str) {
        self.lost.lock().unwrap().push(format!("{call}: {why}"));
    }
}

/// The fake launch: `relaunch` runs the kernel; `keeps` says whether it offers a [`HostIo`].
struct Launch<'a> {
    device: &'a OneDevice,
    keeps: bool,
    fail: bool,
    lost: Arc<Mutex<Vec<String>>>,
}

impl LaunchOps for Launch<'_> {
    fn replayable(&self) -> Result<(), String> {
        Ok(())
    }
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        add_one_tracked(&self.device.memory);
        Ok(())
    }
    fn tool_work(&self) -> Option<Box<dyn ToolWorkIo>> {
        let d = self.device;
        let memory = Arc::new(Mapped {
            memory: d.memory.clone(),
            inventory: d.inventory.clone(),
        });
        self.keeps.then(|| {
            Box::new(HostIo {
                snapshotter: Snapshotter::new(
                    d.inventory.clone(),
                    memory,
                    SnapshotConfig::default(),
                )
                .unwrap(),
                fail: self.fail,
                lost: self.lost.clone(),
            }) as Box<dyn ToolWorkIo>
        })
    }
}

/// The device's memory as the tool's work reads it: what no tracked allocation holds is not
/// mapped (memory freed on a GPU is unmapped, and reading it is an error, or worse).
struct Mapped {
    memory: Arc<HostMemory>,
    inventory: Arc<Inventory>,
}

impl DeviceMemory for Mapped {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        let len = dst.len() as u64;
        let mapped = self
            .inventory
            .lookup(addr)
            .is_some_and(|a| addr + len <= a.base + a.size);
        if !mapped {
            return Err(CopyError::Failed {
                addr,
                len,
                detail: "unmapped memory".into(),
            });
        }
        self.memory.read(addr, dst)
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        self.memory.write(addr, src)
    }
}

/// The kernel: `x += 1` on the tracked words only.
fn add_one_tracked(memory: &HostMemory) {
    memory.0.lock().unwrap()[..WORDS]
        .iter_mut()
        .for_each(|x| *x += 1);
}

/// Which callback the tool works from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    SnapshotExit,
    PassEnter(u64),
    PassExit(u64),
    /// RESTORE ENTER before pass `n`.
    RestoreEnter(u64),
    /// RESTORE EXIT before pass `n`.
    RestoreExit(u64),
    ConfigExit,
}

/// What the tool's call is said to write.
#[derive(Clone, Copy, Debug)]
enum Aim {
    /// Its destination address (a 1D memset).
    Address,
    /// Anything (a launch whose arguments are not trusted).
    Anything,
    /// Through argument values: one into the set words, one into untracked memory.
    Reached,
    /// Through one argument value: the tracked allocation's end (a kernel walking back from
    /// its end pointer).
    EndPointer,
}

/// Sets [`SET`] to [`VALUE`] (or `extra`: the untracked words) from the callback `at`.
struct WorkTool<'a> {
    passes: u64,
    at: At,
    aim: Aim,
    memory: &'a HostMemory,
    untracked: bool,
    /// The call fails and writes nothing.
    fails: bool,
    /// Another thread frees the tracked allocation while the call is in progress.
    freed_meanwhile: Option<&'a Inventory>,
    before: Vec<Before>,
}

impl WorkTool<'_> {
    fn work_if(&mut self, now: At) {
        if now != self.at {
            return;
        }
        let (words, addr) = if self.untracked {
            // Not right at the allocation's end: wholly past it.
            (WORDS + 16..WORDS + EXTRA, ((WORDS + 16) * 4) as u64)
        } else {
            (SET, (SET.start * 4) as u64)
        };
        let values = [addr + 8, (WORDS * 4 + 16) as u64];
        let end = [(WORDS * 4) as u64];
        let target = match self.aim {
            Aim::Address => Target::Range {
                addr,
                len: (words.len() * 4) as u64,
            },
            Aim::Anything => Target::Anything,
            Aim::Reached => Target::Reached(&values),
            Aim::EndPointer => Target::Reached(&end),
        };
        self.before.push(toolwork::before("cuMemsetD32_v2", target));
        if self.fails {
            // The call failed: it wrote nothing.
            toolwork::after(false);
            return;
        }
        self.memory.0.lock().unwrap()[words]
            .iter_mut()
            .for_each(|x| *x = VALUE);
        if let Some(inventory) = self.freed_meanwhile {
            // Another thread's cuMemFree: its API ENTER forgets the allocation, then the
            // driver unmaps it, before this call's API EXIT.
            inventory.on_free(0);
        }
        toolwork::after(true);
    }
}

impl ReplayTool for WorkTool<'_> {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(self.passes)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, pass: u64, _: u64) {
        self.work_if(At::PassEnter(pass));
    }
    fn pass_exit(&mut self, _: &DispatchInfo, pass: u64, _: u64) -> ContinueChange {
        self.work_if(At::PassExit(pass));
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, phase: Phase, _: &MemoryOpReport) {
        if phase == Phase::Exit {
            self.work_if(At::SnapshotExit);
        }
    }
    fn restore(&mut self, _: &DispatchInfo, phase: Phase, r: &RestoreRequest, _: &MemoryOpReport) {
        self.work_if(match phase {
            Phase::Enter => At::RestoreEnter(r.next_pass),
            Phase::Exit => At::RestoreExit(r.next_pass),
        });
    }
    fn config_exit(&mut self, _: &DispatchInfo, _: &ReplayOutcome) {
        self.work_if(At::ConfigExit);
    }
}

struct Run {
    words: Vec<u32>,
    before: Vec<Before>,
    lost: Vec<String>,
}

/// One replayed launch of [`PASSES`] passes with the tool working at `at`.
#[derive(Clone)]
struct Case {
    config: SnapshotConfig,
    at: At,
    aim: Aim,
    /// The window offers a [`HostIo`].
    keeps: bool,
    /// The [`HostIo`]'s reads fail.
    io_fails: bool,
    /// The tool writes memory the snapshot does not hold.
    untracked: bool,
    /// The tool's call fails and writes nothing.
    call_fails: bool,
    /// The tracked allocation is freed during the tool's call.
    freed_meanwhile: bool,
}

impl Case {
    fn at(at: At) -> Case {
        Case {
            config: SnapshotConfig::default(),
            at,
            aim: Aim::Address,
            keeps: true,
            io_fails: false,
            untracked: false,
            call_fails: false,
            freed_meanwhile: false,
        }
    }

    fn run(self) -> Run {
        let device = OneDevice::with_allocations(
            WORDS + EXTRA,
            &[(0, (WORDS * 4) as u64)],
            AGENT,
            self.config,
        );
        let registry = ContextRegistry::new();
        let lost = Arc::new(Mutex::new(Vec::new()));
        let ops = Launch {
            device: &device,
            keeps: self.keeps,
            fail: self.io_fails,
            lost: lost.clone(),
        };
        let mut tool = WorkTool {
            passes: PASSES,
            at: self.at,
            aim: self.aim,
            memory: &device.memory,
            untracked: self.untracked,
            fails: self.call_fails,
            freed_meanwhile: self.freed_meanwhile.then_some(&*device.inventory),
            before: Vec::new(),
        };
        let window = Window::enter(
            device.context(&registry),
            &mut tool,
            DispatchInfo::default(),
            &ops,
        );
        add_one_tracked(&device.memory);
        let record = window.exit(&mut tool, &registry, &ops, Ok(()));
        assert!(
            matches!(record.outcome, ReplayOutcome::Replayed { .. }),
            "{:?}",
            record.outcome
        );
        let words = device.memory.0.lock().unwrap().clone();
        let lost = lost.lock().unwrap().clone();
        Run {
            words,
            before: tool.before,
            lost,
        }
    }
}

/// Words that are not what the application would see after the tool's work and one run of the
/// kernel: `set_to` for the set words, `i + 1` for the others.
fn wrong_words(words: &[u32], set_to: u32) -> Vec<usize> {
    (0..WORDS)
        .filter(|&i| {
            let want = if SET.contains(&i) {
                set_to
            } else {
                i as u32 + 1
            };
            words[i] != want
        })
        .collect()
}

const PASSES: u64 = 4;

const EVERY_CALLBACK: [At; 9] = [
    At::SnapshotExit,
    At::PassEnter(0),
    At::PassExit(0),
    At::RestoreEnter(1),
    At::RestoreExit(1),
    At::PassEnter(2),
    At::PassExit(2),
    At::RestoreEnter(3),
    At::PassExit(3),
];

/// Whatever callback it comes from, what the tool set is kept by every later restore, under
/// every strategy and store tier: the passes after it start from it (so the final words hold
/// it plus the kernel's one increment, or only it when set after the last pass), and every
/// other word holds exactly one increment.
#[test]
fn what_a_tool_writes_from_a_replay_callback_survives_the_restores_that_follow() {
    for strategy in [
        RestoreStrategy::Full,
        RestoreStrategy::Hash,
        RestoreStrategy::Writeset,
    ] {
        for store in [StoreTier::Host, StoreTier::File] {
            // Spill files go to the system temporary directory.
            if store == StoreTier::File && !fake_device::spill_room(&std::env::temp_dir(), 16 << 20)
            {
                continue;
            }
            for at in EVERY_CALLBACK {
                let config = SnapshotConfig::default()
                    .with_strategy(strategy)
                    .with_store(store)
                    .with_chunk_size(4096);
                let r = Case {
                    config,
                    ..Case::at(at)
                }
                .run();
                let set_to = if at == At::PassExit(PASSES - 1) {
                    VALUE
                } else {
                    VALUE + 1
                };
                let wrong = wrong_words(&r.words, set_to);
                assert!(
                    wrong.is_empty(),
                    "{strategy} {store} {at:?}: {} wrong word(s), first {:?} = {:#x}",
                    wrong.len(),
                    wrong.first(),
                    r.words[wrong[0]]
                );
                assert_eq!(
                    r.before,
                    vec![Before::Watching((SET.len() * 4) as u64)],
                    "{at:?}: the destination range is watched, nothing else"
                );
                assert!(r.lost.is_empty(), "{:?}", r.lost);
            }
        }
    }
}

/// A call whose destination is not described (a launch, a 2D copy) captures the whole snapshot
/// and keeps its work the same way.
#[test]
fn work_whose_destination_is_unknown_is_captured_whole_and_kept() {
    let r = Case {
        aim: Aim::Anything,
        ..Case::at(At::PassExit(1))
    }
    .run();
    assert_eq!(wrong_words(&r.words, VALUE + 1), Vec::<usize>::new());
    assert_eq!(r.before, vec![Before::Watching((WORDS * 4) as u64)]);
}

/// A launch whose argument values are trusted captures the regions they point into and nothing
/// for values into memory the snapshot does not hold.
#[test]
fn trusted_argument_values_capture_only_the_regions_they_point_into() {
    let r = Case {
        aim: Aim::Reached,
        ..Case::at(At::PassEnter(1))
    }
    .run();
    assert_eq!(wrong_words(&r.words, VALUE + 1), Vec::<usize>::new());
    assert_eq!(r.before, vec![Before::Watching((WORDS * 4) as u64)]);
}

/// A launch given only the end of a tracked allocation (one past its last byte) may walk back
/// from it and write the allocation, as the application's launches are taken to (their scan
/// reaches the allocation an end pointer ends): its region is captured, and what it wrote is
/// kept. Before, nothing was captured and the next restore undid the tool's work unreported.
#[test]
fn a_launch_given_an_end_pointer_has_the_allocation_it_ends_captured_and_kept() {
    let r = Case {
        aim: Aim::EndPointer,
        ..Case::at(At::PassEnter(1))
    }
    .run();
    assert_eq!(r.before, vec![Before::Watching((WORDS * 4) as u64)]);
    assert_eq!(wrong_words(&r.words, VALUE + 1), Vec::<usize>::new());
}

/// Work into memory the snapshot does not hold (a buffer the tool allocated inside its
/// callbacks) captures nothing and is left alone; the application's words are one run's.
#[test]
fn work_into_memory_outside_the_snapshot_captures_nothing_and_stays() {
    for aim in [Aim::Address, Aim::Reached] {
        let r = Case {
            aim,
            untracked: true,
            ..Case::at(At::PassExit(1))
        }
        .run();
        if let Aim::Address = aim {
            assert_eq!(r.before, vec![Before::Untouched]);
        }
        assert!(
            r.words[WORDS + 16..].iter().all(|&w| w == VALUE),
            "the tool's own words"
        );
        let one_run = (0..WORDS).all(|i| r.words[i] == i as u32 + 1);
        assert!(one_run, "the application's words hold one increment");
    }
}

/// Work outside the replay callbacks (CONFIG EXIT, after the last pass) is not bracketed: it is
/// the tool's own business and nothing restores over it.
#[test]
fn work_at_config_exit_is_outside_the_window() {
    let r = Case::at(At::ConfigExit).run();
    assert_eq!(r.before, vec![Before::Outside]);
    assert_eq!(wrong_words(&r.words, VALUE), Vec::<usize>::new());
}

/// A window that cannot keep tool work says so (the injected library then warns), and one
/// whose capture fails reports the call as possibly undone: the restores then bring the
/// snapshot back over it, never silently.
#[test]
fn work_that_cannot_be_kept_is_reported_not_hidden() {
    let r = Case {
        keeps: false,
        ..Case::at(At::PassExit(1))
    }
    .run();
    assert_eq!(r.before, vec![Before::NotKept]);
    let one_run = (0..WORDS).all(|i| r.words[i] == i as u32 + 1);
    assert!(one_run, "the restores undid the work");
    for (aim, before, why) in [
        (
            Aim::Address,
            Before::Watching((SET.len() * 4) as u64),
            "its changes could not be read",
        ),
        (Aim::Anything, Before::Failed, "no capture before it"),
    ] {
        let r = Case {
            aim,
            io_fails: true,
            ..Case::at(At::PassExit(1))
        }
        .run();
        assert_eq!(r.before, vec![before]);
        assert_eq!(r.lost.len(), 1, "{:?}", r.lost);
        assert!(
            r.lost[0].starts_with(&format!("cuMemsetD32_v2: {why}: no host memory")),
            "{:?}",
            r.lost
        );
    }
}

/// A copy or memset that fails wrote nothing: its range, which holds what the pass left there,
/// is not taken for its work, and the next restores undo the pass as always (a comparison finds
/// nothing either).
#[test]
fn a_call_that_failed_keeps_nothing_and_the_pass_is_still_undone() {
    for aim in [Aim::Address, Aim::Anything] {
        for at in [At::PassExit(0), At::PassExit(2)] {
            let r = Case {
                aim,
                call_fails: true,
                ..Case::at(at)
            }
            .run();
            let one_run = (0..WORDS).all(|i| r.words[i] == i as u32 + 1);
            assert!(one_run, "{aim:?} {at:?}: every word holds one increment");
            assert!(r.lost.is_empty(), "{:?}", r.lost);
        }
    }
}

/// Another thread frees the memory a tool's memset writes while the memset is in progress
/// (frees take no device lock). The memset's API EXIT read its whole destination range back
/// without asking whether it was still allocated: on a GPU that reads unmapped memory, and the
/// tool's work was reported as possibly undone. Now only what is still allocated is read, under
/// the inventory's pin (a free waits for the read), and nothing of the freed range is kept.
#[test]
fn memory_freed_during_a_tools_call_is_not_read_at_its_exit() {
    for at in [At::SnapshotExit, At::PassExit(1), At::RestoreExit(2)] {
        let r = Case {
            freed_meanwhile: true,
            ..Case::at(at)
        }
        .run();
        assert_eq!(r.before, vec![Before::Watching((SET.len() * 4) as u64)]);
        assert!(r.lost.is_empty(), "{at:?}: {:?}", r.lost);
    }
}
