//! Tool discovery and lifecycle.
//!
//! [`initialize_tools`] (called once when the runtime loads kreplay) finds every tool's
//! `kreplay_configure`:
//! 1. functions registered with `kreplay_force_configure`, in registration order;
//! 2. the symbol `kreplay_configure` in the process's global scope;
//! 3. the symbol in each library of `KREPLAY_TOOL_LIBRARIES` (colon-separated paths, loaded with
//!    `RTLD_NOW | RTLD_LOCAL`; a path that fails to load, or lacks the symbol, is reported on
//!    stderr and in [`InitReport::load_errors`], and the other tools still load).
//!
//! The same function found twice is used once. Every configure function is called (its
//! `priority` is its rank), then every tool's `initialize`, in the same order; contexts a tool
//! creates on the initializing thread are attributed to it. A tool whose initialize returns
//! non-zero is failed: its contexts are stopped and their services removed. Then configuration is
//! locked. [`finalize_tools`] (called when the runtime unloads kreplay) stops each active tool's
//! contexts and calls its `finalize`, in reverse order.
//!
//! ```
//! use kreplay::abi::{ClientId, ToolConfigureResult};
//! use kreplay::lifecycle::{self, ToolSearch, ToolState};
//! use std::ffi::c_char;
//!
//! unsafe extern "C" fn configure(
//!     _version: u32, _runtime: *const c_char, _priority: u32, client: *mut ClientId,
//! ) -> *mut ToolConfigureResult {
//!     unsafe { (*client).name = c"doc-tool".as_ptr() };
//!     std::ptr::null_mut() // this tool stays inactive
//! }
//!
//! lifecycle::force_configure(configure).unwrap();
//! let report = lifecycle::initialize_tools_with(&ToolSearch::default()).unwrap();
//! assert_eq!(report.tools[0].name.as_deref(), Some("doc-tool"));
//! assert_eq!(report.tools[0].state, ToolState::Declined);
//! assert!(lifecycle::is_initialized());
//! assert_eq!(lifecycle::finalize_tools(), 0);
//! ```

use std::ffi::c_void;
use std::fmt;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use kreplay_ctxmask::{ContextId, ContextRegistry};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use parking_lot::Mutex;

use crate::abi::{
    ClientId, ConfigureFn, Status, ToolConfigureResult, ToolFinalizeFn, ToolInitializeFn, VERSION,
    VERSION_STRING,
};
use crate::services;

/// The environment variable listing tool libraries (colon-separated paths).
pub const ENV_TOOL_LIBRARIES: &str = "KREPLAY_TOOL_LIBRARIES";

/// Where a tool's configure function was found.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ToolOrigin {
    /// Registered with `kreplay_force_configure`.
    Forced,
    /// The `kreplay_configure` symbol of the process's global scope.
    Process,
    /// A tool library: one of `KREPLAY_TOOL_LIBRARIES`, or one a host loaded itself and
    /// registered with [`force_configure_library`] (`kreplay demo --tool`).
    Library(PathBuf),
}

impl fmt::Display for ToolOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolOrigin::Forced => f.write_str("kreplay_force_configure"),
            ToolOrigin::Process => f.write_str("the process"),
            ToolOrigin::Library(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Where a tool is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolState {
    /// Its configure returned NULL: it stays inactive.
    Declined,
    /// Its configure result was malformed (too small): ignored.
    Rejected,
    /// Configured, initialize not called yet.
    Configured,
    /// Its initialize is running.
    Initializing,
    /// Its initialize returned non-zero: its contexts were stopped, its services removed.
    Failed,
    /// Initialized and receiving callbacks.
    Active,
    /// Its finalize has run.
    Finalized,
}

/// What kreplay knows about one tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolSummary {
    /// The client handle kreplay gave the tool (1, 2, ...).
    pub client: u32,
    /// The name the tool set in its client id, if any.
    pub name: Option<String>,
    /// Where it was found.
    pub origin: ToolOrigin,
    /// Its state.
    pub state: ToolState,
    /// Its contexts (see docs/abi.md: created while its configure or initialize ran, or later
    /// while it was the only active tool).
    pub contexts: Vec<ContextId>,
}

/// A tool library that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolLoadError {
    /// The path from `KREPLAY_TOOL_LIBRARIES`.
    pub path: PathBuf,
    /// Why.
    pub message: String,
}

impl fmt::Display for ToolLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{ENV_TOOL_LIBRARIES}: cannot use {}: {}",
            self.path.display(),
            self.message
        )
    }
}

/// The outcome of [`initialize_tools`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitReport {
    /// Every tool found, in priority order.
    pub tools: Vec<ToolSummary>,
    /// Libraries that could not be used (also printed on stderr).
    pub load_errors: Vec<ToolLoadError>,
}

