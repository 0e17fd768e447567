//! `#[repr(C)]` mirrors of every type in `include/kreplay.h`, with their layouts checked at
//! compile time.
//!
//! C enumerations are carried as transparent integer newtypes with associated constants (for
//! example [`Status::SUCCESS`]), so any value a C caller passes is representable and can be
//! validated instead of being undefined behaviour. Each newtype knows the C prefix of its values
//! ([`Status::C_PREFIX`]) and lists them ([`Status::VALUES`]); a test compares that list with the
//! header.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::fmt;
use std::mem::{align_of, offset_of, size_of};

use kreplay_ctxmask::ContextId;
use static_assertions::{assert_eq_align, assert_eq_size, const_assert, const_assert_eq};

/// Major version of the C ABI (`KREPLAY_VERSION_MAJOR`).
pub const VERSION_MAJOR: u32 = 0;
/// Minor version of the C ABI (`KREPLAY_VERSION_MINOR`).
pub const VERSION_MINOR: u32 = 1;
/// Patch version of the C ABI (`KREPLAY_VERSION_PATCH`).
pub const VERSION_PATCH: u32 = 0;
/// The version as one number, `major * 10000 + minor * 100 + patch` (`KREPLAY_VERSION`).
pub const VERSION: u32 = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH;
/// The version as a string, handed to `kreplay_configure` as `runtime_version`.
pub const VERSION_STRING: &CStr = c"0.1.0";
/// `replay_pass` of a dispatch that is not replayed (`KREPLAY_REPLAY_PASS_NONE`).
pub const REPLAY_PASS_NONE: u64 = u64::MAX;
/// The cap on passes per dispatch when `KREPLAY_MAX_PASSES` is not set
/// (`KREPLAY_DEFAULT_MAX_PASSES`).
pub const DEFAULT_MAX_PASSES: u64 = kreplay_passloop::DEFAULT_MAX_PASSES;

