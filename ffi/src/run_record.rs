//! The per-kernel record `kreplay run` reads back: what the injected library saw, written at
//! exit into the folder `KREPLAY_RECORD_DIR` names, one JSON file ([`RunRecord`]) per process
//! (per load of kreplay), `kreplay-record-<pid>-<load>.json` ([`file_name`]). It is first
//! written when recording starts, marked incomplete ([`RunRecord::incomplete`]), so that a
//! process that never reaches its exit handlers is counted, and said to be missing.
//!
//! Every dispatch that goes through the replay loop is added ([`add`]) under its kernel's name;
//! the memory tier and restore strategy come from the dispatch's SNAPSHOT and RESTORE reports,
//! which the [`Recording`] tool wrapper notes on the dispatch's thread. [`write()`] replaces the
//! process's file atomically (a temporary file beside it, then a rename), so a reader never sees
//! half a record; it may run more than once (the runtime's unload, then the process's exit),
//! each time with everything so far. A program of several processes (a launcher and its
//! workers) leaves one file per process that loaded kreplay; [`read_dir`] and [`merge`] add them
//! up. A child forked from a recording process without loading kreplay again writes nothing
//! (its copy of the record is its parent's).
//!
//! ```
//! use kreplay::run_record::{KernelRecord, RunRecord};
//! let record = RunRecord {
//!     backend: "cuda".into(),
//!     kernels: vec![KernelRecord { kernel: "add_one".into(), launches: 2, ..Default::default() }],
//!     ..Default::default()
//! };
//! let text = serde_json::to_string(&record).unwrap();
//! assert_eq!(serde_json::from_str::<RunRecord>(&text).unwrap(), record);
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use kreplay_passloop::{
    ContinueChange, DispatchInfo, FixedPasses, LoopLimits, MemoryOpReport, Phase, ReplayOutcome,
    ReplayRecord, ReplayTool, RestoreRequest, ToolAnswer,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The environment variable naming the record folder.
pub const ENV_RECORD_DIR: &str = "KREPLAY_RECORD_DIR";

/// The record file of process `pid` in the record folder, for the load of kreplay numbered
/// `load` (its start time): a process that replaces itself (`exec` keeps the process id) or a
/// process id used again by a later process of the program never overwrites an earlier record.
pub fn file_name(pid: u32, load: u128) -> String {
    format!("kreplay-record-{pid}-{load}.json")
}

/// One kernel's dispatches, added up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelRecord {
    /// The kernel's name (CUPTI's on CUDA; on HSA the host's, else `kernel 0x<object>`).
    pub kernel: String,
    /// Dispatches (launches) of it.
    pub launches: u64,
    /// Of them, replayed in full.
    pub replayed: u64,
    /// Passes run, the application's own included.
    pub passes: u64,
    /// Bytes copied into snapshots.
    pub snapshot_bytes: u64,
    /// Snapshot tiers used (`device`, `host`, `file`; several joined with `+`; empty: none).
    pub tier: String,
    /// Restore strategies used (`full`, `hash`, `writeset`; joined with `+`).
    pub strategy: String,
    /// Restores.
    pub restores: u64,
    /// Time restoring, milliseconds.
    pub restore_ms: f64,
    /// Replays that failed (a pass or a restore).
    pub failed: u64,
    /// Dispatches that ran once, declined, by reason.
    pub declines: BTreeMap<String, u64>,
}

