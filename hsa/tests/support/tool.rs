//! A test tool: [`ToolHooks`] whose replay answers come from a per-scenario [`Script`], that
//! records every replay callback as an [`Event`], and that keeps dispatch records only for the
//! tracing contexts active at delivery (as the C ABI layer does).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use kreplay_ctxmask::{ContextId, ContextRegistry};
use kreplay_hsa::{DispatchRecord, ToolHooks};
use kreplay_passloop::{
    ContinueChange, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome, ReplayRecord, ReplayTool,
    RestoreRequest, ToolAnswer,
};
use parking_lot::{Condvar, Mutex, RwLock};

use super::app::WAIT;

/// One replay callback as the tool saw it. `token` is the per-dispatch tool state handed out at
/// CONFIG ENTER (the C ABI's `user_data`): every later callback of the dispatch reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    ConfigEnter {
        token: u64,
        info: DispatchInfo,
    },
    PassEnter {
        token: u64,
        dispatch: u64,
        pass: u64,
        total: u64,
    },
    PassExit {
        token: u64,
        dispatch: u64,
        pass: u64,
        total: u64,
    },
    Continue {
        token: u64,
        dispatch: u64,
        pass: u64,
        total: u64,
        answer: bool,
    },
    Snapshot {
        token: u64,
        dispatch: u64,
        phase: Phase,
        report: MemoryOpReport,
    },
    Restore {
        token: u64,
        dispatch: u64,
        phase: Phase,
        request: RestoreRequest,
        report: MemoryOpReport,
    },
    ConfigExit {
        token: u64,
        dispatch: u64,
        outcome: ReplayOutcome,
    },
}

impl Event {
    /// The dispatch this event belongs to.
    pub fn dispatch(&self) -> u64 {
        match self {
            Event::ConfigEnter { info, .. } => info.dispatch_id,
            Event::PassEnter { dispatch, .. }
            | Event::PassExit { dispatch, .. }
            | Event::Continue { dispatch, .. }
            | Event::Snapshot { dispatch, .. }
            | Event::Restore { dispatch, .. }
            | Event::ConfigExit { dispatch, .. } => *dispatch,
        }
    }

    /// The tool state the event was delivered with.
    pub fn token(&self) -> u64 {
        match self {
            Event::ConfigEnter { token, .. }
            | Event::PassEnter { token, .. }
            | Event::PassExit { token, .. }
            | Event::Continue { token, .. }
            | Event::Snapshot { token, .. }
            | Event::Restore { token, .. }
            | Event::ConfigExit { token, .. } => *token,
        }
    }

    /// A short name with the pass, for comparing callback sequences.
    pub fn label(&self) -> String {
        match self {
            Event::ConfigEnter { .. } => "config-enter".into(),
            Event::PassEnter { pass, .. } => format!("pass-enter-{pass}"),
            Event::PassExit { pass, .. } => format!("pass-exit-{pass}"),
            Event::Continue { pass, answer, .. } => format!("continue-{pass}-{answer}"),
            Event::Snapshot { phase, .. } => format!("snapshot-{}", phase_name(*phase)),
            Event::Restore { phase, request, .. } => {
                format!("restore-{}-{}", phase_name(*phase), request.next_pass)
            }
            Event::ConfigExit { .. } => "config-exit".into(),
        }
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Enter => "enter",
        Phase::Exit => "exit",
    }
}

type AnswerFn = dyn Fn(&TestHooks, &DispatchInfo) -> ToolAnswer + Send + Sync;
type PassFn = dyn Fn(&TestHooks, &DispatchInfo, u64, u64) + Send + Sync;
type PassExitFn = dyn Fn(&TestHooks, &DispatchInfo, u64, u64) -> ContinueChange + Send + Sync;
type ContinueFn = dyn Fn(&TestHooks, &DispatchInfo, u64, u64) -> bool + Send + Sync;
type SnapshotFn = dyn Fn(&TestHooks, &DispatchInfo, Phase) + Send + Sync;