/// Defines a transparent integer newtype standing for a C enumeration.
macro_rules! abi_enum {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($repr:ty);
        prefix = $prefix:literal;
        last = $last:literal;
        $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $label:literal, )*
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub $repr);

        impl $name {
            $( $(#[$vmeta])* pub const $variant: $name = $name($value); )*
            /// One past the last value (grows as values are appended).
            pub const LAST: $name = $name($last);
            /// The prefix of the C identifiers of these values.
            pub const C_PREFIX: &'static str = $prefix;
            /// Every value with the suffix of its C identifier (`C_PREFIX` + suffix), `LAST`
            /// included.
            pub const VALUES: &'static [(&'static str, $name)] =
                &[ $( (stringify!($variant), $name::$variant), )* ("LAST", $name::LAST) ];

            /// The label of a named value (`LAST` and unknown values have none).
            pub fn label(self) -> Option<&'static CStr> {
                match self {
                    $( $name::$variant => Some($label), )*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.label() {
                    Some(label) => write!(f, "{}({})", stringify!($name), label.to_string_lossy()),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

abi_enum! {
    /// `kreplay_status_t`: the result of every C function.
    pub struct Status(i32);
    prefix = "KREPLAY_STATUS_";
    last = 14;
    /// The call succeeded.
    SUCCESS = 0 => c"KREPLAY_STATUS_SUCCESS",
    /// An unspecified internal error (including a fault caught at the C boundary).
    ERROR = 1 => c"KREPLAY_STATUS_ERROR",
    /// A replay context toggle was called outside PASS ENTER.
    ERROR_CONTEXT_ERROR = 2 => c"KREPLAY_STATUS_ERROR_CONTEXT_ERROR",
    /// A replay context toggle named a context not started when the replay began.
    ERROR_CONTEXT_NOT_STARTED = 3 => c"KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED",
    /// The kind is already configured on the context (or KERNEL_REPLAY on another context).
    ERROR_SERVICE_ALREADY_CONFIGURED = 4 => c"KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED",
    /// The context id is unknown.
    ERROR_CONTEXT_NOT_FOUND = 5 => c"KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND",
    /// An argument is invalid.
    ERROR_INVALID_ARGUMENT = 6 => c"KREPLAY_STATUS_ERROR_INVALID_ARGUMENT",
    /// Configuration is closed.
    ERROR_CONFIGURATION_LOCKED = 7 => c"KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED",
    /// kreplay is not loaded into a runtime yet (the counter functions need its agents).
    ERROR_NOT_INITIALIZED = 8 => c"KREPLAY_STATUS_ERROR_NOT_INITIALIZED",
    /// Replay of a dispatch was declined; it ran once.
    ERROR_REPLAY_DECLINED = 9 => c"KREPLAY_STATUS_ERROR_REPLAY_DECLINED",
    /// A restore between passes failed: application data was lost.
    ERROR_RESTORE_FAILED = 10 => c"KREPLAY_STATUS_ERROR_RESTORE_FAILED",
    /// Out of memory or another resource.
    ERROR_OUT_OF_RESOURCES = 11 => c"KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES",
    /// The counters cannot be counted in one pass (an agent's per-pass limit).
    ERROR_EXCEEDS_PASS_LIMIT = 12 => c"KREPLAY_STATUS_ERROR_EXCEEDS_PASS_LIMIT",
    /// The context's tool has been finalized: its contexts stay stopped.
    ERROR_FINALIZED = 13 => c"KREPLAY_STATUS_ERROR_FINALIZED",
}

impl Status {
    /// Is this [`Status::SUCCESS`]?
    pub const fn is_success(self) -> bool {
        self.0 == Status::SUCCESS.0
    }

    /// The C identifier of this status, `KREPLAY_STATUS_UNKNOWN` for unknown values.
    pub fn name(self) -> &'static CStr {
        self.label().unwrap_or(c"KREPLAY_STATUS_UNKNOWN")
    }

    /// A short human-readable description of this status.
    pub fn description(self) -> &'static CStr {
        match self {
            Status::SUCCESS => c"success",
            Status::ERROR => c"internal error",
            Status::ERROR_CONTEXT_ERROR => {
                c"context toggle called outside PASS ENTER of a kernel replay; nothing changed"
            }
            Status::ERROR_CONTEXT_NOT_STARTED => {
                c"context was not started when the kernel replay began"
            }
            Status::ERROR_SERVICE_ALREADY_CONFIGURED => c"service is already configured",
            Status::ERROR_CONTEXT_NOT_FOUND => c"context not found",
            Status::ERROR_INVALID_ARGUMENT => c"invalid argument",
            Status::ERROR_CONFIGURATION_LOCKED => {
                c"configuration is locked: tool initialization has ended"
            }
            Status::ERROR_NOT_INITIALIZED => {
                c"kreplay is not loaded into a runtime yet: its agents are not known (call the \
                  counter functions from a callback, not from initialize)"
            }
            Status::ERROR_REPLAY_DECLINED => c"kernel replay declined; the dispatch ran once",
            Status::ERROR_RESTORE_FAILED => {
                c"restoring memory between passes failed; application data was lost"
            }
            Status::ERROR_OUT_OF_RESOURCES => c"out of memory or another resource",
            Status::ERROR_EXCEEDS_PASS_LIMIT => {
                c"the counters cannot be counted in one pass: a block's per-pass limit is exceeded"
            }
            Status::ERROR_FINALIZED => {
                c"the context's tool has been finalized: its contexts cannot be started again"
            }
            _ => c"unknown kreplay status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.description().to_string_lossy(),
            self.name().to_string_lossy()
        )
    }
}

abi_enum! {
    /// `kreplay_callback_tracing_kind_t`.
    pub struct CallbackKind(u32);
    prefix = "KREPLAY_CALLBACK_TRACING_";
    last = 3;
    /// Not a kind.
    NONE = 0 => c"NONE",
    /// Kernel dispatches (operations: [`KernelDispatchOperation`]).
    KERNEL_DISPATCH = 1 => c"KERNEL_DISPATCH",
    /// Kernel replay (operations: [`KernelReplayOperation`]).
    KERNEL_REPLAY = 2 => c"KERNEL_REPLAY",
}

impl CallbackKind {
    /// Can a service of this kind be configured (a real kind, not NONE or out of range)?
    pub const fn is_configurable(self) -> bool {
        self.0 > CallbackKind::NONE.0 && self.0 < CallbackKind::LAST.0
    }

    /// One past the last operation of this kind (0 for a kind that is not configurable).
    pub const fn operation_limit(self) -> u32 {
        match self {
            CallbackKind::KERNEL_DISPATCH => KernelDispatchOperation::LAST.0,
            CallbackKind::KERNEL_REPLAY => KernelReplayOperation::LAST.0,
            _ => 0,
        }
    }

    /// The name of operation `operation` of this kind (None when unknown).
    pub fn operation_name(self, operation: u32) -> Option<&'static CStr> {
        match self {
            CallbackKind::KERNEL_DISPATCH => KernelDispatchOperation(operation).label(),
            CallbackKind::KERNEL_REPLAY => KernelReplayOperation(operation).label(),
            _ => None,
        }
    }
}

abi_enum! {
    /// `kreplay_kernel_dispatch_operation_t`: operations of KERNEL_DISPATCH.
    pub struct KernelDispatchOperation(u32);
    prefix = "KREPLAY_KERNEL_DISPATCH_";
    last = 3;
    /// Not an operation.
    NONE = 0 => c"NONE",
    /// ENTER before the packet is submitted, EXIT right after (once per pass).
    ENQUEUE = 1 => c"ENQUEUE",
    /// Phase NONE: the dispatch (of one pass) completed.
    COMPLETE = 2 => c"COMPLETE",
}

abi_enum! {
    /// `kreplay_kernel_replay_operation_t`: operations of KERNEL_REPLAY (ABI: only appended).
    pub struct KernelReplayOperation(u32);
    prefix = "KREPLAY_KERNEL_REPLAY_";
    last = 5;
    /// Not an operation.
    NONE = 0 => c"NONE",
    /// The tool decides the pass count (ENTER); the dispatch's replay is over (EXIT).
    CONFIG = 1 => c"CONFIG",
    /// Around each pass.
    PASS = 2 => c"PASS",
    /// Around taking the snapshot.
    SNAPSHOT = 3 => c"SNAPSHOT",
    /// Around each restore.
    RESTORE = 4 => c"RESTORE",
}

abi_enum! {
    /// `kreplay_callback_phase_t`.
    pub struct CallbackPhase(u32);
    prefix = "KREPLAY_CALLBACK_PHASE_";
    last = 3;
    /// A single callback without a pair.
    NONE = 0 => c"NONE",
    /// Before the operation.
    ENTER = 1 => c"ENTER",
    /// After the operation.
    EXIT = 2 => c"EXIT",
}