/// What one run of a program under kreplay saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// `cuda` or `hsa`.
    pub backend: String,
    /// `built-in` (every dispatch N passes) or `tools` (the C ABI's tools decided).
    pub tool: String,
    /// The built-in tool's passes (`KREPLAY_PASSES`; 0 when tools decided).
    pub passes_requested: u64,
    /// One entry per kernel, in the order first seen.
    pub kernels: Vec<KernelRecord>,
    /// Graph launches (run once, never replayed).
    pub graph_launches: u64,
    /// Managed allocations seen (launches decline while one is live).
    pub managed_allocations: u64,
    /// Calls a tool made from its replay callbacks into memory a snapshot held (CUDA; their
    /// work is kept by the restores that follow).
    #[serde(default)]
    pub tool_work: u64,
    /// Bytes those calls wrote there, kept.
    #[serde(default)]
    pub tool_work_kept_bytes: u64,
    /// Of those calls, the ones whose work a later restore may have undone (each warned about
    /// on stderr).
    #[serde(default)]
    pub tool_work_lost: u64,
    /// Processes whose records this one adds up (1 for one process's file).
    #[serde(default = "one")]
    pub processes: u64,
    /// What went wrong with the C ABI's tools at load, one line each (a library that could not
    /// be used, a tool rejected or failed at initialize): `kreplay run --tool` fails on any.
    #[serde(default)]
    pub tool_problems: Vec<String>,
    /// Tools that chose to stay inactive (their configure returned NULL), one line each: not a
    /// failure, but why such a tool replayed nothing.
    #[serde(default)]
    pub tool_notes: Vec<String>,
    /// Processes that loaded kreplay and ended without writing their record at exit (a
    /// crash, a signal, an exit that skipped the exit handlers, an `exec`): the record each
    /// wrote when it loaded kreplay says so, and their kernels are missing.
    #[serde(default)]
    pub incomplete: u64,
    /// Times a process started its runtime again after kreplay had been unloaded from it
    /// (ROCm: `hsa_shut_down`, then `hsa_init`): kreplay's tools are initialized once per
    /// process, so kreplay did not load again and the kernels of those sessions are missing.
    #[serde(default)]
    pub sessions_unprofiled: u64,
}

fn one() -> u64 {
    1
}

/// A record being added to: its kernels' rows, and where each kernel's row is by name, so that
/// a dispatch finds its row in constant time however many kernels the program has (a program
/// that autotunes may launch tens of thousands of distinct kernels, and every dispatch adds to
/// the record under the lock).
#[derive(Debug, Default)]
struct Live {
    run: RunRecord,
    rows: HashMap<String, usize>,
}

impl Live {
    fn new(run: RunRecord) -> Self {
        let rows = run
            .kernels
            .iter()
            .enumerate()
            .map(|(at, k)| (k.kernel.clone(), at))
            .collect();
        Live { run, rows }
    }

    /// The row of `kernel`, added at the end the first time it is seen.
    fn row(&mut self, kernel: &str) -> &mut KernelRecord {
        let at = match self.rows.get(kernel) {
            Some(&at) => at,
            None => {
                let at = self.run.kernels.len();
                self.run.kernels.push(KernelRecord {
                    kernel: kernel.into(),
                    ..Default::default()
                });
                self.rows.insert(kernel.to_owned(), at);
                at
            }
        };
        &mut self.run.kernels[at]
    }

    /// Adds one dispatch of `kernel`, which used the snapshot `tiers` and restore `strategies`.
    fn add(&mut self, record: &ReplayRecord, kernel: &str, tiers: &[&str], strategies: &[&str]) {
        let k = self.row(kernel);
        let c = &record.cost;
        k.launches += 1;
        k.passes += c.passes_run.max(1);
        k.snapshot_bytes += c.bytes_snapshotted;
        k.restores += c.restore_times.len() as u64;
        k.restore_ms += c
            .restore_times
            .iter()
            .map(|t| t.as_secs_f64() * 1e3)
            .sum::<f64>();
        join(&mut k.tier, tiers);
        join(&mut k.strategy, strategies);
        match &record.outcome {
            ReplayOutcome::Replayed { .. } => k.replayed += 1,
            ReplayOutcome::RanOnce { .. } => {
                if let Some(d) = record.outcome.decline() {
                    *k.declines.entry(d.reason.as_str().to_owned()).or_default() += 1;
                }
            }
            ReplayOutcome::PassFailed { .. } | ReplayOutcome::RestoreFailed { .. } => k.failed += 1,
        }
    }
}

