//! A launch's way through the injected library: its state between API ENTER and EXIT, the
//! operations its replay window runs ([`LaunchOps`]), and what its snapshot covers.

use super::*;

/// A launch between its API ENTER and EXIT on this thread.
struct Pending {
    window: Window,
    launch: Launch,
    /// The launch's context's state, found at ENTER (`None`: it could not be made, and the
    /// launch was declined).
    device: Option<Arc<DeviceState>>,
    tool: Box<dyn ReplayTool>,
    /// The launch's events while dispatch tracing is configured.
    timer: Option<PassTimer>,
    /// No tool decides launches: the window only times the launch for dispatch tracing (it
    /// runs once and is not accounted as a replay decision).
    trace_only: bool,
    /// The reader sides a launch whose device could not be told holds beside its window's
    /// (see [`fence::launch_readers`]).
    readers: Vec<kreplay_locks::OwnedReadAccess>,
}

/// A launch's operations as the injected library runs them: the driver's, plus the check
/// that no live memory escapes the snapshot.
struct InjectedLaunch<'a> {
    inner: CudaLaunch<'a>,
    watch: &'a MemoryWatch,
    graphs: &'a GraphMemory,
    /// At API ENTER: what the launch's snapshot covers (see [`Backend::launch_scope`]).
    scope: Option<LaunchScope<'a>>,
    captures: &'a Captures,
    /// Set while dispatch tracing is configured: the launch's passes are timed and reported.
    traced: Option<(&'a PassTimer, &'a dyn Tools)>,
    /// At API ENTER: the launch's device, for the tool's work inside its window.
    device: Option<&'a Arc<DeviceState>>,
}

impl LaunchOps for InjectedLaunch<'_> {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn covered(&self) -> Result<(), String> {
        self.watch
            .untracked_reason(self.inner.launch.ctx as usize)
            .or_else(|| self.graphs.untracked_reason())
            .map_or(Ok(()), Err)
    }
    fn scope(&self, base: &Filter) -> Result<Filter, String> {
        match &self.scope {
            Some(s) => s
                .backend
                .launch_scope(&self.inner.launch, s.device, s.kernel, base),
            None => Ok(base.clone()),
        }
    }
    fn kernel_key(&self, kernel_id: u64) -> u64 {
        match &self.scope {
            Some(s) => s.backend.modules.kernel_key(kernel_id as usize),
            None => kernel_id,
        }
    }
    /// `auto`'s choice for this launch ([`Backend::choose_detection`]), applied to the
    /// device's shared detection setting here, where the window holds the device's writer
    /// side: a launch of another thread choosing for the same device meanwhile cannot change
    /// it between this snapshot and this launch's last restore.
    fn snapshot_strategy(&self) -> Option<RestoreStrategy> {
        let (_, on) = CHOSEN.with(std::cell::Cell::get)?;
        if let Some(s) = &self.scope {
            s.device.memory.set_hash_on_device(on);
        }
        chosen_strategy(on)
    }
    fn drainable(&self) -> Result<(), String> {
        self.captures
            .check_drainable(self.inner.launch.device as u64)
    }
    fn drain_timeout(&self) -> Option<Duration> {
        self.inner.drainer.map(Drainer::timeout)
    }
    fn watchdog(&self) -> Option<&Watchdog> {
        BACKEND.get().map(|b| &b.watchdog)
    }
    fn linked_devices(&self) -> Option<Vec<u64>> {
        let s = self.scope.as_ref()?;
        Some(s.backend.peers.group(s.device.ordinal as u64))
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()?;
        let (Some(drainer), Some(s)) = (self.inner.drainer, &self.scope) else {
            return Ok(());
        };
        // The group as it is now, its writer sides held (see `linked_devices`). The drain
        // thread synchronises every context seen on the device of the one named.
        s.backend
            .peer_contexts(s.device.ordinal)
            .iter()
            .try_for_each(|&ctx| drainer.drain(ctx))
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
    fn mark(&self, at: Mark) {
        if let Some((timer, _)) = self.traced {
            let marked = match at {
                Mark::Before => timer.mark_start(),
                Mark::After => timer.mark_end(),
            };
            if let Err(e) = marked {
                log(LogLevel::Warn, format!("dispatch timing: {e}"));
            }
        }
    }
    fn enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Enqueued> {
        self.traced
            .and_then(|(_, tools)| tools.dispatch_enqueue(info, pass))
    }
    fn tool_work(&self) -> Option<Box<dyn ToolWorkIo>> {
        let device = self.device?.clone();
        Some(Box::new(DeviceWork {
            device,
            ctx: self.inner.launch.ctx as usize,
        }))
    }
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        if let Some((timer, tools)) = self.traced {
            let (start_ns, end_ns) = timer.times().unwrap_or_else(|e| {
                log(LogLevel::Warn, format!("dispatch timing: {e}"));
                (0, 0)
            });
            tools.dispatch_completed(&DispatchRecord {
                info: *info,
                pass,
                start_ns,
                end_ns,
            });
        }
    }
}