abi_enum! {
    /// `kreplay_replay_decline_reason_t`: why a dispatch ran once instead of being replayed.
    pub struct DeclineReason(u32);
    prefix = "KREPLAY_REPLAY_DECLINE_";
    last = 10;
    /// Not declined.
    NONE = 0 => c"none",
    /// The kernel may touch memory kreplay does not track.
    UNTRACKED_MEMORY = 1 => c"untracked_memory",
    /// The snapshot would exceed the budget or the memory available.
    FOOTPRINT_BUDGET = 2 => c"footprint_budget",
    /// Taking the snapshot failed.
    SNAPSHOT_FAILED = 3 => c"snapshot_failed",
    /// The dispatch's queue did not drain in time.
    QUEUE_DRAIN_STUCK = 4 => c"queue_drain_stuck",
    /// A sibling queue or async copy on the agent did not drain in time.
    AGENT_DRAIN_STUCK = 5 => c"agent_drain_stuck",
    /// A pass or its completion handlers did not finish in time.
    PASS_DRAIN_STUCK = 6 => c"pass_drain_stuck",
    /// Issued from inside a replay callback on the same agent.
    REENTRANT_DISPATCH = 7 => c"reentrant_dispatch",
    /// The pass count was invalid (0 without a continue callback).
    INVALID_PASS_COUNT = 8 => c"invalid_pass_count",
    /// A graph launch or multi-packet batch.
    BATCH_OR_GRAPH = 9 => c"batch_or_graph",
}

impl DeclineReason {
    /// The short name of the reason (`"unknown"` for values out of range).
    pub fn as_cstr(self) -> &'static CStr {
        self.label().unwrap_or(c"unknown")
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_cstr().to_string_lossy())
    }
}

abi_enum! {
    /// `kreplay_snapshot_tier_t`: where a snapshot is kept.
    pub struct SnapshotTier(u32);
    prefix = "KREPLAY_SNAPSHOT_TIER_";
    last = 5;
    /// No snapshot.
    NONE = 0 => c"none",
    /// A shadow copy in the agent's own memory.
    DEVICE = 1 => c"device",
    /// Pinned or ordinary host memory.
    HOST = 2 => c"host",
    /// A memory-mapped spill file.
    FILE = 3 => c"file",
    /// Spread over more than one tier.
    MIXED = 4 => c"mixed",
}

abi_enum! {
    /// `kreplay_restore_strategy_t`: how memory is restored between passes.
    pub struct RestoreStrategy(u32);
    prefix = "KREPLAY_RESTORE_STRATEGY_";
    last = 4;
    /// No restore.
    NONE = 0 => c"none",
    /// Every snapshotted byte is copied back.
    FULL = 1 => c"full",
    /// Chunks whose hash changed are copied back.
    HASH = 2 => c"hash",
    /// Chunks of the write set learned from pass 0 are copied back.
    WRITESET = 3 => c"writeset",
}

abi_enum! {
    /// `kreplay_replay_outcome_t`: how a dispatch's replay ended (CONFIG EXIT).
    pub struct ReplayOutcomeKind(u32);
    prefix = "KREPLAY_REPLAY_OUTCOME_";
    last = 7;
    /// Not known yet (every record but CONFIG EXIT).
    NONE = 0 => c"none",
    /// Replayed: every planned pass ran, or the tool's continue callback stopped the loop.
    REPLAYED = 1 => c"replayed",
    /// Not replayed by the tool's choice (no pass-count callback, or one pass): ran once.
    RAN_ONCE = 2 => c"ran_once",
    /// Replay was declined (see the decline reason): ran once, memory untouched by replay.
    DECLINED = 3 => c"declined",
    /// kreplay ended the loop before the tool's plan (see the end reason: the cap on passes or
    /// the time budget); memory is as after one run.
    ENDED_EARLY = 4 => c"ended_early",
    /// A pass could not be run or waited for; the loop stopped.
    PASS_FAILED = 5 => c"pass_failed",
    /// A restore between passes failed: application data was lost (see `bytes_lost`).
    RESTORE_FAILED = 6 => c"restore_failed",
}

abi_enum! {
    /// `kreplay_replay_end_t`: why the passes of a replay stopped (CONFIG EXIT).
    pub struct ReplayEnd(u32);
    prefix = "KREPLAY_REPLAY_END_";
    last = 6;
    /// No passes ran to an end (not replayed, or failed).
    NONE = 0 => c"none",
    /// All N passes ran.
    LAST_PASS = 1 => c"last_pass",
    /// The tool's continue callback returned 0.
    CONTINUE_STOPPED = 2 => c"continue_stopped",
    /// An indefinite loop's continue callback was cleared at PASS EXIT.
    CONTINUE_CLEARED = 3 => c"continue_cleared",
    /// An indefinite loop reached KREPLAY_MAX_PASSES.
    MAX_PASSES = 4 => c"max_passes",
    /// KREPLAY_REPLAY_BUDGET_MS was spent; no further pass was started.
    BUDGET = 5 => c"budget",
}

/// `kreplay_context_id_t`: a context as the C ABI names it (handle 0 is never valid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextHandle {
    /// The context's id.
    pub handle: u64,
}

impl From<ContextId> for ContextHandle {
    fn from(id: ContextId) -> Self {
        ContextHandle { handle: id.0 }
    }
}

impl From<ContextHandle> for ContextId {
    fn from(handle: ContextHandle) -> Self {
        ContextId(handle.handle)
    }
}

