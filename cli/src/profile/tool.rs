//! The profiling tool behind `kreplay profile`, written against kreplay's C ABI as a C tool
//! would be: a KERNEL_REPLAY context answering the number of counter groups as the pass count
//! (kernel replay) or opting every dispatch out (application replay), and a dispatch counting
//! context whose dispatch callback picks the configuration of the pass's group and whose record
//! callback keeps every value as its own row (nothing is ever added together).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::io::IsTerminal;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId, ContextHandle,
    CounterConfigId, CounterRecord, KernelDispatchInfo, KernelReplayData, KernelReplayOperation,
    REPLAY_PASS_NONE, ReplayOutcomeKind, Status, ToolConfigureResult, UserData,
};
use kreplay::api::{
    kreplay_configure_callback_tracing_service, kreplay_create_context, kreplay_force_configure,
    kreplay_start_context,
};

/// How the next dispatches are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Count nothing.
    Idle,
    /// Every dispatch is replayed once per group; pass `p` counts group `p`.
    Kernel,
    /// Dispatches run once and count group `g`.
    Application(usize),
}

/// One counter value of one pass (or run) of one dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The run of the workload it came from (0-based).
    pub run: usize,
    /// The dispatch.
    pub dispatch_id: u64,
    /// The pass, `None` when the dispatch was not replayed.
    pub replay_pass: Option<u64>,
    /// The counter group it belongs to.
    pub group: usize,
    /// The kernel object.
    pub kernel_id: u64,
    /// The agent.
    pub agent: u64,
    /// The counter's id on the agent.
    pub counter: u32,
    /// The value.
    pub value: f64,
}

struct State {
    mode: Mode,
    run: usize,
    /// Per group: the configuration of each agent.
    configs: Vec<HashMap<u64, CounterConfigId>>,
    rows: Vec<Row>,
    dispatches: u64,
    problems: Vec<String>,
    /// Dispatches whose counters are incomplete, and why.
    incomplete: Vec<String>,
    /// Dispatches seen to their CONFIG EXIT and not already incomplete: (dispatch, kernel, the
    /// groups it must have rows of), checked against the rows when the run is taken.
    ended: Vec<(u64, u64, Vec<usize>)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    mode: Mode::Idle,
    run: 0,
    configs: Vec::new(),
    rows: Vec::new(),
    dispatches: 0,
    problems: Vec::new(),
    incomplete: Vec::new(),
    ended: Vec::new(),
});
static REGISTERED: OnceLock<()> = OnceLock::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Registers the tool with `kreplay_force_configure` (once per process).
pub fn register() -> Result<(), String> {
    if REGISTERED.set(()).is_err() {
        return Err("the profiling tool is already registered in this process".into());
    }
    match kreplay_force_configure(Some(configure)) {
        Status::SUCCESS => Ok(()),
        status => Err(format!("kreplay_force_configure: {status}")),
    }
}

/// Sets the counter configurations (per group, per agent).
pub fn set_configs(configs: Vec<HashMap<u64, CounterConfigId>>) {
    state().configs = configs;
}

/// Switches the mode for the next run of the workload.
pub fn start_run(mode: Mode, run: usize) {
    let mut s = state();
    s.mode = mode;
    s.run = run;
}

/// What one run of the workload collected.
pub struct Taken {
    /// Every row.
    pub rows: Vec<Row>,
    /// Problems the tool met (a failure of the tool itself).
    pub problems: Vec<String>,
    /// Dispatches that did not count every group they should have (kernel replay declined or
    /// ended before the last group; or counters kreplay could not collect, in either mode),
    /// one line each.
    pub incomplete: Vec<String>,
}

/// Takes everything collected so far. A dispatch seen to its CONFIG EXIT without a row of every
/// group it should have counted is incomplete: kreplay could not count it (it says why on
/// stderr: a completion signal it could not create, counters it could not program or read).
pub fn take() -> Taken {
    let mut s = state();
    s.mode = Mode::Idle;
    let ended = std::mem::take(&mut s.ended);
    for (dispatch, kernel, groups) in ended {
        let missing: Vec<String> = groups
            .iter()
            .filter(|&&g| {
                !s.rows
                    .iter()
                    .any(|r| r.dispatch_id == dispatch && r.group == g)
            })
            .map(|g| (g + 1).to_string())
            .collect();
        if !missing.is_empty() {
            let line = format!(
                "dispatch {dispatch} (kernel {kernel:#x}): no values of counter group(s) {}, \
                 which kreplay could not count (its warnings say why)",
                missing.join(", ")
            );
            s.incomplete.push(line);
        }
    }
    Taken {
        rows: std::mem::take(&mut s.rows),
        problems: std::mem::take(&mut s.problems),
        incomplete: std::mem::take(&mut s.incomplete),
    }
}

