//! Tool discovery and lifecycle: `kreplay_force_configure` tools written in Rust, and C tool
//! libraries listed in KREPLAY_TOOL_LIBRARIES.

mod common;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::Mutex;

use kreplay::abi::{
    CallbackKind, CallbackRecord, ClientFinalizeFn, ClientId, ContextHandle, Status,
    ToolConfigureResult, UserData, VERSION,
};
use kreplay::api::*;
use kreplay::lifecycle::{self, LifecycleError, ToolOrigin, ToolSearch, ToolState};
use kreplay::services;
use kreplay_ctxmask::{ContextId, ContextRegistry};

/// Everything the Rust tools below saw, in order.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Contexts created by the tools below, by tool name.
static CONTEXTS: Mutex<Vec<(&'static str, ContextHandle)>> = Mutex::new(Vec::new());
/// The client finalize function the "early" tool received.
static EARLY_CLIENT_FINALIZE: Mutex<ClientFinalizeFn> = Mutex::new(None);

fn log(event: String) {
    EVENTS.lock().unwrap().push(event);
}

fn take_events() -> Vec<String> {
    std::mem::take(&mut *EVENTS.lock().unwrap())
}

fn contexts_of(tool: &str) -> Vec<ContextHandle> {
    CONTEXTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name == tool)
        .map(|(_, ctx)| *ctx)
        .collect()
}

fn start_test() -> std::sync::MutexGuard<'static, ()> {
    let guard = common::serial();
    kreplay::reset_for_tests();
    take_events();
    CONTEXTS.lock().unwrap().clear();
    *EARLY_CLIENT_FINALIZE.lock().unwrap() = None;
    guard
}

unsafe extern "C" fn ignore_record(_: CallbackRecord, _: *mut UserData, _: *mut c_void) {}

fn name_of(data: *mut c_void) -> &'static str {
    // SAFETY: every Rust tool's data is its name as a static NUL-terminated string.
    unsafe { CStr::from_ptr(data as *const c_char) }
        .to_str()
        .unwrap()
}