/// `kreplay_agent_id_t`: a GPU agent as the backend names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId {
    /// The backend's handle of the agent.
    pub handle: u64,
}

/// `kreplay_queue_id_t`: a queue as the backend names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId {
    /// The backend's handle of the queue.
    pub handle: u64,
}

/// `kreplay_user_data_t`: a tool's own value or pointer carried between callbacks.
#[repr(C)]
#[derive(Clone, Copy)]
pub union UserData {
    /// As an integer.
    pub value: u64,
    /// As a pointer.
    pub ptr: *mut c_void,
}

impl UserData {
    /// The all-zero user data every operation starts with.
    pub const ZERO: UserData = UserData { value: 0 };

    /// The stored bits as an integer (whichever member the tool wrote).
    pub fn bits(&self) -> u64 {
        // SAFETY: both members are 8 bytes of plain data on the supported 64-bit targets, so
        // reading the integer member is defined whichever member was written.
        unsafe { self.value }
    }
}

impl Default for UserData {
    fn default() -> Self {
        UserData::ZERO
    }
}

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData({:#x})", self.bits())
    }
}

/// `kreplay_dim3_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// X extent.
    pub x: u32,
    /// Y extent.
    pub y: u32,
    /// Z extent.
    pub z: u32,
}

/// `kreplay_kernel_dispatch_info_t`: one kernel dispatch (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelDispatchInfo {
    /// `size_of::<KernelDispatchInfo>()`.
    pub size: u64,
    /// The agent the kernel runs on.
    pub agent_id: AgentId,
    /// The queue the dispatch was submitted to.
    pub queue_id: QueueId,
    /// The kernel.
    pub kernel_id: u64,
    /// Process-unique dispatch id (same for every pass).
    pub dispatch_id: u64,
    /// Private memory per work-item in bytes.
    pub private_segment_size: u32,
    /// Group memory per work-group in bytes.
    pub group_segment_size: u32,
    /// Work-items per work-group.
    pub workgroup_size: Dim3,
    /// Work-items in the grid.
    pub grid_size: Dim3,
    /// Reserved, zero.
    pub reserved_padding: [u8; 56],
}

impl Default for KernelDispatchInfo {
    /// All fields zero except `size`.
    fn default() -> Self {
        KernelDispatchInfo {
            size: size_of::<KernelDispatchInfo>() as u64,
            agent_id: AgentId::default(),
            queue_id: QueueId::default(),
            kernel_id: 0,
            dispatch_id: 0,
            private_segment_size: 0,
            group_segment_size: 0,
            workgroup_size: Dim3::default(),
            grid_size: Dim3::default(),
            reserved_padding: [0; 56],
        }
    }
}

/// `kreplay_pass_count_cb_t`.
pub type PassCountFn = Option<unsafe extern "C" fn(KernelDispatchInfo, UserData) -> u64>;
/// `kreplay_continue_cb_t`.
pub type ContinueFn = Option<unsafe extern "C" fn(KernelDispatchInfo, u64, u64, UserData) -> c_int>;
/// `kreplay_context_toggle_cb_t`.
pub type ContextToggleFn = Option<unsafe extern "C" fn(ContextHandle) -> Status>;

/// `kreplay_callback_tracing_kernel_replay_data_t`: payload of KERNEL_REPLAY CONFIG and PASS
/// records (216 bytes: the first 184, then the CONFIG EXIT outcome).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelReplayData {
    /// `size_of::<KernelReplayData>()`.
    pub size: u64,
    /// The dispatch being replayed.
    pub dispatch_info: KernelDispatchInfo,
    /// PASS: 0-based pass index; CONFIG EXIT: passes that ran.
    pub current_pass: u64,
    /// PASS: N, or 0 if indefinite.
    pub total_passes: u64,
    /// CONFIG ENTER: set by the tool.
    pub replay_pass_count: PassCountFn,
    /// CONFIG ENTER: set by the tool; PASS EXIT: may be overridden.
    pub replay_continue: ContinueFn,
    /// PASS ENTER: set by kreplay.
    pub replay_start_context: ContextToggleFn,
    /// PASS ENTER: set by kreplay.
    pub replay_stop_context: ContextToggleFn,
    /// CONFIG EXIT: how the replay ended.
    pub outcome: ReplayOutcomeKind,
    /// CONFIG EXIT: why the passes stopped.
    pub end_reason: ReplayEnd,
    /// CONFIG EXIT: SUCCESS, ERROR_REPLAY_DECLINED, ERROR (a pass failed) or
    /// ERROR_RESTORE_FAILED.
    pub status: Status,
    /// CONFIG EXIT of a declined replay or failed pass: why.
    pub decline_reason: DeclineReason,
    /// CONFIG EXIT: passes that ran (1 when the dispatch ran once).
    pub passes_run: u64,
    /// CONFIG EXIT after a failed restore: bytes that could not be restored.
    pub bytes_lost: u64,
}

impl KernelReplayData {
    /// A payload for `dispatch_info` with every other field zero.
    pub fn new(dispatch_info: KernelDispatchInfo) -> Self {
        KernelReplayData {
            size: size_of::<KernelReplayData>() as u64,
            dispatch_info,
            current_pass: 0,
            total_passes: 0,
            replay_pass_count: None,
            replay_continue: None,
            replay_start_context: None,
            replay_stop_context: None,
            outcome: ReplayOutcomeKind::NONE,
            end_reason: ReplayEnd::NONE,
            status: Status::SUCCESS,
            decline_reason: DeclineReason::NONE,
            passes_run: 0,
            bytes_lost: 0,
        }
    }
}