impl InitReport {
    /// What went wrong with the tools, one line each: libraries that could not be used, and
    /// tools rejected or failed at initialize (a tool that chose to stay inactive is not a
    /// problem).
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.load_errors.iter().map(ToString::to_string).collect();
        for tool in &self.tools {
            let what = match tool.state {
                ToolState::Rejected => "was rejected (its configure result is too small)",
                ToolState::Failed => "failed to initialize",
                _ => continue,
            };
            out.push(format!("tool {} {what}", describe(tool)));
        }
        out
    }

    /// Tools that chose to stay inactive (their configure returned NULL), one line each: not a
    /// problem, but the reason such a tool replays nothing.
    pub fn notes(&self) -> Vec<String> {
        self.tools
            .iter()
            .filter(|tool| tool.state == ToolState::Declined)
            .map(|tool| {
                format!(
                    "tool {} stayed inactive: its kreplay_configure returned NULL",
                    describe(tool)
                )
            })
            .collect()
    }

    /// How many tools ended initialization active.
    pub fn active_tools(&self) -> usize {
        self.tools
            .iter()
            .filter(|tool| tool.state == ToolState::Active)
            .count()
    }
}

/// Why tools could not be initialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecycleError {
    /// Tool initialization already ran (or is running) in this process.
    AlreadyInitialized,
}

impl fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifecycleError::AlreadyInitialized => {
                f.write_str("kreplay tools are already initialized in this process")
            }
        }
    }
}

impl std::error::Error for LifecycleError {}

/// Where to look for tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolSearch {
    /// Look up `kreplay_configure` in the process's global scope.
    pub search_process: bool,
    /// Tool libraries to load, in order.
    pub libraries: Vec<PathBuf>,
}

impl ToolSearch {
    /// The process plus the libraries of `KREPLAY_TOOL_LIBRARIES`.
    pub fn from_env() -> ToolSearch {
        let libraries = match std::env::var_os(ENV_TOOL_LIBRARIES) {
            Some(value) => std::env::split_paths(&value)
                .filter(|path| !path.as_os_str().is_empty())
                .collect(),
            None => Vec::new(),
        };
        ToolSearch {
            search_process: true,
            libraries,
        }
    }

    /// Parses a `KREPLAY_TOOL_LIBRARIES` value: colon-separated, empty entries skipped.
    pub fn parse_libraries(value: &str) -> Vec<PathBuf> {
        value
            .split(':')
            .filter(|entry| !entry.is_empty())
            .map(PathBuf::from)
            .collect()
    }
}

const UNINITIALIZED: u8 = 0;
const INITIALIZING: u8 = 1;
const INITIALIZED: u8 = 2;
const FINALIZING: u8 = 3;
const FINALIZED: u8 = 4;

static PHASE: AtomicU8 = AtomicU8::new(UNINITIALIZED);

struct Tool {
    summary: ToolSummary,
    initialize: ToolInitializeFn,
    finalize: ToolFinalizeFn,
    tool_data: *mut c_void,
    finalize_requested: bool,
    /// The services it configured (on its own contexts or another's).
    services: Vec<ConfiguredService>,
}

// SAFETY: `tool_data` is the tool's opaque pointer, only handed back to the tool's own functions,
// which the tool contract allows kreplay to call from the thread that initializes or finalizes.
unsafe impl Send for Tool {}

struct LifecycleState {
    forced: Vec<(ConfigureFn, ToolOrigin)>,
    tools: Vec<Tool>,
    /// Tool libraries stay loaded for the life of the process.
    libraries: Vec<Library>,
    /// The libraries of the last initialization that could not be used.
    load_errors: Vec<ToolLoadError>,
}

static STATE: Mutex<LifecycleState> = Mutex::new(LifecycleState {
    forced: Vec::new(),
    tools: Vec::new(),
    libraries: Vec::new(),
    load_errors: Vec::new(),
});

/// What one tool's configure or initialize made, on any thread (tools are configured and
/// initialized one at a time, and a tool may work on a thread of its own).
#[derive(Debug, Default)]
struct Setup {
    /// Contexts created: that tool's.
    contexts: Vec<ContextId>,
    /// Services configured, on any context (one of another tool's too): that tool's.
    services: Vec<ConfiguredService>,
}

/// A service a tool configured: a callback tracing service of `kind` on `context`, or
/// (`kind == None`) the dispatch counting service on `context`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ConfiguredService {
    context: ContextId,
    kind: Option<crate::abi::CallbackKind>,
}

/// The setup of the tool whose configure or initialize is running, if one is.
static CURRENT_SETUP: Mutex<Option<Setup>> = Mutex::new(None);

fn begin_setup() {
    *CURRENT_SETUP.lock() = Some(Setup::default());
}

fn end_setup() -> Setup {
    CURRENT_SETUP.lock().take().unwrap_or_default()
}

/// Records a callback tracing service (`kind`) or the dispatch counting service (`None`) just
/// configured on `context`: it belongs to the tool whose configure or initialize is running.
pub(crate) fn note_service_configured(context: ContextId, kind: Option<crate::abi::CallbackKind>) {
    if let Some(setup) = CURRENT_SETUP.lock().as_mut() {
        setup.services.push(ConfiguredService { context, kind });
    }
}