/// What the tool does for each dispatch of one scenario.
pub struct Script {
    answer: Box<AnswerFn>,
    pass_enter: Option<Box<PassFn>>,
    pass_exit: Option<Box<PassExitFn>>,
    should_continue: Option<Box<ContinueFn>>,
    snapshot: Option<Box<SnapshotFn>>,
}

impl Script {
    /// Answers every CONFIG ENTER with `answer`.
    pub fn new(
        answer: impl Fn(&TestHooks, &DispatchInfo) -> ToolAnswer + Send + Sync + 'static,
    ) -> Script {
        Script {
            answer: Box::new(answer),
            pass_enter: None,
            pass_exit: None,
            should_continue: None,
            snapshot: None,
        }
    }

    /// The same number of passes for every dispatch.
    pub fn passes(n: u64) -> Script {
        Script::new(move |_, _| ToolAnswer::passes(n))
    }

    /// Runs `f` at PASS ENTER (the context toggles are armed while it runs).
    pub fn on_pass_enter(
        mut self,
        f: impl Fn(&TestHooks, &DispatchInfo, u64, u64) + Send + Sync + 'static,
    ) -> Script {
        self.pass_enter = Some(Box::new(f));
        self
    }

    /// Runs `f` at PASS EXIT.
    pub fn on_pass_exit(
        mut self,
        f: impl Fn(&TestHooks, &DispatchInfo, u64, u64) -> ContinueChange + Send + Sync + 'static,
    ) -> Script {
        self.pass_exit = Some(Box::new(f));
        self
    }

    /// Runs `f` at SNAPSHOT ENTER and EXIT.
    pub fn on_snapshot(
        mut self,
        f: impl Fn(&TestHooks, &DispatchInfo, Phase) + Send + Sync + 'static,
    ) -> Script {
        self.snapshot = Some(Box::new(f));
        self
    }

    /// The continue callback.
    pub fn on_continue(
        mut self,
        f: impl Fn(&TestHooks, &DispatchInfo, u64, u64) -> bool + Send + Sync + 'static,
    ) -> Script {
        self.should_continue = Some(Box::new(f));
        self
    }
}

/// The test tool.
pub struct TestHooks {
    replay: AtomicBool,
    registry: ContextRegistry,
    /// Contexts with a dispatch tracing service, all started globally.
    pub tracing: Vec<ContextId>,
    script: RwLock<Arc<Script>>,
    next_token: AtomicU64,
    events: Mutex<Vec<Event>>,
    records: Mutex<Vec<(ContextId, DispatchRecord)>>,
    finished: Mutex<Vec<ReplayRecord>>,
    finished_changed: Condvar,
    warnings: Mutex<Vec<String>>,
    warned_keys: Mutex<Vec<&'static str>>,
}

impl TestHooks {
    /// A tool with `tracing_contexts` started contexts that trace dispatches; replay is not
    /// configured until [`configure_replay`](Self::configure_replay), and every dispatch runs
    /// once until a script says otherwise.
    pub fn new(tracing_contexts: usize) -> Arc<TestHooks> {
        let registry = ContextRegistry::new();
        let tracing: Vec<ContextId> = (0..tracing_contexts).map(|_| registry.create()).collect();
        for &ctx in &tracing {
            registry.start(ctx).expect("a context of this registry");
        }
        Arc::new(TestHooks {
            replay: AtomicBool::new(false),
            registry,
            tracing,
            script: RwLock::new(Arc::new(Script::passes(1))),
            next_token: AtomicU64::new(1),
            events: Mutex::new(Vec::new()),
            records: Mutex::new(Vec::new()),
            finished: Mutex::new(Vec::new()),
            finished_changed: Condvar::new(),
            warnings: Mutex::new(Vec::new()),
            warned_keys: Mutex::new(Vec::new()),
        })
    }

    /// Configures the KERNEL_REPLAY service (as a tool does once its initialization runs,
    /// which may be after the backend was installed).
    pub fn configure_replay(&self, on: bool) {
        self.replay.store(on, Ordering::Release);
    }

    /// Replaces the script used from the next dispatch on.
    pub fn set_script(&self, script: Script) {
        *self.script.write() = Arc::new(script);
    }