/// `kreplay_callback_tracing_kernel_replay_memory_data_t`: payload of KERNEL_REPLAY SNAPSHOT and
/// RESTORE records (280 bytes: the per-source fields from byte 216 on were appended).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelReplayMemoryData {
    /// `size_of::<KernelReplayMemoryData>()`.
    pub size: u64,
    /// The dispatch being replayed.
    pub dispatch_info: KernelDispatchInfo,
    /// RESTORE: the pass whose writes are undone; SNAPSHOT: 0.
    pub current_pass: u64,
    /// Bytes the snapshot covers.
    pub bytes_planned: u64,
    /// EXIT: bytes actually copied.
    pub bytes_moved: u64,
    /// Memory regions in the snapshot.
    pub regions: u64,
    /// RESTORE EXIT: chunks copied back.
    pub chunks_restored: u64,
    /// Where the snapshot lives.
    pub tier: SnapshotTier,
    /// How restores are done.
    pub strategy: RestoreStrategy,
    /// EXIT: success, [`Status::ERROR_REPLAY_DECLINED`] or [`Status::ERROR_RESTORE_FAILED`].
    pub status: Status,
    /// SNAPSHOT EXIT when declined: why.
    pub decline_reason: DeclineReason,
    /// RESTORE EXIT when failed: bytes that could not be restored.
    pub bytes_lost: u64,
    /// RESTORE EXIT: chunks found changed outside the learned write set and written back (a
    /// repair; included in `chunks_restored`).
    pub chunks_repaired: u64,
    /// RESTORE EXIT: 1 when the restore wrote a learned write set without checking the rest of
    /// the footprint (`KREPLAY_RESTORE=writeset-unverified`), else 0.
    pub unverified: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// SNAPSHOT ENTER/EXIT: regions selected as the agent's own memory (KREPLAY_SNAPSHOT_SCOPE=agent).
    pub agent_regions: u64,
    /// SNAPSHOT ENTER/EXIT: bytes of those regions.
    pub agent_bytes: u64,
    /// SNAPSHOT ENTER/EXIT: further allocations a kernel argument points into (any owner or kind).
    pub referenced_regions: u64,
    /// SNAPSHOT ENTER/EXIT: bytes of those regions.
    pub referenced_bytes: u64,
    /// SNAPSHOT ENTER/EXIT: writable module-scope variables of executables loaded on the agent, or reached by an argument.
    pub module_variable_regions: u64,
    /// SNAPSHOT ENTER/EXIT: bytes of those variables.
    pub module_variable_bytes: u64,
    /// SNAPSHOT ENTER/EXIT: allocations kreplay never saw allocated, adopted with the runtime's base and size.
    pub adopted_regions: u64,
    /// SNAPSHOT ENTER/EXIT: bytes of those regions.
    pub adopted_bytes: u64,
}

impl KernelReplayMemoryData {
    /// A payload for `dispatch_info` with every other field zero.
    pub fn new(dispatch_info: KernelDispatchInfo) -> Self {
        KernelReplayMemoryData {
            size: size_of::<KernelReplayMemoryData>() as u64,
            dispatch_info,
            current_pass: 0,
            bytes_planned: 0,
            bytes_moved: 0,
            regions: 0,
            chunks_restored: 0,
            tier: SnapshotTier::NONE,
            strategy: RestoreStrategy::NONE,
            status: Status::SUCCESS,
            decline_reason: DeclineReason::NONE,
            bytes_lost: 0,
            chunks_repaired: 0,
            unverified: 0,
            reserved: 0,
            agent_regions: 0,
            agent_bytes: 0,
            referenced_regions: 0,
            referenced_bytes: 0,
            module_variable_regions: 0,
            module_variable_bytes: 0,
            adopted_regions: 0,
            adopted_bytes: 0,
        }
    }
}

/// `kreplay_counters_t`: what replay did in this process so far (`kreplay_get_counters`).
///
/// The caller sets `size` to the bytes it provides; kreplay fills that much (at most its own
/// size) and sets `size` to the bytes it filled. Fields are only ever appended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    /// In: bytes the caller provides. Out: bytes kreplay filled in.
    pub size: u64,
    /// Dispatches that went through the replay loop (a KERNEL_REPLAY service was configured).
    pub dispatches: u64,
    /// Dispatches replayed (outcome REPLAYED or ENDED_EARLY).
    pub replays: u64,
    /// Passes run in all replays.
    pub passes: u64,
    /// Dispatches the tool chose to run once (no pass-count callback, or one pass).
    pub ran_once: u64,
    /// Replays declined (every reason).
    pub declines: u64,
    /// Replays kreplay ended early (cap on passes, time budget).
    pub ended_early: u64,
    /// Replays stopped by a pass that failed.
    pub pass_failures: u64,
    /// Replays stopped by a failed restore.
    pub restore_failures: u64,
    /// Bytes copied into snapshots.
    pub bytes_snapshotted: u64,
    /// Bytes written back by restores.
    pub bytes_restored: u64,
    /// Bytes failed restores could not write back.
    pub bytes_lost: u64,
    /// Chunks written outside a learned write set and repaired by a verified restore.
    pub chunks_repaired: u64,
    /// Restores that skipped verification (`KREPLAY_RESTORE=writeset-unverified`).
    pub unverified_restores: u64,
    /// Declines per reason, indexed by `kreplay_replay_decline_reason_t` (entry 0 unused).
    pub declines_by_reason: [u64; 16],
}