/// What [`Backend::launch_scope`] needs beside the launch.
struct LaunchScope<'a> {
    backend: &'a Backend,
    device: &'a DeviceState,
    kernel: Option<&'a str>,
}

/// The launched function's module and variables, from the driver.
struct DriverModules<'a> {
    driver: &'a Driver,
    function: CuFunction,
}

impl ModuleLookup for DriverModules<'_> {
    fn module(&self) -> Result<u64, String> {
        // SAFETY: the function the application is launching, inside its launch call.
        unsafe { self.driver.function_module(self.function) }.map(|m| m as u64)
    }
    fn global(&self, module: u64, name: &str) -> Option<Range> {
        // SAFETY: the module the driver named for the launched function, loaded while it is
        // being launched.
        unsafe { self.driver.module_global(module as CuModule, name) }
    }
    fn load(&self) {
        if let Some(load) = self.driver.optional.func_load {
            // SAFETY: the function the application is launching; loading it (and its module)
            // is what the launch would do anyway.
            let _ = unsafe { load(self.function) };
        }
        let _ = self.module();
    }
}

/// A launch without a window between its API ENTER and EXIT, and the reader sides it holds.
struct Unwindowed {
    launch: Launch,
    readers: Vec<kreplay_locks::OwnedReadAccess>,
}

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    /// The reader sides a launch without a window holds from its API ENTER to its EXIT.
    static UNWINDOWED: RefCell<Option<Unwindowed>> = const { RefCell::new(None) };
    /// [`PENDING`] and [`UNWINDOWED`] once they are destroyed: a launch from a thread-local
    /// destructor at thread exit (see `kreplay_late`).
    static PENDING_LATE: Late<Option<Pending>> = const { Late::new() };
    static UNWINDOWED_LATE: Late<Option<Unwindowed>> = const { Late::new() };
    /// `auto`'s choice for the launch this thread is replaying: its key and whether detection
    /// runs on the device, made when the window asks for the launch's scope (see `launch_scope`).
    static CHOSEN: std::cell::Cell<Option<(ChoiceKey, bool)>> = const { std::cell::Cell::new(None) };
}