/// Creates a context, configures `kind` on it and starts it; logs the outcome.
fn create_configured_context(tool: &'static str, kind: CallbackKind) -> Status {
    let mut ctx = ContextHandle::default();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { kreplay_create_context(&mut ctx) }, Status::SUCCESS);
    CONTEXTS.lock().unwrap().push((tool, ctx));
    // SAFETY: NULL/0 operations mean all; the callback ignores everything.
    let status = unsafe {
        kreplay_configure_callback_tracing_service(
            ctx,
            kind,
            std::ptr::null(),
            0,
            Some(ignore_record),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
    status
}

unsafe extern "C" fn initialize_ok(finalize: ClientFinalizeFn, data: *mut c_void) -> c_int {
    let name = name_of(data);
    log(format!(
        "initialize {name} finalize_fn={}",
        finalize.is_some()
    ));
    let kind = if name == "alpha" {
        CallbackKind::KERNEL_REPLAY
    } else {
        CallbackKind::KERNEL_DISPATCH
    };
    let status = create_configured_context(name, kind);
    log(format!(
        "configure {name} {}",
        status.name().to_str().unwrap()
    ));
    // From inside initialize, forcing another tool is refused.
    let forced = kreplay_force_configure(Some(configure_alpha));
    log(format!(
        "force during init {name} {}",
        forced.name().to_str().unwrap()
    ));
    0
}

unsafe extern "C" fn initialize_fails(_: ClientFinalizeFn, data: *mut c_void) -> c_int {
    let name = name_of(data);
    log(format!("initialize {name}"));
    let status = create_configured_context(name, CallbackKind::KERNEL_REPLAY);
    log(format!(
        "configure {name} {}",
        status.name().to_str().unwrap()
    ));
    -1
}

unsafe extern "C" fn initialize_early(finalize: ClientFinalizeFn, data: *mut c_void) -> c_int {
    let name = name_of(data);
    *EARLY_CLIENT_FINALIZE.lock().unwrap() = finalize;
    log(format!("initialize {name}"));
    create_configured_context(name, CallbackKind::KERNEL_DISPATCH);
    0
}

unsafe extern "C" fn finalize_log(data: *mut c_void) {
    let name = name_of(data);
    // Contexts are stopped before finalize runs.
    let states: Vec<bool> = contexts_of(name)
        .into_iter()
        .map(|ctx| ContextRegistry::global().is_started(ctx.into()).unwrap())
        .collect();
    log(format!("finalize {name} started={states:?}"));
}

macro_rules! rust_tool {
    ($configure:ident, $name:literal, $initialize:expr, $size:expr) => {
        unsafe extern "C" fn $configure(
            version: u32,
            runtime_version: *const c_char,
            priority: u32,
            client: *mut ClientId,
        ) -> *mut ToolConfigureResult {
            static mut RESULT: ToolConfigureResult = ToolConfigureResult {
                size: 0,
                initialize: None,
                finalize: None,
                tool_data: std::ptr::null_mut(),
            };
            // SAFETY: kreplay passes a valid client id and a static version string.
            let (handle, runtime) = unsafe {
                (*client).name = concat!($name, "\0").as_ptr().cast();
                (
                    (*client).handle,
                    CStr::from_ptr(runtime_version).to_str().unwrap(),
                )
            };
            log(format!(
                "configure-call {} version={version} runtime={runtime} priority={priority} client={handle}",
                $name
            ));
            let result = ToolConfigureResult {
                size: $size,
                initialize: $initialize,
                finalize: Some(finalize_log),
                tool_data: concat!($name, "\0").as_ptr() as *mut c_void,
            };
            // SAFETY: only the serialized tests call configure functions, one at a time; the
            // static outlives the tool as the contract requires.
            unsafe {
                let slot = &raw mut RESULT;
                slot.write(result);
                slot
            }
        }
    };
}

rust_tool!(
    configure_alpha,
    "alpha",
    Some(initialize_ok),
    size_of::<ToolConfigureResult>()
);
rust_tool!(
    configure_beta,
    "beta",
    Some(initialize_ok),
    size_of::<ToolConfigureResult>()
);
rust_tool!(
    configure_failing,
    "failing",
    Some(initialize_fails),
    size_of::<ToolConfigureResult>()
);
rust_tool!(configure_short, "short", Some(initialize_ok), 8);
rust_tool!(
    configure_early,
    "early",
    Some(initialize_early),
    size_of::<ToolConfigureResult>()
);

unsafe extern "C" fn configure_declines(
    _: u32,
    _: *const c_char,
    _: u32,
    client: *mut ClientId,
) -> *mut ToolConfigureResult {
    // SAFETY: kreplay passes a valid client id.
    unsafe { (*client).name = c"declines".as_ptr() };
    log("configure-call declines".to_owned());
    std::ptr::null_mut()
}

/// Calls `kreplay_is_initialized` or `kreplay_is_finalized` and returns the flag it wrote.
fn flag_of(query: unsafe extern "C" fn(*mut c_int) -> Status) -> c_int {
    let mut flag: c_int = -1;
    // SAFETY: a valid out-pointer for one of kreplay's flag queries.
    assert_eq!(unsafe { query(&mut flag) }, Status::SUCCESS);
    flag
}

fn none() -> ToolSearch {
    ToolSearch::default()
}

#[test]
fn forced_tools_are_configured_then_initialized_in_order_and_finalized_in_reverse() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_alpha)),
        Status::SUCCESS
    );
    assert_eq!(
        kreplay_force_configure(Some(configure_beta)),
        Status::SUCCESS
    );
    assert_eq!(flag_of(kreplay_is_initialized), 0);

    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert!(report.load_errors.is_empty());
    assert_eq!(report.active_tools(), 2);
    let names: Vec<_> = report
        .tools
        .iter()
        .map(|t| t.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert!(report.tools.iter().all(|t| t.origin == ToolOrigin::Forced));
    assert_eq!(report.tools[0].client, 1);
    assert_eq!(report.tools[1].client, 2);
    assert_eq!(
        report.tools[0].contexts,
        contexts_of("alpha")
            .into_iter()
            .map(ContextId::from)
            .collect::<Vec<_>>()
    );

    assert_eq!(
        take_events(),
        [
            format!("configure-call alpha version={VERSION} runtime=0.1.0 priority=0 client=1"),
            format!("configure-call beta version={VERSION} runtime=0.1.0 priority=1 client=2"),
            "initialize alpha finalize_fn=true".to_owned(),
            "configure alpha KREPLAY_STATUS_SUCCESS".to_owned(),
            "force during init alpha KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED".to_owned(),
            "initialize beta finalize_fn=true".to_owned(),
            "configure beta KREPLAY_STATUS_SUCCESS".to_owned(),
            "force during init beta KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED".to_owned(),
        ]
    );
    // The tools' services are in place and configuration is closed.
    assert!(services::replay_configured());
    assert_eq!(services::dispatch_tracers().len(), 1);
    assert!(services::configuration_locked());
    assert_eq!(flag_of(kreplay_is_initialized), 1);
    assert_eq!(
        kreplay_force_configure(Some(configure_beta)),
        Status::ERROR_CONFIGURATION_LOCKED
    );
    assert_eq!(
        lifecycle::initialize_tools_with(&none()),
        Err(LifecycleError::AlreadyInitialized)
    );

    assert_eq!(lifecycle::finalize_tools(), 2);
    assert_eq!(
        take_events(),
        [
            "finalize beta started=[false]",
            "finalize alpha started=[false]"
        ]
    );
    assert_eq!(flag_of(kreplay_is_finalized), 1);
    assert!(
        lifecycle::tools()
            .iter()
            .all(|t| t.state == ToolState::Finalized)
    );
    assert_eq!(lifecycle::finalize_tools(), 0, "finalize runs once");
    assert!(take_events().is_empty());
}