impl Default for Counters {
    /// All zero except `size`.
    fn default() -> Self {
        Counters {
            size: size_of::<Counters>() as u64,
            dispatches: 0,
            replays: 0,
            passes: 0,
            ran_once: 0,
            declines: 0,
            ended_early: 0,
            pass_failures: 0,
            restore_failures: 0,
            bytes_snapshotted: 0,
            bytes_restored: 0,
            bytes_lost: 0,
            chunks_repaired: 0,
            unverified_restores: 0,
            declines_by_reason: [0; 16],
        }
    }
}

/// `kreplay_callback_tracing_kernel_dispatch_data_t`: payload of KERNEL_DISPATCH records
/// (160 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelDispatchData {
    /// `size_of::<KernelDispatchData>()`.
    pub size: u64,
    /// The dispatch.
    pub dispatch_info: KernelDispatchInfo,
    /// COMPLETE: start of execution in nanoseconds (0 if unknown).
    pub start_timestamp: u64,
    /// COMPLETE: end of execution in nanoseconds (0 if unknown).
    pub end_timestamp: u64,
    /// 0-based pass index, or [`REPLAY_PASS_NONE`] when not replayed.
    pub replay_pass: u64,
}

impl KernelDispatchData {
    /// A payload for a dispatch that is not replayed (`replay_pass` = [`REPLAY_PASS_NONE`]).
    pub fn new(dispatch_info: KernelDispatchInfo) -> Self {
        KernelDispatchData {
            size: size_of::<KernelDispatchData>() as u64,
            dispatch_info,
            start_timestamp: 0,
            end_timestamp: 0,
            replay_pass: REPLAY_PASS_NONE,
        }
    }
}

/// `kreplay_callback_tracing_record_t`: one callback record (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallbackRecord {
    /// The context whose service produced the record.
    pub context_id: ContextHandle,
    /// OS id of the calling thread.
    pub thread_id: u64,
    /// Equal for every record of one operation.
    pub correlation_id: u64,
    /// The kind.
    pub kind: CallbackKind,
    /// An operation of `kind`.
    pub operation: u32,
    /// The phase.
    pub phase: CallbackPhase,
    /// KERNEL_REPLAY CONFIG EXIT: why the dispatch was not replayed.
    pub decline_reason: DeclineReason,
    /// The payload for this kind and operation.
    pub payload: *mut c_void,
}

/// `kreplay_callback_tracing_cb_t`.
pub type CallbackFn = unsafe extern "C" fn(CallbackRecord, *mut UserData, *mut c_void);

/// `kreplay_client_id_t`: identifies a tool.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ClientId {
    /// Set by the tool (static storage) or NULL.
    pub name: *const c_char,
    /// Set by kreplay.
    pub handle: u32,
}

/// `kreplay_client_finalize_t`.
pub type ClientFinalizeFn = Option<unsafe extern "C" fn(ClientId)>;
/// `kreplay_tool_initialize_t`.
pub type ToolInitializeFn = Option<unsafe extern "C" fn(ClientFinalizeFn, *mut c_void) -> c_int>;
/// `kreplay_tool_finalize_t`.
pub type ToolFinalizeFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `kreplay_tool_configure_result_t`: what a tool's `kreplay_configure` returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ToolConfigureResult {
    /// `size_of::<ToolConfigureResult>()`.
    pub size: usize,
    /// Called once after every tool was configured.
    pub initialize: ToolInitializeFn,
    /// Called once at shutdown.
    pub finalize: ToolFinalizeFn,
    /// Passed to initialize and finalize.
    pub tool_data: *mut c_void,
}

/// `kreplay_configure_func_t` (never NULL on the Rust side).
pub type ConfigureFn =
    unsafe extern "C" fn(u32, *const c_char, u32, *mut ClientId) -> *mut ToolConfigureResult;

// ------------------------------------------------------------------------------------------------
// Dispatch counter collection
// ------------------------------------------------------------------------------------------------

/// `kreplay_counter_id_t`: a counter of an agent (handle 0 is never valid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId {
    /// The counter's index in its agent's catalogue, plus one.
    pub handle: u64,
}

/// `kreplay_counter_config_id_t`: a set of counters of one agent, counted together in one pass
/// (handle 0: no configuration).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterConfigId {
    /// kreplay's handle of the configuration.
    pub handle: u64,
}

/// `kreplay_counter_info_t`: one counter of an agent (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CounterInfo {
    /// `size_of::<CounterInfo>()`.
    pub size: u64,
    /// The counter.
    pub id: CounterId,
    /// Its name (static storage).
    pub name: *const c_char,
    /// What it counts (static storage).
    pub description: *const c_char,
    /// The hardware block it is counted in (static storage).
    pub block: *const c_char,
    /// How many counters of `block` one pass can count.
    pub block_limit: u32,
    /// 1 if computed from other counters of the same pass.
    pub is_derived: u32,
}

/// `kreplay_counter_record_t`: one counter's value for one pass of one dispatch (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterRecord {
    /// `size_of::<CounterRecord>()`.
    pub size: u64,
    /// The counter.
    pub counter_id: CounterId,
    /// The dispatch (as in its dispatch info and dispatch-tracing records).
    pub dispatch_id: u64,
    /// The 0-based pass, or `REPLAY_PASS_NONE` for a dispatch that was not replayed.
    pub replay_pass: u64,
    /// The agent that ran it.
    pub agent_id: AgentId,
    /// The context whose service counted it.
    pub context_id: ContextHandle,
    /// The value.
    pub value: f64,
}