    /// The context registry.
    pub fn registry(&self) -> &ContextRegistry {
        &self.registry
    }

    /// Every replay callback so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// The replay callbacks of one dispatch.
    pub fn events_of(&self, dispatch: u64) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.dispatch() == dispatch)
            .collect()
    }

    /// Labels of the replay callbacks of one dispatch, in order.
    pub fn labels_of(&self, dispatch: u64) -> Vec<String> {
        self.events_of(dispatch).iter().map(Event::label).collect()
    }

    /// Dispatch records kept so far, with the context each was kept for.
    pub fn records(&self) -> Vec<(ContextId, DispatchRecord)> {
        self.records.lock().clone()
    }

    /// Warnings so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().clone()
    }

    /// Keys of `warn_once` calls so far.
    pub fn warned_keys(&self) -> Vec<&'static str> {
        self.warned_keys.lock().clone()
    }

    /// The loop record of one dispatch (waiting at most [`WAIT`] for it: the application's
    /// completion fires before the loop's record is delivered).
    pub fn finished_record(&self, dispatch: u64) -> ReplayRecord {
        let deadline = Instant::now() + WAIT;
        let mut finished = self.finished.lock();
        loop {
            if let Some(record) = finished.iter().find(|r| r.info.dispatch_id == dispatch) {
                return record.clone();
            }
            if self
                .finished_changed
                .wait_until(&mut finished, deadline)
                .timed_out()
            {
                panic!("dispatch {dispatch} never finished the replay loop");
            }
        }
    }

    /// The dispatch ids of CONFIG ENTER events, in order.
    pub fn configured_dispatches(&self) -> Vec<DispatchInfo> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::ConfigEnter { info, .. } => Some(info),
                _ => None,
            })
            .collect()
    }

    fn push(&self, event: Event) {
        self.events.lock().push(event);
    }
}

impl ToolHooks for TestHooks {
    fn replay_configured(&self) -> bool {
        self.replay.load(Ordering::Acquire)
    }

    fn dispatch_tracing_configured(&self) -> bool {
        !self.tracing.is_empty()
    }

    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        Box::new(Adapter {
            hooks: self,
            script: self.script.read().clone(),
            token: 0,
        })
    }

    fn contexts(&self) -> &ContextRegistry {
        &self.registry
    }

    fn dispatch_completed(&self, record: &DispatchRecord) {
        let kept: Vec<_> = self
            .tracing
            .iter()
            .filter(|&&c| self.registry.is_active(c))
            .map(|&c| (c, *record))
            .collect();
        self.records.lock().extend(kept);
    }

    fn replay_finished(&self, record: &ReplayRecord) {
        self.finished.lock().push(record.clone());
        self.finished_changed.notify_all();
    }

    fn warn(&self, message: &str) {
        eprintln!("kreplay warning: {message}");
        self.warnings.lock().push(message.to_owned());
    }

    fn warn_once(&self, key: &'static str, message: &str) {
        eprintln!("kreplay warning ({key}): {message}");
        self.warned_keys.lock().push(key);
    }
}

/// The per-dispatch tool state: one adapter per dispatch, holding its token.
struct Adapter<'a> {
    hooks: &'a TestHooks,
    script: Arc<Script>,
    token: u64,
}