fn guarded<R>(what: &str, fallback: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(_) => {
            state()
                .problems
                .push(format!("internal error in the profiling tool's {what}"));
            fallback
        }
    }
}

unsafe extern "C" fn configure(
    _version: u32,
    _runtime_version: *const c_char,
    _priority: u32,
    client_id: *mut ClientId,
) -> *mut ToolConfigureResult {
    guarded("configure", std::ptr::null_mut(), || {
        if !client_id.is_null() {
            // SAFETY: kreplay passes a valid client id the tool may name (static string).
            unsafe { (*client_id).name = c"kreplay-profile".as_ptr() };
        }
        // Lives for the rest of the process (the tool is registered once).
        Box::into_raw(Box::new(ToolConfigureResult {
            size: size_of::<ToolConfigureResult>(),
            initialize: Some(initialize),
            finalize: Some(finalize),
            tool_data: std::ptr::null_mut(),
        }))
    })
}

unsafe extern "C" fn initialize(_finalize: ClientFinalizeFn, _tool_data: *mut c_void) -> c_int {
    guarded("initialize", 1, || match set_up() {
        Ok(()) => 0,
        Err(problem) => {
            state().problems.push(format!("initialize: {problem}"));
            1
        }
    })
}

unsafe extern "C" fn finalize(_tool_data: *mut c_void) {}

fn set_up() -> Result<(), String> {
    let create = || {
        let mut context = ContextHandle::default();
        // SAFETY: a valid out-pointer.
        match unsafe { kreplay_create_context(&mut context) } {
            Status::SUCCESS => Ok(context),
            status => Err(format!("kreplay_create_context: {status}")),
        }
    };
    let replay = create()?;
    // SAFETY: all operations; the callback has the C signature and takes no data.
    let status = unsafe {
        kreplay_configure_callback_tracing_service(
            replay,
            CallbackKind::KERNEL_REPLAY,
            std::ptr::null(),
            0,
            Some(on_replay),
            std::ptr::null_mut(),
        )
    };
    if status != Status::SUCCESS {
        return Err(format!("configuring kernel replay: {status}"));
    }
    let counting = create()?;
    // SAFETY: both callbacks have the C signatures and take no data.
    let status = unsafe {
        kreplay::counting::kreplay_configure_dispatch_counting_service(
            counting,
            Some(pick),
            Some(on_counters),
            std::ptr::null_mut(),
        )
    };
    if status != Status::SUCCESS {
        return Err(format!("configuring dispatch counting: {status}"));
    }
    for context in [replay, counting] {
        match kreplay_start_context(context) {
            Status::SUCCESS => {}
            status => return Err(format!("kreplay_start_context: {status}")),
        }
    }
    Ok(())
}

unsafe extern "C" fn pass_count(_info: KernelDispatchInfo, _user_data: UserData) -> u64 {
    guarded("pass-count callback", 1, || state().configs.len() as u64)
}

unsafe extern "C" fn on_replay(
    record: CallbackRecord,
    _user_data: *mut UserData,
    _callback_data: *mut c_void,
) {
    guarded("replay callback", (), || {
        if record.operation != KernelReplayOperation::CONFIG.0 || record.payload.is_null() {
            return;
        }
        if record.phase == CallbackPhase::EXIT {
            // SAFETY: CONFIG records carry a kernel replay payload, read-only at EXIT.
            let data = unsafe { &*record.payload.cast::<KernelReplayData>() };
            note_end(data);
            return;
        }
        if state().mode == Mode::Kernel {
            // SAFETY: CONFIG records carry a kernel replay payload the tool may write at ENTER.
            unsafe {
                (*record.payload.cast::<KernelReplayData>()).replay_pass_count = Some(pass_count)
            };
        }
    });
}