impl Backend {
    /// The snapshot filter of `launch` (see [`crate::scope`]): its module's writable variables,
    /// what its arguments point into, from the device's filter `base` (agent scope) or from
    /// nothing (referenced scope).
    fn launch_scope(
        &self,
        launch: &Launch,
        device: &DeviceState,
        kernel: Option<&str>,
        base: &Filter,
    ) -> Result<Filter, String> {
        let lookup = DriverModules {
            driver: self.driver,
            function: launch.function,
        };
        let variables = self.modules.variables_of(
            launch.ctx as usize,
            launch.function as usize,
            kernel,
            &lookup,
        )?;
        // After the variables: finding them loads the module when it is loaded lazily, and
        // with it the cubin that says which device-runtime functions the kernel calls.
        if let Some(kernel) = kernel {
            let calls = self.modules.runtime_calls(kernel);
            device
                .runtime
                .check(kernel, &calls, self.config.device_heap)?;
        }
        let referenced = self.config.snapshot.scope == SnapshotScope::Referenced;
        let (start, values, narrowed) = match self.launch_argument_values(launch) {
            Ok(values) if referenced => {
                (Filter::referenced_only(device.ordinal as u64), values, true)
            }
            Ok(values) => (base.clone(), values, false),
            Err(why) => {
                if referenced && !self.warned_layout.swap(true, Ordering::Relaxed) {
                    let why = match why {
                        ArgumentsUnknown::NoLayout => {
                            "the driver cannot describe a kernel's parameters (cuFuncGetParamInfo, \
                             CUDA 12.4)"
                                .to_string()
                        }
                        ArgumentsUnknown::BadExtra(e) => format!("a launch's extra array: {e}"),
                    };
                    log(
                        LogLevel::Warn,
                        format!(
                            "KREPLAY_SNAPSHOT_SCOPE=referenced: {why}; such launches snapshot \
                             the agent scope"
                        ),
                    );
                }
                (base.clone(), Vec::new(), false)
            }
        };
        // A graph allocation with no memory behind it is known to kreplay but never in the
        // inventory: an argument pointing into it declines the launch before any copy.
        let scoped = launch_filter(start, &self.inventory, &variables, &values, |v, end| {
            self.graphs
                .argument_reason(v)
                .or_else(|| self.untracked_memory_kind(v, device.pageable, end))
        })?;
        if self.config.snapshot.strategy == RestoreStrategy::Auto {
            // Chosen here, once per replayed launch (the window asks for the scope only of a
            // launch it replays, before the snapshot): the referenced footprint when narrowed,
            // else the device's tracked allocations.
            let footprint = if narrowed {
                scoped.referenced_bytes + scoped.variable_bytes
            } else {
                self.inventory.select(base).iter().map(|r| r.size).sum()
            };
            let key = self.modules.kernel_key(launch.function as usize);
            self.choose_detection(device, key as usize, footprint);
        }
        Ok(scoped.filter)
    }

    /// The argument values of `launch`, read with the driver's description of the launched
    /// function's parameters (asked once per function), and, under
    /// `KREPLAY_SNAPSHOT_SCOPE=referenced`, the bases of the mappings that continue a mapping
    /// one of them points into ([`MemoryWatch::mapped_runs`]; the agent scope holds every
    /// mapping of the device already, and walking a long run at every launch would cost for
    /// nothing).
    pub(super) fn launch_argument_values(
        &self,
        launch: &Launch,
    ) -> Result<Vec<u64>, ArgumentsUnknown> {
        let layout = if launch.params.is_null() {
            None
        } else {
            self.layout(launch.function)
        };
        // SAFETY: the launch call's own parameters, read during its API ENTER callback; the
        // layout is the driver's description of the launched function.
        let mut values =
            unsafe { argument_values(launch.params, launch.extra, layout.as_deref()) }?;
        if self.config.snapshot.scope == SnapshotScope::Referenced {
            // A pointer into a range mapped page by page reaches the pages that continue it.
            let continued = self.watch.mapped_runs(&values);
            values.extend(continued);
        }
        Ok(values)
    }

    /// `auto`: offer the device kernels to the snapshot of a launch of `function` (its kernel
    /// key, [`ModuleRegistry::kernel_key`]) over `footprint` bytes or not, as the device's
    /// measured choice says, and remember the choice for the snapshot (which applies it to the
    /// device, see `InjectedLaunch::snapshot_strategy`) and for [`Self::learn_choice`]. The kernels are
    /// loaded here when chosen, so that their loading is not counted in the first snapshot that
    /// uses them.
    fn choose_detection(&self, device: &DeviceState, function: usize, footprint: u64) {
        let key = ChoiceKey::new(function, footprint);
        let on = detection_for(
            &device.choice.lock(),
            key,
            footprint,
            self.config.auto_measured,
        );
        if on {
            device.memory.load_kernels();
        }
        // Applied to the device under its writer lock (`snapshot_strategy`), not here.
        CHOSEN.with(|c| c.set(Some((key, on))));
    }