static RECORD: Mutex<Option<Live>> = Mutex::new(None);
/// This process's record file: in the record folder, absolute, as `KREPLAY_RECORD_DIR` named
/// it at load (the program may change folder or its environment before it exits), under the
/// name [`file_name`] gave it then.
static FILE: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Whether `RECORD` holds a record (set once by `start`, never cleared): every dispatch asks,
/// and a flag costs it no lock.
static ACTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The process that started recording (a forked child does not write its parent's record).
static OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`).
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 2] = [&FILE, &RECORD];

thread_local! {
    /// Tiers and strategies of the dispatch in progress on this thread.
    static SEEN: RefCell<(Vec<&'static str>, Vec<&'static str>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The record folder `KREPLAY_RECORD_DIR` names, as an absolute path (`None`: unset, no
/// record). An empty value, or one that is not an existing folder, is an error naming the
/// variable: checked at load, not found out at exit, when the record would be lost (or, for
/// an empty value, written into whatever folder the program is in).
pub fn dir_from_env() -> Result<Option<PathBuf>, String> {
    let Some(value) = std::env::var_os(ENV_RECORD_DIR) else {
        return Ok(None);
    };
    let path = Path::new(&value);
    if value.is_empty() || !path.is_dir() {
        return Err(format!(
            "invalid {ENV_RECORD_DIR}={:?}: expected an existing folder",
            path.display().to_string()
        ));
    }
    Ok(Some(
        std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    ))
}

/// Starts recording for `backend` into the folder `dir` (called at load when
/// `KREPLAY_RECORD_DIR` is set, see [`dir_from_env`]).
pub fn start(
    dir: PathBuf,
    backend: &str,
    tool: &str,
    passes_requested: u64,
    tool_problems: Vec<String>,
    tool_notes: Vec<String>,
) {
    let pid = std::process::id();
    OWNER.store(pid, std::sync::atomic::Ordering::Relaxed);
    let load = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    *FILE.lock() = Some(dir.join(file_name(pid, load)));
    *RECORD.lock() = Some(Live::new(RunRecord {
        backend: backend.into(),
        tool: tool.into(),
        passes_requested,
        processes: 1,
        tool_problems,
        tool_notes,
        ..Default::default()
    }));
    ACTIVE.store(true, std::sync::atomic::Ordering::Release);
    // A process that never gets to its exit handlers still leaves a record saying so.
    write_file(false);
}

/// Whether recording is on.
pub fn active() -> bool {
    ACTIVE.load(std::sync::atomic::Ordering::Acquire)
}

fn join(into: &mut String, add: &[&str]) {
    for a in add {
        if !into.split('+').any(|x| x == *a) {
            if !into.is_empty() {
                into.push('+');
            }
            into.push_str(a);
        }
    }
}

/// Adds one dispatch of `kernel`.
pub fn add(record: &ReplayRecord, kernel: &str) {
    // `try_with`: a dispatch from a thread-local destructor may come after `SEEN` went (its
    // tiers and strategies are then not recorded).
    let (tiers, strategies) = SEEN
        .try_with(|s| std::mem::take(&mut *s.borrow_mut()))
        .unwrap_or_default();
    if let Some(live) = RECORD.lock().as_mut() {
        live.add(record, kernel, &tiers, &strategies);
    }
}

/// The backend's whole-run counters (see [`RunRecord`]'s fields of the same names).
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct Totals {
    pub graph_launches: u64,
    pub managed_allocations: u64,
    pub tool_work: u64,
    pub tool_work_kept_bytes: u64,
    pub tool_work_lost: u64,
}

/// Sets the backend's whole-run counters.
pub fn set_totals(t: Totals) {
    if let Some(Live { run, .. }) = RECORD.lock().as_mut() {
        run.graph_launches = t.graph_launches;
        run.managed_allocations = t.managed_allocations;
        run.tool_work = t.tool_work;
        run.tool_work_kept_bytes = t.tool_work_kept_bytes;
        run.tool_work_lost = t.tool_work_lost;
    }
}

/// A copy of the record so far.
pub fn snapshot() -> Option<RunRecord> {
    RECORD.lock().as_ref().map(|live| live.run.clone())
}

/// Notes that kreplay refused to load again into this recording process (the runtime was
/// started again after it unloaded, see [`RunRecord::sessions_unprofiled`]), and writes the
/// record so.
pub fn note_unprofiled_session() {
    if OWNER.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    if let Some(Live { run, .. }) = RECORD.lock().as_mut() {
        run.sessions_unprofiled += 1;
    }
    write();
}

/// This process's record file, once recording started.
pub fn file() -> Option<PathBuf> {
    FILE.lock().clone()
}

/// Writes the record so far to `path`, atomically.
pub fn write_to(path: &Path) -> Result<(), String> {
    let Some(record) = snapshot() else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())?;
    // The record is written inside the host program (at load and at exit): a file past its
    // file size limit would end it with SIGXFSZ instead of its own exit status.
    if let Some(limit) =
        kreplay_snapshot::file_size_limit().filter(|&limit| text.len() as u64 > limit)
    {
        return Err(format!(
            "cannot write the record file {}: its {} bytes exceed the process's file size \
             limit (RLIMIT_FSIZE) of {limit} bytes",
            path.display(),
            text.len()
        ));
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}.tmp", std::process::id()));
    let temp = PathBuf::from(temp);
    // A failed write or rename (a full disk, a folder made read-only meanwhile) removes the
    // temporary file; the record file, if any, stays as it was.
    std::fs::write(&temp, text)
        .map_err(|e| format!("writing {}: {e}", temp.display()))
        .and_then(|()| {
            std::fs::rename(&temp, path)
                .map_err(|e| format!("renaming {} over it: {e}", temp.display()))
        })
        .map_err(|why| {
            let _ = std::fs::remove_file(&temp);
            format!("cannot write the record file {}: {why}", path.display())
        })
}

/// Writes this process's record into `KREPLAY_RECORD_DIR` when recording (problems are
/// logged).
pub fn write() {
    write_file(true);
}

/// Writes the record file; `finished`: at unload or exit, else at load (the record then says
/// it is incomplete, which stays true if the process never gets to write it again).
fn write_file(finished: bool) {
    let Some(file) = FILE.lock().clone() else {
        return;
    };
    if OWNER.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    if let Some(Live { run, .. }) = RECORD.lock().as_mut() {
        run.incomplete = u64::from(!finished);
    }
    if let Err(e) = write_to(&file) {
        crate::logging::log(crate::logging::Severity::Warn, format_args!("{e}"));
    }
}

/// The records in `dir` (every `kreplay-record-*.json`; temporary files are skipped).
pub fn read_dir(dir: &Path) -> Result<Vec<RunRecord>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kreplay-record-") && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read the record file {}: {e}", p.display()))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("the record file {} is not valid: {e}", p.display()))
        })
        .collect()
}

/// Adds up the records of several processes: kernels of the same name are one row (counts and
/// times summed, tiers and strategies joined, declines summed), in the order first seen.
pub fn merge(records: Vec<RunRecord>) -> Option<RunRecord> {
    let mut records = records.into_iter();
    let mut live = Live::new(records.next()?);
    for other in records {
        let run = &mut live.run;
        run.processes += other.processes;
        run.incomplete += other.incomplete;
        run.sessions_unprofiled += other.sessions_unprofiled;
        run.graph_launches += other.graph_launches;
        run.managed_allocations += other.managed_allocations;
        run.tool_work += other.tool_work;
        run.tool_work_kept_bytes += other.tool_work_kept_bytes;
        run.tool_work_lost += other.tool_work_lost;
        for problem in other.tool_problems {
            if !run.tool_problems.contains(&problem) {
                run.tool_problems.push(problem);
            }
        }
        for note in other.tool_notes {
            if !run.tool_notes.contains(&note) {
                run.tool_notes.push(note);
            }
        }
        if run.tool != other.tool {
            run.tool = "mixed".into();
        }
        run.passes_requested = run.passes_requested.max(other.passes_requested);
        for k in other.kernels {
            match live.rows.get(&k.kernel) {
                None => {
                    live.rows.insert(k.kernel.clone(), live.run.kernels.len());
                    live.run.kernels.push(k);
                }
                Some(&at) => {
                    let r = &mut live.run.kernels[at];
                    r.launches += k.launches;
                    r.replayed += k.replayed;
                    r.passes += k.passes;
                    r.snapshot_bytes += k.snapshot_bytes;
                    r.restores += k.restores;
                    r.restore_ms += k.restore_ms;
                    r.failed += k.failed;
                    let tiers: Vec<&str> = k.tier.split('+').filter(|t| !t.is_empty()).collect();
                    join(&mut r.tier, &tiers);
                    let strategies: Vec<&str> =
                        k.strategy.split('+').filter(|t| !t.is_empty()).collect();
                    join(&mut r.strategy, &strategies);
                    for (reason, n) in k.declines {
                        *r.declines.entry(reason).or_default() += n;
                    }
                }
            }
        }
    }
    Some(live.run)
}

/// A tool whose SNAPSHOT and RESTORE reports are noted for the record (everything else is the
/// inner tool's).
#[derive(Debug)]
pub struct Recording<T>(pub T);

fn note(report: &MemoryOpReport) {
    if report.declined.is_some() || report.failed {
        return;
    }
    let tier = report.tier.as_str();
    let strategy = report.strategy.as_str();
    let _ = SEEN.try_with(|s| {
        let mut s = s.borrow_mut();
        if tier != "none" && !s.0.contains(&tier) {
            s.0.push(tier);
        }
        if !s.1.contains(&strategy) {
            s.1.push(strategy);
        }
    });
}

impl<T: ReplayTool> ReplayTool for Recording<T> {
    fn limits(&self) -> LoopLimits {
        self.0.limits()
    }
    fn config_enter(&mut self, info: &DispatchInfo) -> ToolAnswer {
        let _ = SEEN.try_with(|s| *s.borrow_mut() = Default::default());
        self.0.config_enter(info)
    }
    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total: u64) {
        self.0.pass_enter(info, pass, total)
    }
    fn pass_exit(&mut self, info: &DispatchInfo, pass: u64, total: u64) -> ContinueChange {
        self.0.pass_exit(info, pass, total)
    }
    fn should_continue(&mut self, info: &DispatchInfo, current: u64, total: u64) -> bool {
        self.0.should_continue(info, current, total)
    }
    fn snapshot(&mut self, info: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        if phase == Phase::Exit {
            note(report);
        }
        self.0.snapshot(info, phase, report)
    }
    fn restore(
        &mut self,
        info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    ) {
        if phase == Phase::Exit {
            note(report);
        }
        self.0.restore(info, phase, request, report)
    }
    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome) {
        self.0.config_exit(info, outcome)
    }
}

/// The built-in tool: every dispatch `passes` times (`KREPLAY_PASSES`), used when no tool of
/// the C ABI owns KERNEL_REPLAY, under the C ABI's loop limits.
pub fn built_in_passes(passes: u64) -> FixedPasses {
    FixedPasses::new(passes).with_limits(crate::hsa_tool::loop_limits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_passloop::{Decline, DeclineReason, LoopEnd, RanOnceReason, ReplayCost};
    use std::time::Duration;

    fn record(outcome: ReplayOutcome, passes: u64, restores: u32) -> ReplayRecord {
        let mut cost = ReplayCost::default();
        cost.passes_run = passes;
        cost.bytes_snapshotted = if passes > 1 { 4096 } else { 0 };
        cost.restore_times = vec![Duration::from_micros(500); restores as usize];
        ReplayRecord::new(DispatchInfo::default(), outcome, passes, cost)
    }

    #[test]
    fn tens_of_thousands_of_kernels_keep_their_rows_exact_and_in_first_seen_order() {
        // An autotuning program: many distinct kernels, each launched a few times, interleaved.
        const KERNELS: usize = 30_000;
        let mut live = Live::new(RunRecord::default());
        let replayed = record(
            ReplayOutcome::Replayed {
                passes: 2,
                end: LoopEnd::LastPass,
            },
            2,
            1,
        );
        for round in 0..3 {
            for i in 0..KERNELS {
                // Kernel i is launched once in round 0, again in round 1 when even, and in
                // round 2 when divisible by three.
                if round == 0 || (round == 1 && i % 2 == 0) || (round == 2 && i % 3 == 0) {
                    live.add(&replayed, &format!("tune_{i}"), &["host"], &["full"]);
                }
            }
        }
        let run = live.run;
        assert_eq!(run.kernels.len(), KERNELS);
        for (i, k) in run.kernels.iter().enumerate() {
            let launches = 1 + u64::from(i % 2 == 0) + u64::from(i % 3 == 0);
            assert_eq!(k.kernel, format!("tune_{i}"));
            assert_eq!(
                (k.launches, k.replayed, k.passes, k.restores),
                (launches, launches, 2 * launches, launches),
                "{}",
                k.kernel
            );
            assert_eq!((k.tier.as_str(), k.strategy.as_str()), ("host", "full"));
        }
        // Two processes' records of them add up row by row; the second one's new kernels come
        // after, in its order.
        let mut other = run.clone();
        other.kernels.reverse();
        other.kernels.push(KernelRecord {
            kernel: "late".into(),
            launches: 5,
            ..Default::default()
        });
        let merged = merge(vec![run.clone(), other]).unwrap();
        assert_eq!(merged.kernels.len(), KERNELS + 1);
        for (a, m) in run.kernels.iter().zip(&merged.kernels) {
            assert_eq!(m.kernel, a.kernel);
            assert_eq!(m.launches, 2 * a.launches, "{}", m.kernel);
        }
        assert_eq!(merged.kernels[KERNELS].kernel, "late");
        assert_eq!(merged.kernels[KERNELS].launches, 5);
    }

    #[test]
    fn dispatches_add_up_per_kernel_with_tiers_declines_and_an_atomic_file() {
        let started =
            std::env::temp_dir().join(format!("kreplay-record-start-{}", std::process::id()));
        std::fs::create_dir_all(&started).unwrap();
        start(
            started.clone(),
            "hsa",
            "built-in",
            3,
            Vec::new(),
            Vec::new(),
        );
        // Written at once, saying the process has not finished; the final write says it has.
        let at_load: RunRecord =
            serde_json::from_str(&std::fs::read_to_string(file().unwrap()).unwrap()).unwrap();
        assert_eq!((at_load.incomplete, at_load.processes), (1, 1));
        let mut tool = Recording(built_in_passes(3));
        let info = DispatchInfo::default();
        tool.config_enter(&info);
        tool.snapshot(
            &info,
            Phase::Exit,
            &MemoryOpReport {
                tier: kreplay_passloop::StoreTier::Host,
                ..Default::default()
            },
        );
        let replayed = ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass,
        };
        add(&record(replayed.clone(), 3, 2), "k1");
        tool.config_enter(&info);
        add(&record(replayed, 3, 2), "k1");
        let declined = ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(Decline::new(DeclineReason::UntrackedMemory, "managed")),
        };
        add(&record(declined, 0, 0), "k2");
        write();
        let at_exit: RunRecord =
            serde_json::from_str(&std::fs::read_to_string(file().unwrap()).unwrap()).unwrap();
        std::fs::remove_dir_all(&started).unwrap();
        assert_eq!(at_exit.incomplete, 0);
        let run = snapshot().unwrap();
        assert_eq!(at_exit, run);
        assert_eq!(run.kernels.len(), 2);
        let k1 = &run.kernels[0];
        assert_eq!(
            (
                k1.launches,
                k1.replayed,
                k1.passes,
                k1.snapshot_bytes,
                k1.restores
            ),
            (2, 2, 6, 8192, 4)
        );
        assert_eq!((k1.tier.as_str(), k1.strategy.as_str()), ("host", "full"));
        assert!((k1.restore_ms - 2.0).abs() < 1e-9);
        let k2 = &run.kernels[1];
        assert_eq!((k2.launches, k2.passes), (1, 1));
        assert_eq!(k2.declines.get("untracked_memory"), Some(&1));

        let dir = std::env::temp_dir().join(format!("kreplay-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("record.json");
        write_to(&path).unwrap();
        let back: RunRecord =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, run);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        let err = write_to(&dir.join("missing").join("r.json")).unwrap_err();
        assert!(err.contains("cannot write the record file"), "{err}");
        // A rename that fails (the record's name taken by a folder) removes its temporary
        // file and says so.
        let taken = dir.join("taken.json");
        std::fs::create_dir_all(taken.join("inside")).unwrap();
        let err = write_to(&taken).unwrap_err();
        assert!(
            err.contains("renaming") && err.contains("taken.json"),
            "{err}"
        );
        assert!(taken.join("inside").exists());
        std::fs::remove_dir_all(&taken).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left after a failed rename"
        );

        // A second process's record beside it: read back and added up by kernel name.
        let mut other = run.clone();
        other.incomplete = 1;
        other.kernels[0].tier = "device".into();
        other.kernels.push(KernelRecord {
            kernel: "k3".into(),
            launches: 1,
            ..Default::default()
        });
        std::fs::write(
            dir.join(file_name(1, 1)),
            serde_json::to_string(&other).unwrap(),
        )
        .unwrap();
        std::fs::rename(&path, dir.join(file_name(2, 1))).unwrap();
        std::fs::write(dir.join("kreplay-record-3.json.9.tmp"), "half").unwrap();
        let merged = merge(read_dir(&dir).unwrap()).unwrap();
        assert_eq!((merged.processes, merged.incomplete), (2, 1));
        assert_eq!(merged.kernels.len(), 3);
        let k1 = &merged.kernels[0];
        assert_eq!((k1.launches, k1.passes, k1.restores), (4, 12, 8));
        assert_eq!(k1.tier, "device+host");
        assert_eq!(merged.kernels[1].declines.get("untracked_memory"), Some(&2));
        assert_eq!(merge(Vec::new()), None);
        std::fs::write(dir.join(file_name(4, 1)), "{").unwrap();
        assert!(read_dir(&dir).unwrap_err().contains("is not valid"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