/// Kernel replay: a dispatch whose passes did not count every group (a replay declined, or
/// ended by kreplay's limits before the last group) is noted, so the report says its values
/// are incomplete instead of leaving them out quietly. Any other dispatch is kept with the
/// groups it must have rows of, for [`take`] to check.
fn note_end(data: &KernelReplayData) {
    let mut s = state();
    let groups = s.configs.len() as u64;
    let (dispatch, kernel) = (data.dispatch_info.dispatch_id, data.dispatch_info.kernel_id);
    // The groups counted: a declined replay counted none in a pass, and a failed pass (which
    // `passes_run` includes) never completed, so its values were never read.
    let counted = match data.outcome {
        ReplayOutcomeKind::DECLINED => 0,
        ReplayOutcomeKind::PASS_FAILED => data.passes_run.saturating_sub(1),
        _ => data.passes_run,
    };
    match s.mode {
        Mode::Idle => return,
        Mode::Application(g) => return s.ended.push((dispatch, kernel, vec![g])),
        Mode::Kernel if groups <= 1 => return s.ended.push((dispatch, kernel, vec![0])),
        Mode::Kernel if counted >= groups => {
            return s
                .ended
                .push((dispatch, kernel, (0..groups as usize).collect()));
        }
        Mode::Kernel => {}
    }
    let why = if data.outcome == ReplayOutcomeKind::DECLINED {
        format!("replay declined: {}", data.decline_reason)
    } else {
        let label = |l: Option<&std::ffi::CStr>| {
            l.map_or_else(|| "?".to_owned(), |l| l.to_string_lossy().into_owned())
        };
        format!(
            "{}, {}",
            label(data.outcome.label()),
            label(data.end_reason.label())
        )
    };
    // Named as the tables name it (`kernel saxpy`, or the kernel object where softhsa has no
    // name for it).
    let line = format!(
        "dispatch {dispatch} ({}): {counted} of {groups} counter group(s) counted, {why}",
        super::kernel_title(kernel)
    );
    s.incomplete.push(line);
}

unsafe extern "C" fn pick(
    info: KernelDispatchInfo,
    replay_pass: u64,
    config: *mut CounterConfigId,
    _data: *mut c_void,
) {
    guarded("dispatch counting callback", (), || {
        let s = state();
        let group = match (s.mode, replay_pass) {
            (Mode::Kernel, pass) if pass != REPLAY_PASS_NONE => pass as usize,
            // One group: one pass, which kreplay runs as an ordinary dispatch.
            (Mode::Kernel, _) if s.configs.len() == 1 => 0,
            (Mode::Application(group), REPLAY_PASS_NONE) => group,
            _ => return,
        };
        if let Some(chosen) = s
            .configs
            .get(group)
            .and_then(|g| g.get(&info.agent_id.handle))
        {
            // SAFETY: kreplay passes a valid out-pointer for the call.
            unsafe { config.write(*chosen) };
        }
    });
}

unsafe extern "C" fn on_counters(
    info: KernelDispatchInfo,
    records: *const CounterRecord,
    count: usize,
    _data: *mut c_void,
) {
    guarded("counter record callback", (), || {
        if records.is_null() || count == 0 {
            return;
        }
        // SAFETY: kreplay passes `count` records valid for the call.
        let records = unsafe { std::slice::from_raw_parts(records, count) };
        let mut s = state();
        let group = match s.mode {
            Mode::Application(group) => group,
            _ if records[0].replay_pass == REPLAY_PASS_NONE => 0,
            _ => records[0].replay_pass as usize,
        };
        let run = s.run;
        for r in records {
            let replay_pass = (r.replay_pass != REPLAY_PASS_NONE).then_some(r.replay_pass);
            s.rows.push(Row {
                run,
                dispatch_id: r.dispatch_id,
                replay_pass,
                group,
                kernel_id: info.kernel_id,
                agent: r.agent_id.handle,
                counter: kreplay::counting::counter_index(r.counter_id).unwrap_or(u32::MAX),
                value: r.value,
            });
        }
        s.dispatches += 1;
        let dispatches = s.dispatches;
        drop(s);
        progress(dispatches);
    });
}

/// A progress line on stderr, only when it is a terminal.
fn progress(counted: u64) {
    static TERMINAL: OnceLock<bool> = OnceLock::new();
    if *TERMINAL.get_or_init(|| std::io::stderr().is_terminal()) {
        eprint!("\rkreplay profile: {counted} dispatch passes counted");
    }
}

/// Ends the progress line (if one was drawn).
pub fn end_progress() {
    if std::io::stderr().is_terminal() && state().dispatches > 0 {
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay whose last pass failed reports `passes_run` with the failed pass included, but
    /// that pass counted nothing: the dispatch is incomplete (it was taken as whole, its last
    /// group's values silently missing).
    #[test]
    fn a_failed_last_pass_leaves_its_dispatch_incomplete() {
        start_run(Mode::Kernel, 0);
        set_configs(vec![HashMap::new(); 3]);
        let mut data = KernelReplayData::new(KernelDispatchInfo::default());
        data.outcome = ReplayOutcomeKind::PASS_FAILED;
        data.passes_run = 3;
        note_end(&data);
        let taken = take();
        assert_eq!(taken.incomplete.len(), 1, "{:?}", taken.incomplete);
        assert!(
            taken.incomplete[0].contains("2 of 3 counter group(s) counted"),
            "{:?}",
            taken.incomplete
        );
    }
}