#[test]
fn a_tool_whose_configure_returns_null_stays_inactive() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_declines)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools.len(), 1);
    assert_eq!(report.tools[0].state, ToolState::Declined);
    assert_eq!(report.tools[0].name.as_deref(), Some("declines"));
    assert_eq!(report.active_tools(), 0);
    assert_eq!(take_events(), ["configure-call declines"]);
    assert_eq!(lifecycle::finalize_tools(), 0);
    assert!(take_events().is_empty(), "no finalize for a declined tool");
}

#[test]
fn a_configure_result_that_is_too_small_is_rejected() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_short)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Rejected);
    let events = take_events();
    assert_eq!(
        events.len(),
        1,
        "configured but never initialized: {events:?}"
    );
    assert_eq!(lifecycle::finalize_tools(), 0);
}

#[test]
fn a_failed_initialize_stops_the_tools_contexts_and_removes_its_services() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_failing)),
        Status::SUCCESS
    );
    assert_eq!(
        kreplay_force_configure(Some(configure_beta)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Failed);
    assert_eq!(report.tools[1].state, ToolState::Active);
    let failed_contexts = contexts_of("failing");
    assert_eq!(failed_contexts.len(), 1);
    assert_eq!(
        ContextRegistry::global().is_started(failed_contexts[0].into()),
        Ok(false)
    );
    assert!(
        !services::replay_configured(),
        "the failed tool's KERNEL_REPLAY service is gone"
    );
    assert_eq!(
        services::dispatch_tracers().len(),
        1,
        "the other tool keeps its service"
    );
    take_events();
    assert_eq!(lifecycle::finalize_tools(), 1);
    assert_eq!(take_events(), ["finalize beta started=[false]"]);
}

#[test]
fn the_client_finalize_function_finalizes_a_tool_once_and_early() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_early)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Active);
    take_events();

    let finalize = EARLY_CLIENT_FINALIZE
        .lock()
        .unwrap()
        .expect("initialize received a client finalize function");
    let client = ClientId {
        name: std::ptr::null(),
        handle: report.tools[0].client,
    };
    // SAFETY: kreplay's own client finalize function with the tool's client id.
    unsafe { finalize(client) };
    assert_eq!(take_events(), ["finalize early started=[false]"]);
    assert_eq!(lifecycle::tools()[0].state, ToolState::Finalized);
    // SAFETY: as above; a second request is ignored (with a warning).
    unsafe { finalize(client) };
    assert!(take_events().is_empty());
    assert_eq!(lifecycle::finalize_tools(), 0, "already finalized");
    assert!(take_events().is_empty());
}

static SELFSTOP_HANDLE: Mutex<u32> = Mutex::new(0);

unsafe extern "C" fn configure_selfstop(
    _: u32,
    _: *const c_char,
    _: u32,
    client: *mut ClientId,
) -> *mut ToolConfigureResult {
    static mut RESULT: ToolConfigureResult = ToolConfigureResult {
        size: size_of::<ToolConfigureResult>(),
        initialize: Some(initialize_selfstop),
        finalize: Some(finalize_log),
        tool_data: c"selfstop".as_ptr() as *mut c_void,
    };
    // SAFETY: kreplay passes a valid client id.
    *SELFSTOP_HANDLE.lock().unwrap() = unsafe { (*client).handle };
    &raw mut RESULT
}

/// Asks to be finalized from inside its own initialize.
unsafe extern "C" fn initialize_selfstop(finalize: ClientFinalizeFn, _: *mut c_void) -> c_int {
    create_configured_context("selfstop", CallbackKind::KERNEL_DISPATCH);
    let client = ClientId {
        name: std::ptr::null(),
        handle: *SELFSTOP_HANDLE.lock().unwrap(),
    };
    // SAFETY: kreplay's client finalize function with this tool's own client id.
    unsafe { finalize.unwrap()(client) };
    log("initialize selfstop returned".to_owned());
    0
}