    /// Record what the launch just replayed on `device` cost per restore under the choice
    /// [`Self::choose_detection`] made for it.
    fn learn_choice(&self, device: &DeviceState, record: &ReplayRecord) {
        let Some((key, on)) = CHOSEN.with(std::cell::Cell::take) else {
            return;
        };
        if !matches!(record.outcome, ReplayOutcome::Replayed { .. }) {
            return;
        }
        let c = &record.cost;
        let restore: Duration = c.restore_times.iter().sum();
        let Some(ns) = per_restore_ns(
            c.snapshot.as_nanos() as u64,
            restore.as_nanos() as u64,
            c.restore_times.len(),
        ) else {
            return;
        };
        device.choice.lock().record(key, on, ns);
        let counter = if on {
            &self.stats.auto_device
        } else {
            &self.stats.auto_full
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The parameter layout of `f`, asked of the driver once per function.
    fn layout(&self, f: CuFunction) -> Option<Arc<[Param]>> {
        if let Some(known) = self.layouts.lock().get(&(f as usize)) {
            return known.clone();
        }
        // SAFETY: the function the application is launching, inside its launch call.
        let layout: Option<Arc<[Param]>> = unsafe { self.driver.param_layout(f) }.map(Into::into);
        self.layouts.lock().insert(f as usize, layout.clone());
        layout
    }

    /// What the driver knows `addr` to be, when it is memory kreplay does not track and a
    /// kernel of a device with pageable memory access `pageable` may write (see
    /// [`untracked_at`]; `end`: an end pointer).
    fn untracked_memory_kind(&self, addr: u64, pageable: bool, end: bool) -> Option<String> {
        let kind = self.driver.memory_type(addr)?;
        let start = self.driver.range_start(addr);
        let tracked = start.is_some_and(|s| self.inventory.get(s).is_some());
        untracked_at(addr, end, kind, start, tracked, pageable).map(str::to_owned)
    }

    pub(super) fn launch_enter(&self, launch: Launch, kernel: Option<&str>) {
        CHOSEN.with(|c| c.set(None));
        self.stats.launches.fetch_add(1, Ordering::Relaxed);
        let traced = self.tools.dispatch_tracing_configured();
        let (mut tool, trace_only) = match self.tools.replay_tool() {
            Some(tool) => (tool, false),
            // Not replayed, but timed and reported: a window of one pass.
            None if traced => (Box::new(FixedPasses::new(1)) as Box<dyn ReplayTool>, true),
            None => return self.ordinary_without_window(&launch),
        };
        // Without the device's state nothing a replay needs is there: the tool is still asked,
        // and a replay it wants is declined with the cause (`Window::enter_unprepared`).
        let state = if launch.device == UNKNOWN_DEVICE {
            Err("cannot tell the launch's device (cuCtxGetDevice failed)".to_owned())
        } else {
            self.device(launch.ctx)
        };
        let (device, unprepared) = match state {
            Ok(d) => (Some(d), None),
            Err(e) => {
                log(
                    LogLevel::Warn,
                    format!("launch not replayed (declined as snapshot_failed): {e}"),
                );
                (None, Some(e))
            }
        };
        let cuda_launch = CudaLaunch {
            driver: self.driver,
            launch,
            drainer: device.as_ref().map(|d| &d.drainer),
        };
        // A launch on a stream being captured into a graph does not run now (it is declined and
        // no record is due); an event recorded there would become a node of the graph.
        let timer = if traced && cuda_launch.replayable().is_ok() {
            PassTimer::new(self.driver, launch.effective_stream())
                .map_err(|e| log(LogLevel::Warn, format!("dispatch timing: {e}")))
                .ok()
        } else {
            None
        };
        // The devices whose kernels may write this device's memory, or whose memory its kernels
        // may write (peer access): a replay locks and drains them all (the window asks again
        // once it holds them, see `linked_devices`).
        let group = device
            .as_ref()
            .map(|d| self.peers.group(d.ordinal as u64))
            .unwrap_or_default();
        let ops = InjectedLaunch {
            inner: cuda_launch,
            watch: &self.watch,
            graphs: &self.graphs,
            scope: device.as_deref().map(|device| LaunchScope {
                backend: self,
                device,
                kernel,
            }),
            captures: &self.captures,
            traced: timer.as_ref().map(|t| (t, &*self.tools)),
            device: device.as_ref(),
        };
        let id = self.next_dispatch.fetch_add(1, Ordering::Relaxed);
        let info = launch.dispatch_info(id, |a| ops.inner.attribute(a));
        let window = match (&device, &unprepared) {
            (Some(device), _) => {
                debug_assert_eq!(info.agent_id, device.ordinal as u64);
                let cx = WindowContext {
                    locks: &self.locks,
                    snapshotter: &device.snapshotter,
                    filter: &device.filter,
                    registry: self.tools.contexts(),
                    group: &group,
                };
                Window::enter(cx, &mut *tool, info, &ops)
            }
            (None, why) => Window::enter_unprepared(
                &self.locks,
                &mut *tool,
                info,
                &ops,
                why.as_deref().unwrap_or("unknown"),
            ),
        };
        // A launch of unknown device may run on any device: it waits for their windows, and
        // they for it (after its tool's CONFIG ENTER, as a window's own locks are taken).
        let readers = if launch.device == UNKNOWN_DEVICE {
            fence::launch_readers(&self.locks, None, &self.known_devices())
        } else {
            Vec::new()
        };
        kreplay_late::with(&PENDING, &PENDING_LATE, |p| {
            *p.borrow_mut() = Some(Pending {
                window,
                launch,
                device: device.clone(),
                tool,
                timer,
                trace_only,
                readers,
            })
        });
    }

    /// A launch that gets no window still runs as an ordinary one: it holds the reader side of
    /// its device until its API EXIT, so it is not submitted inside a replay window another
    /// thread holds there (whose restores would undo what it writes). A launch whose device
    /// could not be told holds every known device's (see
    /// [`fence::launch_readers`]).
    fn ordinary_without_window(&self, launch: &Launch) {
        let device = (launch.device != UNKNOWN_DEVICE).then_some(launch.device as u64);
        let readers = fence::launch_readers(&self.locks, device, &self.known_devices());
        let unwindowed = Unwindowed {
            launch: *launch,
            readers,
        };
        kreplay_late::with(&UNWINDOWED, &UNWINDOWED_LATE, |u| {
            *u.borrow_mut() = Some(unwindowed)
        });
    }

    /// The API EXIT of a launch whose device could not be told, before it gives back the reader
    /// sides of every known device: no window's drain would wait for its kernel (its context
    /// is no device's), so it is waited for here, on the drain thread and at most the drain
    /// timeout (a kernel may wait for a later launch, see [`crate::drainer`]); not when no
    /// replay can happen, when the launch failed, or while a stream is being captured anywhere
    /// (a synchronisation would end the capture; the launch itself, if captured, runs nothing).
    fn settle_unknown_device(&self, launch: Launch, result: CuResult) {
        if launch.device != UNKNOWN_DEVICE
            || result != CUDA_SUCCESS
            || !self.locks.is_enabled()
            || self.captures.any()
        {
            return;
        }
        if let Err(e) = self.unknown_drainer.drain(launch.ctx as usize) {
            log(
                LogLevel::Warn,
                format!(
                    "a launch whose device cannot be told was not waited for ({e}): a replay \
                     window on its device may open while it runs"
                ),
            );
        }
    }

    pub(super) fn launch_exit(&self, result: CuResult, symbol: Option<&CStr>) {
        if let Some(Unwindowed { launch, readers }) =
            kreplay_late::with(&UNWINDOWED, &UNWINDOWED_LATE, |u| u.borrow_mut().take())
        {
            self.settle_unknown_device(launch, result);
            drop(readers);
        }
        let Some(Pending {
            window,
            launch,
            device,
            mut tool,
            timer,
            trace_only,
            readers,
        }) = kreplay_late::with(&PENDING, &PENDING_LATE, |p| p.borrow_mut().take())
        else {
            return;
        };
        self.settle_unknown_device(launch, result);
        drop(readers);
        let ops = InjectedLaunch {
            inner: CudaLaunch {
                driver: self.driver,
                launch,
                // The drain comes before the snapshot, at ENTER; nothing drains at EXIT.
                drainer: None,
            },
            watch: &self.watch,
            graphs: &self.graphs,
            scope: None,
            captures: &self.captures,
            traced: timer.as_ref().map(|t| (t, &*self.tools)),
            device: None,
        };
        let launched = self
            .driver
            .check("kernel launch", result)
            .map_err(|e| e.to_string());
        let record = window.exit(&mut *tool, self.tools.contexts(), &ops, launched);
        if let (ReplayOutcome::RanOnce { .. }, Some(kernel)) = (&record.outcome, symbol) {
            // A kernel that ran once without its scope being asked for (one pass) may still
            // have used the device heap: later launches on its context must know.
            if let Some(device) = &device {
                let kernel = kernel.to_string_lossy();
                device
                    .runtime
                    .note(&kernel, &self.modules.runtime_calls(&kernel));
            }
        }
        if trace_only {
            return;
        }
        if let Some(device) = &device {
            self.learn_choice(device, &record);
        }
        let name = symbol.map_or(std::borrow::Cow::Borrowed("?"), CStr::to_string_lossy);
        self.account(&record, &name);
        self.tools.replay_finished(&record, &name);
    }

    fn account(&self, record: &ReplayRecord, name: &str) {
        let s = &self.stats;
        let c = &record.cost;
        s.passes.fetch_add(c.passes_run, Ordering::Relaxed);
        s.bytes_snapshotted
            .fetch_add(c.bytes_snapshotted, Ordering::Relaxed);
        s.bytes_restored
            .fetch_add(c.bytes_restored, Ordering::Relaxed);
        s.snapshot_ns
            .fetch_add(c.snapshot.as_nanos() as u64, Ordering::Relaxed);
        let restore: Duration = c.restore_times.iter().sum();
        s.restore_ns
            .fetch_add(restore.as_nanos() as u64, Ordering::Relaxed);
        s.restores
            .fetch_add(c.restore_times.len() as u64, Ordering::Relaxed);
        let relaunch: Duration = c.pass_times.iter().skip(1).sum();
        s.relaunch_ns
            .fetch_add(relaunch.as_nanos() as u64, Ordering::Relaxed);
        s.drain_ns
            .fetch_add(c.drain.as_nanos() as u64, Ordering::Relaxed);
        s.replay_ns
            .fetch_add(c.total.as_nanos() as u64, Ordering::Relaxed);
        match &record.outcome {
            ReplayOutcome::Replayed { passes, .. } => {
                s.replayed.fetch_add(1, Ordering::Relaxed);
                log(
                    LogLevel::Info,
                    format!(
                        "replayed {name} x{passes}: snapshot {} B in {:?}, restores {} B in {:?}",
                        c.bytes_snapshotted, c.snapshot, c.bytes_restored, restore
                    ),
                );
            }
            ReplayOutcome::RanOnce { .. } => {
                if let Some(d) = record.outcome.decline() {
                    *s.declines
                        .lock()
                        .entry(d.reason.as_str().to_owned())
                        .or_default() += 1;
                    log(LogLevel::Info, format!("{name} ran once: {d}"));
                }
            }
            ReplayOutcome::PassFailed { .. } | ReplayOutcome::RestoreFailed { .. } => {
                s.failed.fetch_add(1, Ordering::Relaxed);
                let why = record.diagnostic().unwrap_or_default();
                log(LogLevel::Warn, format!("replay of {name} failed: {why}"));
            }
        }
    }
}