impl ReplayTool for Adapter<'_> {
    fn config_enter(&mut self, info: &DispatchInfo) -> ToolAnswer {
        self.token = self.hooks.next_token.fetch_add(1, Ordering::Relaxed);
        self.hooks.push(Event::ConfigEnter {
            token: self.token,
            info: *info,
        });
        (self.script.answer)(self.hooks, info)
    }

    fn pass_enter(&mut self, info: &DispatchInfo, pass: u64, total: u64) {
        self.hooks.push(Event::PassEnter {
            token: self.token,
            dispatch: info.dispatch_id,
            pass,
            total,
        });
        if let Some(f) = &self.script.pass_enter {
            f(self.hooks, info, pass, total);
        }
    }

    fn pass_exit(&mut self, info: &DispatchInfo, pass: u64, total: u64) -> ContinueChange {
        self.hooks.push(Event::PassExit {
            token: self.token,
            dispatch: info.dispatch_id,
            pass,
            total,
        });
        self.script
            .pass_exit
            .as_ref()
            .map_or(ContinueChange::Keep, |f| f(self.hooks, info, pass, total))
    }

    fn should_continue(&mut self, info: &DispatchInfo, pass: u64, total: u64) -> bool {
        let answer = self
            .script
            .should_continue
            .as_ref()
            .is_none_or(|f| f(self.hooks, info, pass, total));
        self.hooks.push(Event::Continue {
            token: self.token,
            dispatch: info.dispatch_id,
            pass,
            total,
            answer,
        });
        answer
    }

    fn snapshot(&mut self, info: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        self.hooks.push(Event::Snapshot {
            token: self.token,
            dispatch: info.dispatch_id,
            phase,
            report: *report,
        });
        if let Some(f) = &self.script.snapshot {
            f(self.hooks, info, phase);
        }
    }

    fn restore(
        &mut self,
        info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    ) {
        self.hooks.push(Event::Restore {
            token: self.token,
            dispatch: info.dispatch_id,
            phase,
            request: *request,
            report: *report,
        });
    }

    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome) {
        self.hooks.push(Event::ConfigExit {
            token: self.token,
            dispatch: info.dispatch_id,
            outcome: outcome.clone(),
        });
    }
}

/// What a test changes of [`TestHooks`] behind [`Wrapped`]: the tool layer's KERNEL_DISPATCH
/// ENQUEUE (where [`TestHooks`] just submits) and COMPLETE (by default the wrapped
/// [`TestHooks`]' own).
#[allow(dead_code)] // for the scenario files whose tool layer does more than TestHooks
pub trait Wrap: Send + Sync + 'static {
    /// [`ToolHooks::dispatch_enqueue`]: `submit` writes the packets to the hardware queue.
    fn dispatch_enqueue(&self, submit: &mut dyn FnMut()) {
        submit()
    }

    /// [`ToolHooks::dispatch_completed`].
    fn dispatch_completed(&self, inner: &TestHooks, record: &DispatchRecord) {
        inner.dispatch_completed(record)
    }
}

/// [`TestHooks`] (`inner`) with its ENQUEUE and COMPLETE as `wrap` changes them; everything
/// else is `inner`'s.
#[allow(dead_code)] // for the scenario files whose tool layer does more than TestHooks
pub struct Wrapped<W> {
    pub inner: Arc<TestHooks>,
    pub wrap: W,
}

#[allow(dead_code)] // for the scenario files whose tool layer does more than TestHooks
impl<W: Wrap> Wrapped<W> {
    /// A new [`TestHooks`] with `tracing_contexts` tracing contexts, wrapped by `wrap`.
    pub fn new(tracing_contexts: usize, wrap: W) -> Arc<Self> {
        Arc::new(Wrapped {
            inner: TestHooks::new(tracing_contexts),
            wrap,
        })
    }
}

impl<W: Wrap> ToolHooks for Wrapped<W> {
    fn replay_configured(&self) -> bool {
        self.inner.replay_configured()
    }
    fn dispatch_tracing_configured(&self) -> bool {
        self.inner.dispatch_tracing_configured()
    }
    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        self.inner.replay_tool()
    }
    fn contexts(&self) -> &ContextRegistry {
        self.inner.contexts()
    }
    fn dispatch_completed(&self, record: &DispatchRecord) {
        self.wrap.dispatch_completed(&self.inner, record)
    }
    fn dispatch_enqueue(&self, _: &[DispatchInfo], _: Option<u64>, submit: &mut dyn FnMut()) {
        self.wrap.dispatch_enqueue(submit)
    }
    fn replay_finished(&self, record: &ReplayRecord) {
        self.inner.replay_finished(record)
    }
    fn warn(&self, message: &str) {
        self.inner.warn(message)
    }
    fn warn_once(&self, key: &'static str, message: &str) {
        self.inner.warn_once(key, message)
    }
}