#[test]
fn a_tool_finalizing_itself_during_initialize_is_finalized_after_it_returns() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_selfstop)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Finalized);
    assert_eq!(
        take_events(),
        [
            "initialize selfstop returned",
            "finalize selfstop started=[false]"
        ]
    );
    assert_eq!(lifecycle::finalize_tools(), 0);
    assert!(take_events().is_empty());
}

#[test]
fn the_same_configure_function_found_twice_is_one_tool() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_declines)),
        Status::SUCCESS
    );
    assert_eq!(
        kreplay_force_configure(Some(configure_declines)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools.len(), 1);
    assert_eq!(take_events(), ["configure-call declines"]);
}

#[test]
fn force_configure_rejects_null() {
    assert_eq!(
        kreplay_force_configure(None),
        Status::ERROR_INVALID_ARGUMENT
    );
}

#[test]
fn is_initialized_and_is_finalized_reject_null() {
    // SAFETY: NULL is allowed and must be rejected.
    unsafe {
        assert_eq!(
            kreplay_is_initialized(std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            kreplay_is_finalized(std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn finalize_before_initialize_does_nothing() {
    let _serial = start_test();
    assert_eq!(lifecycle::finalize_tools(), 0);
    assert!(!lifecycle::is_finalized());
    assert!(!lifecycle::is_initialized());
}

// ---------------------------------------------------------------------------------------------
// KREPLAY_TOOL_LIBRARIES
// ---------------------------------------------------------------------------------------------

#[test]
fn tool_libraries_are_loaded_and_bad_paths_are_reported_without_losing_the_others() {
    if !common::have_compiler("cc") {
        return;
    }
    let _serial = start_test();
    let dir = common::scratch_dir("lifecycle");
    let tool = dir.join("libtool_from_list.so");
    common::build_tool_library(&tool);
    // A shared library that is not a tool: the C test tool's probe lives in it, but no
    // kreplay_configure. Build it from a one-line source.
    let not_a_tool_src = dir.join("not_a_tool.c");
    std::fs::write(&not_a_tool_src, "int not_a_tool(void) { return 1; }\n").unwrap();
    let not_a_tool = dir.join("libnot_a_tool.so");
    common::run_ok(
        "cc",
        &[
            "-fPIC".as_ref(),
            "-shared".as_ref(),
            not_a_tool_src.as_os_str(),
            "-o".as_ref(),
            not_a_tool.as_os_str(),
        ],
    );
    let missing = dir.join("does-not-exist.so");

    assert_eq!(
        kreplay_force_configure(Some(configure_declines)),
        Status::SUCCESS
    );
    let search = ToolSearch {
        search_process: false,
        libraries: vec![missing.clone(), tool.clone(), not_a_tool.clone()],
    };
    let report = lifecycle::initialize_tools_with(&search).unwrap();

    let failed: Vec<PathBuf> = report.load_errors.iter().map(|e| e.path.clone()).collect();
    assert_eq!(failed, [missing.clone(), not_a_tool.clone()]);
    assert!(report.load_errors[1].message.contains("kreplay_configure"));
    assert!(
        report.load_errors[0]
            .to_string()
            .contains("KREPLAY_TOOL_LIBRARIES")
    );
    assert_eq!(
        report.tools.len(),
        2,
        "the forced tool and the library tool"
    );
    assert_eq!(report.tools[0].origin, ToolOrigin::Forced);
    let c_tool = &report.tools[1];
    assert_eq!(c_tool.origin, ToolOrigin::Library(tool.clone()));
    assert_eq!(c_tool.name.as_deref(), Some("c-tool"));
    assert_eq!(c_tool.state, ToolState::Active);

    let probe = common::probe_tool_library(&tool);
    assert_eq!(probe.calls, [1, 1, 0], "configured and initialized once");
    assert_eq!(
        probe.seen,
        [VERSION, 1, 2],
        "version, priority, client handle"
    );
    assert!(probe.tool_data_ok);

    assert_eq!(lifecycle::finalize_tools(), 1);
    let probe = common::probe_tool_library(&tool);
    assert_eq!(probe.calls, [1, 1, 1], "finalized once");
}

#[test]
fn tool_search_from_env_includes_the_process() {
    let search = ToolSearch::from_env();
    assert!(search.search_process);
    if std::env::var_os(lifecycle::ENV_TOOL_LIBRARIES).is_none() {
        assert!(search.libraries.is_empty());
    }
}

/// A tool whose configure creates, configures and starts its context (allowed: services may be
/// configured "inside kreplay_configure or the tool's initialize"), with the given initialize.
macro_rules! tool_creating_in_configure {
    ($configure:ident, $name:literal, $kind:expr, $initialize:expr) => {
        unsafe extern "C" fn $configure(
            _: u32,
            _: *const c_char,
            _: u32,
            client: *mut ClientId,
        ) -> *mut ToolConfigureResult {
            static mut RESULT: ToolConfigureResult = ToolConfigureResult {
                size: 0,
                initialize: None,
                finalize: None,
                tool_data: std::ptr::null_mut(),
            };
            // SAFETY: kreplay passes a valid client id.
            unsafe { (*client).name = concat!($name, "\0").as_ptr().cast() };
            create_configured_context($name, $kind);
            let result = ToolConfigureResult {
                size: size_of::<ToolConfigureResult>(),
                initialize: $initialize,
                finalize: Some(finalize_log),
                tool_data: concat!($name, "\0").as_ptr() as *mut c_void,
            };
            // SAFETY: as in `rust_tool!`: serialized tests, a static that outlives the tool.
            unsafe {
                let slot = &raw mut RESULT;
                slot.write(result);
                slot
            }
        }
    };
}

unsafe extern "C" fn initialize_fails_quietly(_: ClientFinalizeFn, _: *mut c_void) -> c_int {
    1
}

unsafe extern "C" fn initialize_quietly(_: ClientFinalizeFn, _: *mut c_void) -> c_int {
    0
}

tool_creating_in_configure!(
    configure_creating_then_failing,
    "configured-failing",
    CallbackKind::KERNEL_REPLAY,
    Some(initialize_fails_quietly)
);
tool_creating_in_configure!(
    configure_creating,
    "configured",
    CallbackKind::KERNEL_DISPATCH,
    Some(initialize_quietly)
);

/// Creates its context on a thread of its own, joins it, then fails.
unsafe extern "C" fn initialize_on_a_thread_then_fail(
    _: ClientFinalizeFn,
    _: *mut c_void,
) -> c_int {
    std::thread::spawn(|| create_configured_context("threaded", CallbackKind::KERNEL_REPLAY))
        .join()
        .unwrap();
    1
}

rust_tool!(
    configure_threaded,
    "threaded",
    Some(initialize_on_a_thread_then_fail),
    size_of::<ToolConfigureResult>()
);

#[test]
fn contexts_a_tool_creates_in_configure_are_stopped_when_it_fails() {
    // They were nobody's: the failed tool's context stayed started and its KERNEL_REPLAY
    // service kept it the process's replay owner.
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_creating_then_failing)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Failed);
    let contexts = contexts_of("configured-failing");
    assert_eq!(contexts.len(), 1);
    assert_eq!(
        ContextRegistry::global().is_started(contexts[0].into()),
        Ok(false)
    );
    assert!(!services::replay_configured(), "its service is gone");
}

#[test]
fn contexts_a_tool_creates_in_configure_are_stopped_before_it_finalizes() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_creating)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Active);
    assert_eq!(report.tools[0].contexts.len(), 1);
    take_events();
    assert_eq!(lifecycle::finalize_tools(), 1);
    assert_eq!(take_events(), ["finalize configured started=[false]"]);
}