/// `kreplay_agent_counters_cb_t`: receives an agent's counters (valid during the call).
pub type AgentCountersFn =
    unsafe extern "C" fn(AgentId, *const CounterInfo, usize, *mut c_void) -> Status;

/// `kreplay_dispatch_counting_cb_t`: at dispatch time, picks the configuration a dispatch (one
/// pass of it) counts by writing `*config` (left at handle 0: nothing).
pub type DispatchCountingFn =
    unsafe extern "C" fn(KernelDispatchInfo, u64, *mut CounterConfigId, *mut c_void);

/// `kreplay_counter_record_cb_t`: the values one dispatch (one pass of it) counted.
pub type CounterRecordFn =
    unsafe extern "C" fn(KernelDispatchInfo, *const CounterRecord, usize, *mut c_void);

// ------------------------------------------------------------------------------------------------
// Layout checks (docs/abi.md §2). The C test `tests/c/layout.c` asserts the same numbers.
// ------------------------------------------------------------------------------------------------

/// The size of the field `select` picks out of a `T` (usable in constants).
const fn field_size<T, F>(_select: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Asserts a field's offset and size.
macro_rules! check_field {
    ($type:ty, $field:ident, $offset:expr, $size:expr) => {
        const_assert_eq!(offset_of!($type, $field), $offset);
        const_assert_eq!(field_size(|value: &$type| &value.$field), $size);
    };
}

const_assert_eq!(size_of::<usize>(), 8);
assert_eq_size!(Status, i32);
assert_eq_size!(CallbackKind, u32);
assert_eq_size!(DeclineReason, u32);
assert_eq_size!(ReplayOutcomeKind, u32);
assert_eq_size!(ReplayEnd, u32);

assert_eq_size!(ContextHandle, u64);
assert_eq_size!(AgentId, u64);
assert_eq_size!(QueueId, u64);
assert_eq_align!(ContextHandle, u64);
check_field!(ContextHandle, handle, 0, 8);
check_field!(AgentId, handle, 0, 8);
check_field!(QueueId, handle, 0, 8);
assert_eq_size!(UserData, u64);
assert_eq_align!(UserData, u64);
const_assert_eq!(offset_of!(UserData, value), 0);
const_assert_eq!(offset_of!(UserData, ptr), 0);
assert_eq_size!(Dim3, [u32; 3]);
assert_eq_align!(Dim3, u32);
check_field!(Dim3, x, 0, 4);
check_field!(Dim3, y, 4, 4);
check_field!(Dim3, z, 8, 4);

assert_eq_size!(KernelDispatchInfo, [u8; 128]);
assert_eq_align!(KernelDispatchInfo, u64);
check_field!(KernelDispatchInfo, size, 0, 8);
check_field!(KernelDispatchInfo, agent_id, 8, 8);
check_field!(KernelDispatchInfo, queue_id, 16, 8);
check_field!(KernelDispatchInfo, kernel_id, 24, 8);
check_field!(KernelDispatchInfo, dispatch_id, 32, 8);
check_field!(KernelDispatchInfo, private_segment_size, 40, 4);
check_field!(KernelDispatchInfo, group_segment_size, 44, 4);
check_field!(KernelDispatchInfo, workgroup_size, 48, 12);
check_field!(KernelDispatchInfo, grid_size, 60, 12);
check_field!(KernelDispatchInfo, reserved_padding, 72, 56);

assert_eq_size!(KernelReplayData, [u8; 216]);
assert_eq_align!(KernelReplayData, u64);
check_field!(KernelReplayData, size, 0, 8);
check_field!(KernelReplayData, dispatch_info, 8, 128);
check_field!(KernelReplayData, current_pass, 136, 8);
check_field!(KernelReplayData, total_passes, 144, 8);
check_field!(KernelReplayData, replay_pass_count, 152, 8);
check_field!(KernelReplayData, replay_continue, 160, 8);
check_field!(KernelReplayData, replay_start_context, 168, 8);
check_field!(KernelReplayData, replay_stop_context, 176, 8);
check_field!(KernelReplayData, outcome, 184, 4);
check_field!(KernelReplayData, end_reason, 188, 4);
check_field!(KernelReplayData, status, 192, 4);
check_field!(KernelReplayData, decline_reason, 196, 4);
check_field!(KernelReplayData, passes_run, 200, 8);
check_field!(KernelReplayData, bytes_lost, 208, 8);

assert_eq_size!(KernelReplayMemoryData, [u8; 280]);
assert_eq_align!(KernelReplayMemoryData, u64);
check_field!(KernelReplayMemoryData, size, 0, 8);
check_field!(KernelReplayMemoryData, dispatch_info, 8, 128);
check_field!(KernelReplayMemoryData, current_pass, 136, 8);
check_field!(KernelReplayMemoryData, bytes_planned, 144, 8);
check_field!(KernelReplayMemoryData, bytes_moved, 152, 8);
check_field!(KernelReplayMemoryData, regions, 160, 8);
check_field!(KernelReplayMemoryData, chunks_restored, 168, 8);
check_field!(KernelReplayMemoryData, tier, 176, 4);
check_field!(KernelReplayMemoryData, strategy, 180, 4);
check_field!(KernelReplayMemoryData, status, 184, 4);
check_field!(KernelReplayMemoryData, decline_reason, 188, 4);
check_field!(KernelReplayMemoryData, bytes_lost, 192, 8);
check_field!(KernelReplayMemoryData, chunks_repaired, 200, 8);
check_field!(KernelReplayMemoryData, unverified, 208, 4);
check_field!(KernelReplayMemoryData, reserved, 212, 4);
check_field!(KernelReplayMemoryData, agent_regions, 216, 8);
check_field!(KernelReplayMemoryData, agent_bytes, 224, 8);
check_field!(KernelReplayMemoryData, referenced_regions, 232, 8);
check_field!(KernelReplayMemoryData, referenced_bytes, 240, 8);
check_field!(KernelReplayMemoryData, module_variable_regions, 248, 8);
check_field!(KernelReplayMemoryData, module_variable_bytes, 256, 8);
check_field!(KernelReplayMemoryData, adopted_regions, 264, 8);
check_field!(KernelReplayMemoryData, adopted_bytes, 272, 8);

assert_eq_size!(Counters, [u8; 240]);
assert_eq_align!(Counters, u64);
check_field!(Counters, size, 0, 8);
check_field!(Counters, dispatches, 8, 8);
check_field!(Counters, replays, 16, 8);
check_field!(Counters, passes, 24, 8);
check_field!(Counters, ran_once, 32, 8);
check_field!(Counters, declines, 40, 8);
check_field!(Counters, ended_early, 48, 8);
check_field!(Counters, pass_failures, 56, 8);
check_field!(Counters, restore_failures, 64, 8);
check_field!(Counters, bytes_snapshotted, 72, 8);
check_field!(Counters, bytes_restored, 80, 8);
check_field!(Counters, bytes_lost, 88, 8);
check_field!(Counters, chunks_repaired, 96, 8);
check_field!(Counters, unverified_restores, 104, 8);
check_field!(Counters, declines_by_reason, 112, 128);
const_assert!(DeclineReason::LAST.0 as usize <= 16);

assert_eq_size!(KernelDispatchData, [u8; 160]);
assert_eq_align!(KernelDispatchData, u64);
check_field!(KernelDispatchData, size, 0, 8);
check_field!(KernelDispatchData, dispatch_info, 8, 128);
check_field!(KernelDispatchData, start_timestamp, 136, 8);
check_field!(KernelDispatchData, end_timestamp, 144, 8);
check_field!(KernelDispatchData, replay_pass, 152, 8);

assert_eq_size!(CallbackRecord, [u8; 48]);
assert_eq_align!(CallbackRecord, u64);
check_field!(CallbackRecord, context_id, 0, 8);
check_field!(CallbackRecord, thread_id, 8, 8);
check_field!(CallbackRecord, correlation_id, 16, 8);
check_field!(CallbackRecord, kind, 24, 4);
check_field!(CallbackRecord, operation, 28, 4);
check_field!(CallbackRecord, phase, 32, 4);
check_field!(CallbackRecord, decline_reason, 36, 4);
check_field!(CallbackRecord, payload, 40, 8);

assert_eq_size!(ClientId, [u64; 2]);
check_field!(ClientId, name, 0, 8);
check_field!(ClientId, handle, 8, 4);

assert_eq_size!(ToolConfigureResult, [u64; 4]);
check_field!(ToolConfigureResult, size, 0, 8);
check_field!(ToolConfigureResult, initialize, 8, 8);
check_field!(ToolConfigureResult, finalize, 16, 8);
check_field!(ToolConfigureResult, tool_data, 24, 8);

// Nullable function pointers are one pointer wide, as in C.
assert_eq_size!(PassCountFn, usize);
assert_eq_size!(ContinueFn, usize);
assert_eq_size!(ContextToggleFn, usize);
const_assert!(align_of::<PassCountFn>() == 8);
// Operation filters are 64-bit masks.
const_assert!(KernelReplayOperation::LAST.0 <= 64 && KernelDispatchOperation::LAST.0 <= 64);

assert_eq_size!(CounterId, u64);
assert_eq_size!(CounterConfigId, u64);
check_field!(CounterId, handle, 0, 8);
check_field!(CounterConfigId, handle, 0, 8);
assert_eq_size!(CounterInfo, [u8; 48]);
assert_eq_align!(CounterInfo, u64);
check_field!(CounterInfo, size, 0, 8);
check_field!(CounterInfo, id, 8, 8);
check_field!(CounterInfo, name, 16, 8);
check_field!(CounterInfo, description, 24, 8);
check_field!(CounterInfo, block, 32, 8);
check_field!(CounterInfo, block_limit, 40, 4);
check_field!(CounterInfo, is_derived, 44, 4);
assert_eq_size!(CounterRecord, [u8; 56]);
assert_eq_align!(CounterRecord, u64);
check_field!(CounterRecord, size, 0, 8);
check_field!(CounterRecord, counter_id, 8, 8);
check_field!(CounterRecord, dispatch_id, 16, 8);
check_field!(CounterRecord, replay_pass, 24, 8);
check_field!(CounterRecord, agent_id, 32, 8);
check_field!(CounterRecord, context_id, 40, 8);
check_field!(CounterRecord, value, 48, 8);
assert_eq_size!(AgentCountersFn, usize);
assert_eq_size!(DispatchCountingFn, usize);
assert_eq_size!(CounterRecordFn, usize);