/// Stops `contexts` and removes their services, and every service in `configured` (those the
/// tool configured on contexts not its own): nothing of a tool that failed or stays inactive
/// may reach it.
fn stop_contexts(contexts: &[ContextId], configured: &[ConfiguredService]) {
    let registry = ContextRegistry::global();
    for &context in contexts {
        let _ = registry.stop(context);
        let _ = services::remove_context(context);
        crate::counting::remove_context(context);
    }
    for service in configured {
        match service.kind {
            Some(kind) => {
                let _ = services::remove_service(service.context, kind);
            }
            None => crate::counting::remove_context(service.context),
        }
    }
}

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`): the
/// finalizes in progress are registered and looked at under the state lock.
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 4] =
    [&STATE, &CURRENT_SETUP, &RETIRED, &FINALIZE_JOBS];

/// Has tool initialization begun (from then on `kreplay_force_configure` is refused)?
pub fn is_initialized() -> bool {
    PHASE.load(Ordering::Acquire) != UNINITIALIZED
}

/// Have the tools been finalized?
pub fn is_finalized() -> bool {
    PHASE.load(Ordering::Acquire) == FINALIZED
}

/// Registers a configure function of a tool linked into the application. Refused with
/// [`Status::ERROR_CONFIGURATION_LOCKED`] once tool initialization has begun.
pub fn force_configure(configure: ConfigureFn) -> Result<(), Status> {
    let mut state = STATE.lock();
    // Checked under the state lock, which initialize_tools holds while it leaves UNINITIALIZED.
    if PHASE.load(Ordering::Acquire) != UNINITIALIZED {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    state.forced.push((configure, ToolOrigin::Forced));
    Ok(())
}

/// [`force_configure`] for the `kreplay_configure` of a tool library the host loaded itself
/// (`kreplay demo --tool PATH`): kreplay's messages about the tool name `library`, the file
/// its author gave, rather than the registration call.
pub fn force_configure_library(configure: ConfigureFn, library: &Path) -> Result<(), Status> {
    let mut state = STATE.lock();
    if PHASE.load(Ordering::Acquire) != UNINITIALIZED {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    state
        .forced
        .push((configure, ToolOrigin::Library(library.to_path_buf())));
    Ok(())
}

/// Records a context created by `kreplay_create_context`: it belongs to the tool whose configure
/// or initialize is running (on whatever thread it was created), else, once tools are
/// initialized, to the one active tool where there is exactly one (with several, a context
/// created later is nobody's: it is not stopped when one of them finalizes itself).
pub(crate) fn note_context_created(context: ContextId) {
    if let Some(setup) = CURRENT_SETUP.lock().as_mut() {
        setup.contexts.push(context);
        return;
    }
    let mut state = STATE.lock();
    let mut active = state
        .tools
        .iter_mut()
        .filter(|tool| tool.summary.state == ToolState::Active);
    if let (Some(tool), None) = (active.next(), active.next()) {
        tool.summary.contexts.push(context);
    }
}

/// A snapshot of every tool kreplay knows about.
pub fn tools() -> Vec<ToolSummary> {
    STATE
        .lock()
        .tools
        .iter()
        .map(|tool| tool.summary.clone())
        .collect()
}

/// What went wrong with the tools of this process's initialization, as
/// [`InitReport::problems`] said at its end (libraries that could not be used, tools rejected
/// or failed at initialize); empty before tools are initialized. A host that runs a tool of its
/// own beside `KREPLAY_TOOL_LIBRARIES` (the `kreplay` commands) asks it after loading kreplay, so
/// that a tool it was asked to use and could not is an error, not a line in passing.
pub fn problems() -> Vec<String> {
    let report = {
        let state = STATE.lock();
        InitReport {
            tools: state
                .tools
                .iter()
                .map(|tool| tool.summary.clone())
                .collect(),
            load_errors: state.load_errors.clone(),
        }
    };
    report.problems()
}

/// The tools of this process's initialization that chose to stay inactive, as
/// [`InitReport::notes`] said at its end; empty before tools are initialized. Not problems: a
/// host names them (a tool it was asked to load that does nothing says why).
pub fn notes() -> Vec<String> {
    let report = {
        let state = STATE.lock();
        InitReport {
            tools: state
                .tools
                .iter()
                .map(|tool| tool.summary.clone())
                .collect(),
            load_errors: Vec::new(),
        }
    };
    report.notes()
}

/// Discovers and initializes tools as [`ToolSearch::from_env`] describes, then locks
/// configuration. Runs once per process; a second call is
/// [`LifecycleError::AlreadyInitialized`].
pub fn initialize_tools() -> Result<InitReport, LifecycleError> {
    initialize_tools_with(&ToolSearch::from_env())
}

/// [`initialize_tools`] with an explicit search (forced configure functions are always used).
pub fn initialize_tools_with(search: &ToolSearch) -> Result<InitReport, LifecycleError> {
    let forced = {
        let state = STATE.lock();
        PHASE
            .compare_exchange(
                UNINITIALIZED,
                INITIALIZING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map_err(|_| LifecycleError::AlreadyInitialized)?;
        state.forced.clone()
    };

    services::watch_forks();
    let mut report = InitReport::default();
    let candidates = discover(search, forced, &mut report.load_errors);

    // Configure every candidate (no kreplay lock is held while tool code runs).
    let mut configured = Vec::with_capacity(candidates.len());
    for (priority, (configure, origin)) in candidates.into_iter().enumerate() {
        configured.push(configure_tool(
            configure,
            origin,
            priority as u32 + 1,
            priority as u32,
        ));
    }
    STATE.lock().tools.extend(configured);

    let count = STATE.lock().tools.len();
    for index in 0..count {
        initialize_tool(index);
    }

    services::lock_configuration();
    PHASE.store(INITIALIZED, Ordering::Release);
    report.tools = tools();
    STATE.lock().load_errors = report.load_errors.clone();
    crate::kreplay_info!(
        "{} tool(s) found, {} active",
        report.tools.len(),
        report.active_tools()
    );
    Ok(report)
}

/// Stops every active tool's contexts and calls its finalize, in reverse order of
/// initialization. Returns how many tools were finalized (0 if tools were never initialized or
/// are already finalized).
pub fn finalize_tools() -> usize {
    if PHASE
        .compare_exchange(INITIALIZED, FINALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return 0;
    }
    let jobs: Vec<FinalizeJob> = {
        let mut state = STATE.lock();
        state
            .tools
            .iter_mut()
            .rev()
            .filter(|tool| tool.summary.state == ToolState::Active)
            .map(|tool| {
                tool.summary.state = ToolState::Finalized;
                FinalizeJob::of(tool)
            })
            .collect()
    };
    let finalized = jobs.len();
    for job in jobs {
        job.run();
    }
    // A tool that began finalizing itself on another thread before is done only when its
    // finalize has returned: kreplay is finalized after that.
    wait_for_finalizes(None);
    PHASE.store(FINALIZED, Ordering::Release);
    finalized
}

/// Forgets tools, forced configure functions and services and reopens configuration, so that a
/// test harness sharing one process can run lifecycle scenarios one after another. Tools are not
/// finalized; loaded libraries stay loaded. Not for production use.
pub(crate) fn reset() {
    let mut state = STATE.lock();
    state.forced.clear();
    state.tools.clear();
    state.load_errors.clear();
    *CURRENT_SETUP.lock() = None;
    RETIRED.lock().clear();
    services::reset();
    crate::counting::reset();
    PHASE.store(UNINITIALIZED, Ordering::Release);
}

fn discover(
    search: &ToolSearch,
    forced: Vec<(ConfigureFn, ToolOrigin)>,
    load_errors: &mut Vec<ToolLoadError>,
) -> Vec<(ConfigureFn, ToolOrigin)> {
    let mut found: Vec<(ConfigureFn, ToolOrigin)> = Vec::new();
    let mut add = |configure: ConfigureFn, origin: ToolOrigin| {
        let address = configure as usize;
        if !found.iter().any(|(known, _)| *known as usize == address) {
            found.push((configure, origin));
        }
    };
    for (configure, origin) in forced {
        add(configure, origin);
    }
    if search.search_process {
        let this = Library::this();
        // SAFETY: a `kreplay_configure` symbol, wherever a tool defines it, has the type declared
        // in kreplay.h, which `ConfigureFn` mirrors.
        if let Ok(symbol) = unsafe { this.get::<ConfigureFn>(b"kreplay_configure\0") } {
            match not_a_function(*symbol as *const c_void) {
                None => add(*symbol, ToolOrigin::Process),
                Some(what) => {
                    crate::kreplay_error!(
                        "the process's kreplay_configure is not a function: {what}; no tool \
                         from it"
                    );
                }
            }
        }
    }
    for path in &search.libraries {
        match load_tool_library(path) {
            Ok((library, configure)) => {
                STATE.lock().libraries.push(library);
                add(configure, ToolOrigin::Library(path.clone()));
            }
            Err(message) => {
                let error = ToolLoadError {
                    path: path.clone(),
                    message,
                };
                crate::kreplay_error!("{error}");
                load_errors.push(error);
            }
        }
    }
    found
}

fn load_tool_library(path: &Path) -> Result<(Library, ConfigureFn), String> {
    // SAFETY: loading a library runs its initializers; the user asked for exactly this library
    // to be loaded into the process by listing it in KREPLAY_TOOL_LIBRARIES.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .map_err(|err| explain_load_error(err.to_string()))?;
    // SAFETY: as in `discover`: the symbol has the type declared in kreplay.h. The pointer is
    // used only while the library stays loaded, which is for the life of the process.
    let configure = unsafe { library.get::<ConfigureFn>(b"kreplay_configure\0") }
        .map(|symbol| *symbol)
        .map_err(|err| format!("the library does not define kreplay_configure ({err})"))
        .and_then(
            |configure| match not_a_function(configure as *const c_void) {
                Some(what) => Err(format!("kreplay_configure is not a function: {what}")),
                None => Ok(configure),
            },
        );
    match configure {
        Ok(configure) => Ok((library, configure)),
        Err(message) => {
            // Not a tool, but keep it loaded: unloading libraries has surprised processes before.
            STATE.lock().libraries.push(library);
            Err(message)
        }
    }
}

/// The dynamic loader's message for a tool library it could not load, with what it means for a
/// tool author where the loader's words are cryptic (a 32-bit build, a file that is not a shared
/// library at all).
///
/// ```
/// use kreplay::lifecycle::explain_load_error;
///
/// let said = explain_load_error("./t.so: wrong ELF class: ELFCLASS32".into());
/// assert!(said.ends_with("(a 32-bit library: kreplay loads 64-bit tools only; build the tool for the program's 64-bit target)"));
/// assert_eq!(explain_load_error("x: undefined symbol: y".into()), "x: undefined symbol: y");
/// ```
pub fn explain_load_error(message: String) -> String {
    let hint = if message.contains("wrong ELF class: ELFCLASS32") {
        "a 32-bit library: kreplay loads 64-bit tools only; build the tool for the program's \
         64-bit target"
    } else if message.contains("invalid ELF header") || message.contains("file too short") {
        "not a shared library: build the tool with -shared -fPIC"
    } else if message.contains("cannot dynamically load") && message.contains("executable") {
        "an executable, not a shared library: build the tool with -shared -fPIC"
    } else {
        return message;
    };
    format!("{message} ({hint})")
}