#[test]
fn contexts_a_tool_creates_on_a_thread_of_its_own_during_initialize_are_its_own() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_threaded)),
        Status::SUCCESS
    );
    let report = lifecycle::initialize_tools_with(&none()).unwrap();
    assert_eq!(report.tools[0].state, ToolState::Failed);
    let contexts = contexts_of("threaded");
    assert_eq!(contexts.len(), 1);
    assert_eq!(
        ContextRegistry::global().is_started(contexts[0].into()),
        Ok(false)
    );
    assert!(!services::replay_configured());
}

rust_tool!(
    configure_quiet,
    "quiet",
    Some(initialize_quietly),
    size_of::<ToolConfigureResult>()
);

#[test]
fn a_context_created_after_initialization_belongs_to_the_one_active_tool() {
    let _serial = start_test();
    assert_eq!(
        kreplay_force_configure(Some(configure_quiet)),
        Status::SUCCESS
    );
    lifecycle::initialize_tools_with(&none()).unwrap();
    // The tool creates its context later (at its first dispatch, say): it is still its own,
    // stopped before its finalize runs.
    assert_eq!(
        create_configured_context("quiet", CallbackKind::KERNEL_DISPATCH),
        Status::ERROR_CONFIGURATION_LOCKED
    );
    take_events();
    assert_eq!(lifecycle::finalize_tools(), 1);
    assert_eq!(take_events(), ["finalize quiet started=[false]"]);
}