/// Why the symbol at `address` (a `kreplay_configure` found by name) cannot be called: `None`
/// for a function, or where the symbol's type cannot be read; else what it is (a variable, a
/// function pointer named like the entry point, ...). Calling data would crash the process.
pub fn not_a_function(address: *const c_void) -> Option<&'static str> {
    symbol_type(address).and_then(|kind| match kind {
        // STT_NOTYPE (hand-written assembly, some linkers' aliases), STT_FUNC, STT_GNU_IFUNC.
        0 | 2 | 10 => None,
        1 => Some("it is a variable (define the function itself, not a pointer to it)"),
        _ => Some("its symbol is not code"),
    })
}

/// The ELF symbol type (`STT_*`) of the dynamic symbol at `address`, where glibc can tell.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn symbol_type(address: *const c_void) -> Option<u8> {
    #[repr(C)]
    struct DlInfo {
        fname: *const std::ffi::c_char,
        fbase: *mut c_void,
        sname: *const std::ffi::c_char,
        saddr: *mut c_void,
    }
    #[repr(C)]
    struct Elf64Sym {
        name: u32,
        info: u8,
        other: u8,
        shndx: u16,
        value: u64,
        size: u64,
    }
    const RTLD_DL_SYMENT: std::ffi::c_int = 1;
    unsafe extern "C" {
        fn dladdr1(
            address: *const c_void,
            info: *mut DlInfo,
            extra: *mut *mut c_void,
            flags: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    let mut symbol: *mut c_void = std::ptr::null_mut();
    // SAFETY: glibc's dladdr1 only reads the loader's tables for `address` and writes `info`
    // and `symbol`, both valid for writing.
    let found = unsafe { dladdr1(address, &mut info, &mut symbol, RTLD_DL_SYMENT) };
    if found == 0 || symbol.is_null() || info.saddr.cast_const() != address {
        return None;
    }
    // SAFETY: with RTLD_DL_SYMENT, a non-null `symbol` points at the matching Elf64_Sym of a
    // loaded object's dynamic symbol table, which lives as long as the object (kept loaded).
    Some(unsafe { symbol.cast::<Elf64Sym>().read_unaligned() }.info & 0xf)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn symbol_type(_: *const c_void) -> Option<u8> {
    None
}

fn configure_tool(configure: ConfigureFn, origin: ToolOrigin, client: u32, priority: u32) -> Tool {
    let mut client_id = ClientId {
        name: std::ptr::null(),
        handle: client,
    };
    begin_setup();
    // SAFETY: `configure` is a tool's `kreplay_configure` (type checked by its declaration in
    // kreplay.h); the version string is a static NUL-terminated string and `client_id` is valid
    // for the call.
    let result = unsafe { configure(VERSION, VERSION_STRING.as_ptr(), priority, &mut client_id) };
    let setup = end_setup();
    let name = if client_id.name.is_null() {
        None
    } else {
        // SAFETY: the contract asks the tool to set a NUL-terminated string with static storage;
        // at most `MAX_NAME` bytes of it are read.
        Some(unsafe { bounded_name(client_id.name) })
    };
    let mut tool = Tool {
        summary: ToolSummary {
            client,
            name,
            origin,
            state: ToolState::Declined,
            contexts: setup.contexts,
        },
        initialize: None,
        finalize: None,
        tool_data: std::ptr::null_mut(),
        finalize_requested: false,
        services: setup.services,
    };
    if result.is_null() {
        crate::kreplay_info!("tool {} stays inactive", describe(&tool.summary));
        stop_contexts(&tool.summary.contexts, &tool.services);
        return tool;
    }
    // SAFETY: a non-null result points to a `kreplay_tool_configure_result_t` whose first field,
    // `size`, tells how much of it the tool filled in; only that field is read before checking.
    let size = unsafe { std::ptr::addr_of!((*result).size).read_unaligned() };
    if size < size_of::<ToolConfigureResult>() {
        crate::kreplay_error!(
            "tool {} returned a configure result of {size} bytes (expected at least {}); ignored",
            describe(&tool.summary),
            size_of::<ToolConfigureResult>()
        );
        tool.summary.state = ToolState::Rejected;
        stop_contexts(&tool.summary.contexts, &tool.services);
        return tool;
    }
    // SAFETY: the size check above shows the whole struct was provided by the tool.
    let result = unsafe { result.read_unaligned() };
    tool.initialize = result.initialize;
    tool.finalize = result.finalize;
    tool.tool_data = result.tool_data;
    tool.summary.state = ToolState::Configured;
    tool
}

/// The longest tool name kreplay keeps, in bytes: the rest of a longer one (or of one whose
/// NUL never comes) is neither read nor printed.
const MAX_NAME: usize = 256;

/// The tool name at `name`: up to its NUL, or its first [`MAX_NAME`] bytes with `...` appended
/// (a warning says it was cut).
///
/// # Safety
/// `name` points to a NUL-terminated string, or to at least `MAX_NAME` readable bytes.
unsafe fn bounded_name(name: *const std::ffi::c_char) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_NAME {
        // SAFETY: within the string (its NUL not reached yet) or its first MAX_NAME bytes.
        let byte = unsafe { name.add(bytes.len()).cast::<u8>().read() };
        if byte == 0 {
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        bytes.push(byte);
    }
    let kept = String::from_utf8_lossy(&bytes).into_owned();
    crate::kreplay_warn!(
        "a tool's name has no NUL within {MAX_NAME} bytes; it is cut there: \"{kept}...\""
    );
    format!("{kept}...")
}

fn initialize_tool(index: usize) {
    let (initialize, tool_data, client) = {
        let mut state = STATE.lock();
        let tool = &mut state.tools[index];
        if tool.summary.state != ToolState::Configured {
            return;
        }
        tool.summary.state = ToolState::Initializing;
        (tool.initialize, tool.tool_data, tool.summary.client)
    };

    begin_setup();
    let rc = match initialize {
        // SAFETY: the tool's initialize, called once with the finalize trampoline and the tool's
        // own data, exactly as kreplay.h documents.
        Some(initialize) => unsafe { initialize(Some(finalize_function(client)), tool_data) },
        None => 0,
    };
    let setup = end_setup();

    let (early_finalize, description, contexts, configured) = {
        let mut state = STATE.lock();
        let tool = &mut state.tools[index];
        tool.summary.contexts.extend(setup.contexts);
        tool.services.extend(setup.services);
        let contexts = tool.summary.contexts.clone();
        let configured = tool.services.clone();
        let description = describe(&tool.summary);
        let early_finalize = if rc != 0 {
            tool.summary.state = ToolState::Failed;
            None
        } else if tool.finalize_requested {
            tool.summary.state = ToolState::Finalized;
            Some(FinalizeJob::of(tool))
        } else {
            tool.summary.state = ToolState::Active;
            None
        };
        (early_finalize, description, contexts, configured)
    };

    if rc != 0 {
        stop_contexts(&contexts, &configured);
        crate::kreplay_warn!(
            "tool {description} failed to initialize (returned {rc}); its {} context(s) were stopped",
            contexts.len()
        );
    } else if let Some(job) = early_finalize {
        crate::kreplay_info!("tool {description} finalized itself during initialize");
        // Its services are given back, as a failed tool's are: configuration is still open, so
        // a tool initialized after it may take the replay service.
        stop_contexts(&contexts, &configured);
        job.run();
    } else if contexts.is_empty() {
        crate::kreplay_warn!(
            "tool {description} initialized without creating a context: nothing will reach it \
             (a tool linked with a copy of kreplay of its own, statically, configures that copy \
             instead: link it with -lkreplay)"
        );
    } else {
        crate::kreplay_info!("tool {description} initialized");
        // Configured and never started is the likely slip behind "nothing is replayed"; a tool
        // may also mean to start it later, so this is a warning, once.
        if let Some(owner) = services::replay_owner()
            && contexts.contains(&owner.context)
            && ContextRegistry::global().is_started(owner.context) == Ok(false)
        {
            crate::kreplay_warn!(
                "tool {description} configured kernel replay on a context it has not started \
                 (context {}): no dispatch is replayed until it calls kreplay_start_context",
                owner.context.0
            );
        }
        // The same slip for counting: no configuration is ever asked for, no record comes.
        if let Some(context) = crate::counting::service_context()
            && contexts.contains(&context)
            && ContextRegistry::global().is_started(context) == Ok(false)
        {
            crate::kreplay_warn!(
                "tool {description} configured dispatch counting on a context it has not \
                 started (context {}): no dispatch is counted until it calls \
                 kreplay_start_context",
                context.0
            );
        }
    }
}

/// Contexts of finalized tools: they stay stopped for good. Held while such a context is
/// checked and started ([`start_context`]) and while a finalize adds and stops its tool's
/// contexts, so a start racing a finalize either comes first (and is undone by the stop) or
/// is refused.
static RETIRED: Mutex<Vec<ContextId>> = Mutex::new(Vec::new());

/// Starts `context` unless its tool has been finalized ([`Status::ERROR_FINALIZED`]): a tool's
/// finalize is the last of it kreplay calls, so a context of it started afterwards (from its
/// finalize, or from a thread of its own) must not bring its callbacks back.
pub(crate) fn start_context(context: ContextId) -> Status {
    let retired = RETIRED.lock();
    if retired.contains(&context) {
        return Status::ERROR_FINALIZED;
    }
    match ContextRegistry::global().start(context) {
        Ok(()) => Status::SUCCESS,
        Err(kreplay_ctxmask::ContextError::UnknownContext) => Status::ERROR_CONTEXT_NOT_FOUND,
        Err(_) => Status::ERROR,
    }
}

/// How long a finalize waits for the tool's callbacks running on other threads.
const FINALIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Finalizes in progress: the tool's client handle and the thread running its finalize.
static FINALIZE_JOBS: Mutex<Vec<(u32, std::thread::ThreadId)>> = Mutex::new(Vec::new());
static FINALIZE_ENDED: parking_lot::Condvar = parking_lot::Condvar::new();

/// In the child of a `fork` (from `services::in_forked_child`, once the fork set's locks are
/// unlocked again, this list's among them): finalizes the parent's other threads were running
/// never end there, so nothing waits for them.
pub(crate) fn forget_finalizes_of_other_threads() {
    // Free in the child (`crate::fork`); `try_lock` all the same, so that a fork whose prepare
    // handler did not run leaves the list as it is rather than waiting in a fork handler.
    if let Some(mut running) = FINALIZE_JOBS.try_lock() {
        let me = std::thread::current().id();
        running.retain(|&(_, thread)| thread == me);
    }
}

/// Waits until no finalize of `client` (any tool when `None`) runs on another thread (one this
/// thread runs, which it is inside of, is not waited for), at most [`FINALIZE_WAIT`]. Not from
/// inside a callback: a finalize in progress waits for the callbacks of its tool, perhaps this one.
fn wait_for_finalizes(client: Option<u32>) {
    if crate::services::in_callback() {
        return;
    }
    let me = std::thread::current().id();
    let deadline = std::time::Instant::now() + FINALIZE_WAIT;
    let mut running = FINALIZE_JOBS.lock();
    let busy = |running: &Vec<(u32, std::thread::ThreadId)>| {
        running
            .iter()
            .any(|&(c, t)| t != me && client.is_none_or(|client| client == c))
    };
    while busy(&running) {
        if FINALIZE_ENDED
            .wait_until(&mut running, deadline)
            .timed_out()
        {
            let still = busy(&running);
            // Said after the lock: the process's logger may fork, and kreplay's fork handlers
            // take it (`crate::fork`).
            drop(running);
            if still {
                crate::kreplay_warn!(
                    "a tool's finalize running on another thread still ran after {} s; not \
                     waiting for it any longer",
                    FINALIZE_WAIT.as_secs()
                );
            }
            return;
        }
    }
}

struct FinalizeJob {
    client: u32,
    contexts: Vec<ContextId>,
    /// The services the tool configured (some perhaps on contexts not its own).
    services: Vec<ConfiguredService>,
    finalize: ToolFinalizeFn,
    tool_data: *mut c_void,
}

impl FinalizeJob {
    /// The job of `tool`, which the caller has just marked finalized (under the state lock):
    /// registered as in progress on this thread, which runs it, until [`run`](Self::run) ends.
    fn of(tool: &Tool) -> FinalizeJob {
        FINALIZE_JOBS
            .lock()
            .push((tool.summary.client, std::thread::current().id()));
        FinalizeJob {
            client: tool.summary.client,
            contexts: tool.summary.contexts.clone(),
            services: tool.services.clone(),
            finalize: tool.finalize,
            tool_data: tool.tool_data,
        }
    }

    /// Stops the tool's contexts and retires its services (no callback reaches it once
    /// finalize runs, also through a service on a context not its own), then finalizes it.
    fn run(self) {
        let registry = ContextRegistry::global();
        {
            let mut retired = RETIRED.lock();
            for &context in &self.contexts {
                if !retired.contains(&context) {
                    retired.push(context);
                }
                let _ = registry.stop(context);
            }
        }
        let mut waited = self.contexts.clone();
        // Those on its own contexts are silenced by the stop above; only a service on another's
        // context needs retiring (which costs every later delivery a look-up).
        for service in self
            .services
            .iter()
            .filter(|s| !self.contexts.contains(&s.context))
        {
            crate::services::retire_service(service.context, service.kind);
            if !waited.contains(&service.context) {
                waited.push(service.context);
            }
        }
        // Callbacks of the tool already running on other threads end first: its finalize
        // comes after its last callback (a callback that never returns is waited for a while).
        if !crate::services::wait_for_callbacks(&waited, FINALIZE_WAIT) {
            crate::kreplay_warn!(
                "a callback of a tool being finalized still ran after {} s; finalizing it anyway",
                FINALIZE_WAIT.as_secs()
            );
        }
        if let Some(finalize) = self.finalize {
            // SAFETY: the tool's finalize, called once with its own data as kreplay.h documents.
            unsafe { finalize(self.tool_data) };
        }
    }
}

impl Drop for FinalizeJob {
    /// The finalize ended (also if it unwound): those waiting for it go on.
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let mut running = FINALIZE_JOBS.lock();
        if let Some(i) = running
            .iter()
            .position(|&(c, t)| c == self.client && t == me)
        {
            running.remove(i);
        }
        FINALIZE_ENDED.notify_all();
    }
}

/// The `kreplay_client_finalize_t` handed to the initialize of the tool with client handle
/// `CLIENT`: it finalizes that tool, and no other (called with another client id, a stale or
/// guessed one, it is refused with a warning).
unsafe extern "C" fn client_finalize_of<const CLIENT: u32>(client: ClientId) {
    let _ = std::panic::catch_unwind(|| {
        if client.handle == CLIENT {
            finalize_client(CLIENT);
        } else {
            crate::kreplay_warn!(
                "tool {} called its finalize function with client id {}, which is not its own; \
                 ignored (a tool finalizes only itself)",
                tool_description(CLIENT),
                client.handle
            );
        }
    });
}

/// The finalize function of tools beyond [`CLIENT_FINALIZERS`]: it cannot tell whose it is, so
/// it finalizes the tool the client id names.
unsafe extern "C" fn client_finalize_any(client: ClientId) {
    let _ = std::panic::catch_unwind(|| finalize_client(client.handle));
}

macro_rules! client_finalizers {
    ($($client:literal)*) => {
        [$(client_finalize_of::<$client> as unsafe extern "C" fn(ClientId)),*]
    };
}

/// One finalize function per client handle 1..=64 (a process has far fewer tools).
static CLIENT_FINALIZERS: [unsafe extern "C" fn(ClientId); 64] = client_finalizers!(
    1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
    33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
    63 64
);

/// The finalize function handed to the tool with client handle `client`.
fn finalize_function(client: u32) -> unsafe extern "C" fn(ClientId) {
    client
        .checked_sub(1)
        .and_then(|index| CLIENT_FINALIZERS.get(index as usize))
        .copied()
        .unwrap_or(client_finalize_any)
}

/// How messages name the tool with client handle `client`.
fn tool_description(client: u32) -> String {
    STATE
        .lock()
        .tools
        .iter()
        .find(|tool| tool.summary.client == client)
        .map_or_else(
            || format!("client {client}"),
            |tool| describe(&tool.summary),
        )
}

fn finalize_client(handle: u32) {
    // What to warn about is decided under the state lock and said after it: the process's
    // logger may fork, and kreplay's fork handlers take that lock (`crate::fork`).
    let (job, refused) = {
        let mut state = STATE.lock();
        match state
            .tools
            .iter_mut()
            .find(|tool| tool.summary.client == handle)
        {
            Some(tool) if tool.summary.state == ToolState::Active => {
                tool.summary.state = ToolState::Finalized;
                (Some(FinalizeJob::of(tool)), None)
            }
            Some(tool) if tool.summary.state == ToolState::Initializing => {
                tool.finalize_requested = true;
                (None, None)
            }
            Some(tool) => {
                let finalizing = FINALIZE_JOBS.lock().iter().any(|&(c, _)| c == handle);
                let refused = (!finalizing).then(|| {
                    format!(
                        "tool {} asked to be finalized while {:?}; ignored",
                        describe(&tool.summary),
                        tool.summary.state
                    )
                });
                (None, refused)
            }
            None => (
                None,
                Some(format!(
                    "finalize requested for unknown client {handle}; ignored"
                )),
            ),
        }
    };
    if let Some(refused) = refused {
        crate::kreplay_warn!("{refused}");
    }
    match job {
        Some(job) => job.run(),
        // Finalized already, or being finalized by another thread: return once that is done.
        None => wait_for_finalizes(Some(handle)),
    }
}

fn describe(tool: &ToolSummary) -> String {
    match &tool.name {
        Some(name) => format!("{name:?} (client {}, from {})", tool.client, tool.origin),
        None => format!("client {} (from {})", tool.client, tool.origin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_library_lists_split_on_colons_and_skip_empty_entries() {
        assert_eq!(
            ToolSearch::parse_libraries("/a/libx.so::/b/liby.so:"),
            vec![PathBuf::from("/a/libx.so"), PathBuf::from("/b/liby.so")]
        );
        assert!(ToolSearch::parse_libraries("").is_empty());
    }
}
