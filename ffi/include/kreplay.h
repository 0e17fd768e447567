/*
 * kreplay.h -- the C interface of kreplay (library `libkreplay`).
 *
 * kreplay replays one GPU kernel dispatch several times ("passes") so that a profiling tool can
 * collect a different set of data in each pass, restoring the device memory the kernel may touch
 * between passes so that the application cannot tell its kernel ran more than once.
 *
 * A tool is a shared library (or code linked into the application) that defines
 * `kreplay_configure`. kreplay calls it once at start-up; the tool answers with an initialize and a
 * finalize function. Inside initialize the tool creates contexts, configures callback tracing
 * services on them and starts them. Configuring services is only possible until every tool's
 * initialize has returned (afterwards: KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED).
 *
 * Kernel replay is one callback tracing kind (KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY). At most one
 * context in the process may configure it. For every dispatch it sees CONFIG ENTER and answers with
 * a pass-count callback (and optionally a continue callback); kreplay then takes a snapshot, runs
 * the passes (PASS ENTER / PASS EXIT around each, RESTORE ENTER / EXIT between them) and ends with
 * CONFIG EXIT. During PASS ENTER the tool may mask its other contexts on and off for the pass.
 *
 * docs/c-tools.md shows how to build, link and load a tool; docs/abi.md states the contract this
 * header implements (pass-count table, callback flow, safety rules, configuration).
 *
 * Conventions (the ABI promise):
 *  - Every enumeration value below is part of the ABI: values are only ever appended (each group's
 *    `_LAST` value grows), never renumbered. A tool must expect values it does not know (a newer
 *    library may report a new operation, decline reason or status) and ignore them.
 *  - Enumerations are carried in fixed-width integer typedefs (`kreplay_status_t` is int32_t, the
 *    others uint32_t) so their size never depends on the compiler.
 *  - Payload structures begin with `size` (the number of bytes kreplay filled in), are flat (no
 *    unions) and have every field that does not apply set to zero. Each record's payload is the
 *    tool's own copy: kreplay reads back only the fields a tool sets (replay_pass_count and
 *    replay_continue at CONFIG ENTER, replay_continue at PASS EXIT); whatever a tool writes
 *    anywhere else is ignored and reaches no other record, service or callback. Structures only grow by
 *    appending fields; an existing field never moves. A tool built against an older header reads
 *    the fields it knows; a tool built against a newer header checks `size` before reading a
 *    field an older library may not have filled in (offsetof(field) + sizeof(field) <= size).
 *  - The structure a tool hands to kreplay (kreplay_tool_configure_result_t) carries `size` too:
 *    kreplay rejects one smaller than it needs and ignores bytes it does not know.
 *  - Within one major version (KREPLAY_VERSION_MAJOR, the `0` of the SONAME libkreplay.so.0)
 *    functions are only added, never removed or changed.
 *  - Functions never abort the process: a failure is returned as a status. Out-pointers and
 *    arrays a tool passes are read and written without relying on their alignment (a field of a
 *    packed struct will do); an element count larger than any array can be (SIZE_MAX, say) is
 *    KREPLAY_STATUS_ERROR_INVALID_ARGUMENT.
 *  - kreplay supports 64-bit targets only; the layouts below are checked against that.
 *
 * When each function may be called:
 *  - Any time, from any thread, also inside callbacks (none of them blocks on a replay):
 *    kreplay_get_status_string, kreplay_get_status_name, kreplay_get_version,
 *    kreplay_get_callback_tracing_kind_name, kreplay_get_callback_tracing_operation_name,
 *    kreplay_get_decline_reason_string, kreplay_create_context, kreplay_start_context,
 *    kreplay_stop_context, kreplay_context_is_active, kreplay_is_initialized,
 *    kreplay_is_finalized, kreplay_get_counters. Starting or stopping a context takes effect for the next record
 *    kreplay delivers; inside a replay, prefer the PASS ENTER toggles, which only mask the
 *    current dispatch.
 *  - Until tool initialization ends (in practice: inside kreplay_configure or the tool's
 *    initialize): kreplay_configure_callback_tracing_service (afterwards
 *    KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED).
 *  - Before tool initialization begins: kreplay_force_configure (afterwards
 *    KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED).
 *  - Only during PASS ENTER, on the thread it is delivered on, and only through the payload's
 *    pointers: replay_start_context and replay_stop_context (elsewhere
 *    KREPLAY_STATUS_ERROR_CONTEXT_ERROR, nothing changes).
 *  - KREPLAY_STATUS_ERROR_NOT_INITIALIZED is returned only by the counter functions
 *    (kreplay_iterate_agent_counters, kreplay_create_counter_config, kreplay_plan_counter_passes)
 *    before kreplay is loaded into a runtime, whose agents they need: in a tool's initialize
 *    under ROCm-style loading that is the case; call them later (from CONFIG ENTER, say).
 *    Contexts can be created and queried before kreplay has initialized its tools.
 *  - A callback may submit GPU work. On the agent being replayed, such a dispatch runs exactly
 *    once, unreplayed (decline reason "reentrant_dispatch"); it never deadlocks.
 *
 * Threads:
 *  - kreplay_configure and every tool's initialize run one after another on the thread that
 *    loads kreplay (for HSA: the thread in hsa_init that calls OnLoad); finalize runs on the
 *    thread that unloads it (OnUnload, from hsa_shut_down), or on the thread that calls the
 *    client finalize function.
 *  - KERNEL_REPLAY records, the pass-count and continue callbacks, and the KERNEL_DISPATCH
 *    records of a replayed dispatch's passes run on the thread that submitted the dispatch (for
 *    HSA: the thread that rang the queue's doorbell), in the order docs/abi.md gives, never
 *    overlapping one another.
 *  - KERNEL_DISPATCH COMPLETE records of dispatches that were not replayed arrive on a thread of
 *    kreplay's own (for HSA; the runtime's asynchronous signal handler thread where the runtime
 *    lacks hsa_amd_signal_wait_any). Such a callback may wait for work it submits: the
 *    completions of that work are delivered on another thread.
 *  - Callbacks for different dispatches may run at the same time on different threads (replays on
 *    different agents run in parallel; ordinary dispatches are traced while another agent
 *    replays). A callback must be thread-safe and should return promptly: while a replay
 *    callback runs, the agent being replayed does no other work.
 *
 * Lifetimes of pointers:
 *  - `record.payload`: valid only for the duration of the callback; copy what you need.
 *  - `user_data` (the pointer argument of a callback): valid only during the callback; the value
 *    stored through it is carried from ENTER to EXIT of the same operation (and, for kernel
 *    replay, through every record and callback of the same dispatch).
 *  - `callback_data`, `tool_data`: the tool's own; kreplay never dereferences or frees them and
 *    passes them until the tool is finalized.
 *  - `operations` of kreplay_configure_callback_tracing_service: read during the call only.
 *  - `client_id->name`: read when kreplay_configure returns (kreplay keeps a copy of at most
 *    256 bytes: a longer name, or one without its NUL, is cut there); a string literal is the
 *    usual choice.
 *  - The kreplay_tool_configure_result_t returned by kreplay_configure: must stay valid until the
 *    tool's finalize has run (a `static` object is the usual choice).
 *  - Strings returned by kreplay (names, descriptions, `runtime_version`): static storage, never
 *    freed.
 *  - Function pointers kreplay puts into payloads (replay_start_context, replay_stop_context):
 *    callable while the record is delivered (PASS ENTER); calls at other times are refused.
 */
#ifndef KREPLAY_H
#define KREPLAY_H

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#if !defined(UINTPTR_MAX) || UINTPTR_MAX != UINT64_MAX
#error "kreplay supports 64-bit targets only"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================== */
/* Version                                                                                        */
/* ============================================================================================== */

/** Major version of this header (incompatible ABI changes). */
#define KREPLAY_VERSION_MAJOR 0
/** Minor version of this header (compatible additions). */
#define KREPLAY_VERSION_MINOR 1
/** Patch version of this header. */
#define KREPLAY_VERSION_PATCH 0
/** The version as one number: major * 10000 + minor * 100 + patch (passed to kreplay_configure). */
#define KREPLAY_VERSION                                                                            \
    (KREPLAY_VERSION_MAJOR * 10000 + KREPLAY_VERSION_MINOR * 100 + KREPLAY_VERSION_PATCH)

/* ============================================================================================== */
/* Status codes                                                                                   */
/* ============================================================================================== */

/** The result of every kreplay function (one of the KREPLAY_STATUS_* values). */
typedef int32_t kreplay_status_t;

/** Values of kreplay_status_t. */
enum kreplay_status_values {
    /** The call succeeded. */
    KREPLAY_STATUS_SUCCESS = 0,
    /** An unspecified internal error (including an internal fault caught at the boundary). */
    KREPLAY_STATUS_ERROR = 1,
    /** A replay context toggle was called outside PASS ENTER; nothing changed. */
    KREPLAY_STATUS_ERROR_CONTEXT_ERROR = 2,
    /** A replay context toggle named a context that was not started when the replay began. */
    KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED = 3,
    /** This service kind is already configured on this context, or (KERNEL_REPLAY) on another. */
    KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED = 4,
    /** The context id was never returned by kreplay_create_context. */
    KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND = 5,
    /** An argument is invalid: a NULL out-pointer, an unknown kind or operation, ... */
    KREPLAY_STATUS_ERROR_INVALID_ARGUMENT = 6,
    /** Configuration is closed: tool initialization has ended (or, for force_configure, begun). */
    KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED = 7,
    /** kreplay is not loaded into a runtime yet, whose agents the call needs: returned by the
     *  counter functions (kreplay_iterate_agent_counters, kreplay_create_counter_config,
     *  kreplay_plan_counter_passes) until then, e.g. from a tool's initialize under ROCm-style
     *  loading (see "When each function may be called" above). */
    KREPLAY_STATUS_ERROR_NOT_INITIALIZED = 8,
    /** Replay of a dispatch was declined (see kreplay_replay_decline_reason_t); it ran once. */
    KREPLAY_STATUS_ERROR_REPLAY_DECLINED = 9,
    /** Restoring memory between passes failed: application data was lost (reported loudly). */
    KREPLAY_STATUS_ERROR_RESTORE_FAILED = 10,
    /** kreplay ran out of memory or another resource. */
    KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES = 11,
    /** The counters cannot be counted together in one pass: a block of the agent counts fewer
     *  counters per pass (the block and its limit are logged; see kreplay_plan_counter_passes). */
    KREPLAY_STATUS_ERROR_EXCEEDS_PASS_LIMIT = 12,
    /** The context belongs to a tool that has been finalized (at shutdown, or early through its
     *  kreplay_client_finalize_t): its contexts stay stopped and nothing of it is called again. */
    KREPLAY_STATUS_ERROR_FINALIZED = 13,
    /** One past the last status value (grows as values are appended). */
    KREPLAY_STATUS_LAST = 14
};

/**
 * A short human-readable description of `status` (static storage, never NULL). Unknown values
 * give a description saying so.
 */
const char* kreplay_get_status_string(kreplay_status_t status);

/**
 * The identifier of `status`, e.g. "KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND" (static storage,
 * never NULL; "KREPLAY_STATUS_UNKNOWN" for unknown values).
 */
const char* kreplay_get_status_name(kreplay_status_t status);

/**
 * Writes the library's version numbers (any pointer may be NULL to skip that number).
 * Always returns KREPLAY_STATUS_SUCCESS.
 */
kreplay_status_t kreplay_get_version(uint32_t* major, uint32_t* minor, uint32_t* patch);

/* ============================================================================================== */
/* Basic types                                                                                    */
/* ============================================================================================== */

/** A context: a bundle of configured services that is started and stopped as one. Handle 0 is
 *  never a valid context. */
typedef struct kreplay_context_id_t {
    uint64_t handle;
} kreplay_context_id_t;

/** A GPU agent (device) as named by the backend (for HSA: the hsa_agent_t handle). */
typedef struct kreplay_agent_id_t {
    uint64_t handle;
} kreplay_agent_id_t;

/** A queue of an agent as named by the backend (for HSA: the `id` field of the application's
 *  hsa_queue_t, which the runtime assigns; not the queue's address). */
typedef struct kreplay_queue_id_t {
    uint64_t handle;
} kreplay_queue_id_t;

/** Storage a tool may use to carry its own value or pointer from one callback to the next. */
typedef union kreplay_user_data_t {
    uint64_t value;
    void* ptr;
} kreplay_user_data_t;

/** A three-dimensional size (work-items or work-groups). */
typedef struct kreplay_dim3_t {
    uint32_t x;
    uint32_t y;
    uint32_t z;
} kreplay_dim3_t;

/* ============================================================================================== */
/* Dispatch information                                                                           */
/* ============================================================================================== */

/** Describes one kernel dispatch. 128 bytes; the same `dispatch_id` is used for every pass. */
typedef struct kreplay_kernel_dispatch_info_t {
    /** sizeof(kreplay_kernel_dispatch_info_t) as filled in by kreplay. */
    uint64_t size;                     /*   0 */
    /** The agent the kernel runs on. */
    kreplay_agent_id_t agent_id;       /*   8 */
    /** The queue the dispatch was submitted to. */
    kreplay_queue_id_t queue_id;       /*  16 */
    /** The kernel (for HSA: the kernel object handle). */
    uint64_t kernel_id;                /*  24 */
    /** A process-unique id of this dispatch (1, 2, ...). */
    uint64_t dispatch_id;              /*  32 */
    /** Private (scratch) memory per work-item, in bytes. */
    uint32_t private_segment_size;     /*  40 */
    /** Group (LDS) memory per work-group, in bytes. */
    uint32_t group_segment_size;       /*  44 */
    /** Work-items per work-group. */
    kreplay_dim3_t workgroup_size;     /*  48 */
    /** Work-items in the whole grid. */
    kreplay_dim3_t grid_size;          /*  60 */
    /** Reserved, zero. */
    uint8_t reserved_padding[56];      /*  72 */
} kreplay_kernel_dispatch_info_t;

/* ============================================================================================== */
/* Callback tracing kinds, operations and phases                                                  */
/* ============================================================================================== */

/** A callback tracing kind (one of the KREPLAY_CALLBACK_TRACING_* values). */
typedef uint32_t kreplay_callback_tracing_kind_t;

/** Values of kreplay_callback_tracing_kind_t. */
enum kreplay_callback_tracing_kind_values {
    /** Not a kind; invalid as an argument. */
    KREPLAY_CALLBACK_TRACING_NONE = 0,
    /** Kernel dispatches (operations: kreplay_kernel_dispatch_operation_t). In a replayed
     *  dispatch every pass produces its own records, carrying the pass index. */
    KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH = 1,
    /** Kernel replay (operations: kreplay_kernel_replay_operation_t). One context at most. */
    KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY = 2,
    /** One past the last kind (grows as kinds are appended). */
    KREPLAY_CALLBACK_TRACING_LAST = 3
};

/** An operation of a callback tracing kind (values depend on the kind). */
typedef uint32_t kreplay_tracing_operation_t;

/** Operations of KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH. */
typedef uint32_t kreplay_kernel_dispatch_operation_t;

/** Values of kreplay_kernel_dispatch_operation_t. */
enum kreplay_kernel_dispatch_operation_values {
    /** Not an operation. */
    KREPLAY_KERNEL_DISPATCH_NONE = 0,
    /** ENTER before the dispatch packet is submitted, EXIT right after (once per pass). */
    KREPLAY_KERNEL_DISPATCH_ENQUEUE = 1,
    /** Phase NONE: the dispatch (of one pass) completed; timestamps are set. */
    KREPLAY_KERNEL_DISPATCH_COMPLETE = 2,
    /** One past the last operation. */
    KREPLAY_KERNEL_DISPATCH_LAST = 3
};

/** Operations of KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY. */
typedef uint32_t kreplay_kernel_replay_operation_t;

/** Values of kreplay_kernel_replay_operation_t (ABI: only appended). */
enum kreplay_kernel_replay_operation_values {
    /** Not an operation. */
    KREPLAY_KERNEL_REPLAY_NONE = 0,
    /** ENTER: the tool decides the pass count; EXIT: the dispatch's replay is over. Payload:
     *  kreplay_callback_tracing_kernel_replay_data_t. */
    KREPLAY_KERNEL_REPLAY_CONFIG = 1,
    /** Around each pass. Payload: kreplay_callback_tracing_kernel_replay_data_t. */
    KREPLAY_KERNEL_REPLAY_PASS = 2,
    /** Around taking the snapshot. Payload: kreplay_callback_tracing_kernel_replay_memory_data_t.
     *  A replay declined before the snapshot starts (budget, untracked memory, a stuck drain, an
     *  invalid pass count, ...) gets no SNAPSHOT record: CONFIG EXIT says why. */
    KREPLAY_KERNEL_REPLAY_SNAPSHOT = 3,
    /** Around each restore between passes. Payload:
     *  kreplay_callback_tracing_kernel_replay_memory_data_t. */
    KREPLAY_KERNEL_REPLAY_RESTORE = 4,
    /** One past the last operation. */
    KREPLAY_KERNEL_REPLAY_LAST = 5
};

/** The phase of a callback (one of the KREPLAY_CALLBACK_PHASE_* values). */
typedef uint32_t kreplay_callback_phase_t;

/** Values of kreplay_callback_phase_t. */
enum kreplay_callback_phase_values {
    /** A single callback without a pair (e.g. KERNEL_DISPATCH COMPLETE). */
    KREPLAY_CALLBACK_PHASE_NONE = 0,
    /** Before the operation. */
    KREPLAY_CALLBACK_PHASE_ENTER = 1,
    /** After the operation. */
    KREPLAY_CALLBACK_PHASE_EXIT = 2,
    /** One past the last phase. */
    KREPLAY_CALLBACK_PHASE_LAST = 3
};

/** The name of a kind, e.g. "KERNEL_REPLAY" (static storage; NULL for an unknown kind). */
const char* kreplay_get_callback_tracing_kind_name(kreplay_callback_tracing_kind_t kind);

/** The name of an operation of `kind`, e.g. "PASS" (static storage; NULL when unknown). */
const char* kreplay_get_callback_tracing_operation_name(kreplay_callback_tracing_kind_t kind,
                                                        kreplay_tracing_operation_t operation);

/* ============================================================================================== */
/* Decline reasons                                                                                */
/* ============================================================================================== */

/** Why kreplay ran a dispatch once instead of replaying it (KREPLAY_REPLAY_DECLINE_* values). */
typedef uint32_t kreplay_replay_decline_reason_t;

/** Values of kreplay_replay_decline_reason_t. */
enum kreplay_replay_decline_reason_values {
    /** Not declined (replayed, or the tool opted out / asked for one pass). */
    KREPLAY_REPLAY_DECLINE_NONE = 0,
    /** The kernel may touch memory kreplay does not track. */
    KREPLAY_REPLAY_DECLINE_UNTRACKED_MEMORY = 1,
    /** The snapshot would exceed KREPLAY_MAX_SNAPSHOT_BYTES or the memory available. */
    KREPLAY_REPLAY_DECLINE_FOOTPRINT_BUDGET = 2,
    /** Taking the snapshot, or acquiring what the passes need (a completion signal, ...), failed;
     *  memory is untouched. */
    KREPLAY_REPLAY_DECLINE_SNAPSHOT_FAILED = 3,
    /** The dispatch's queue did not become idle within KREPLAY_DRAIN_TIMEOUT_MS. */
    KREPLAY_REPLAY_DECLINE_QUEUE_DRAIN_STUCK = 4,
    /** A sibling queue or an asynchronous copy on the agent did not become idle in time. */
    KREPLAY_REPLAY_DECLINE_AGENT_DRAIN_STUCK = 5,
    /** A pass could not be run or waited for (a running pass is never abandoned: a long pass is
     *  waited for, with warnings). */
    KREPLAY_REPLAY_DECLINE_PASS_DRAIN_STUCK = 6,
    /** The dispatch was issued from inside a replay callback on the same agent. */
    KREPLAY_REPLAY_DECLINE_REENTRANT_DISPATCH = 7,
    /** The pass count was invalid: 0 without a continue callback, or above KREPLAY_MAX_PASSES. */
    KREPLAY_REPLAY_DECLINE_INVALID_PASS_COUNT = 8,
    /** A graph launch or a multi-packet batch: never replayed. */
    KREPLAY_REPLAY_DECLINE_BATCH_OR_GRAPH = 9,
    /** One past the last reason. */
    KREPLAY_REPLAY_DECLINE_LAST = 10
};

/**
 * The short name of a decline reason: "none", "untracked_memory", "footprint_budget",
 * "snapshot_failed", "queue_drain_stuck", "agent_drain_stuck", "pass_drain_stuck",
 * "reentrant_dispatch", "invalid_pass_count", "batch_or_graph"; "unknown" for any other value.
 * Static storage, never NULL.
 */
const char* kreplay_get_decline_reason_string(kreplay_replay_decline_reason_t reason);

/** How a dispatch's replay ended, reported at CONFIG EXIT (KREPLAY_REPLAY_OUTCOME_* values). */
typedef uint32_t kreplay_replay_outcome_t;

/** Values of kreplay_replay_outcome_t. */
enum kreplay_replay_outcome_values {
    /** Not known yet (every record but CONFIG EXIT). */
    KREPLAY_REPLAY_OUTCOME_NONE = 0,
    /** Replayed: every planned pass ran, or the tool's continue callback stopped the loop. */
    KREPLAY_REPLAY_OUTCOME_REPLAYED = 1,
    /** Not replayed by the tool's choice (no pass-count callback, or one pass): ran once. */
    KREPLAY_REPLAY_OUTCOME_RAN_ONCE = 2,
    /** Replay was declined (see decline_reason): ran once, memory untouched by replay. */
    KREPLAY_REPLAY_OUTCOME_DECLINED = 3,
    /** kreplay ended the loop before the tool's plan (see end_reason: the cap on passes or the
     *  time budget); memory is as after one run. */
    KREPLAY_REPLAY_OUTCOME_ENDED_EARLY = 4,
    /** A pass could not be run or waited for; the loop stopped. */
    KREPLAY_REPLAY_OUTCOME_PASS_FAILED = 5,
    /** A restore between passes failed: application data was lost (see bytes_lost). */
    KREPLAY_REPLAY_OUTCOME_RESTORE_FAILED = 6,
    /** One past the last outcome. */
    KREPLAY_REPLAY_OUTCOME_LAST = 7
};

/** Why the passes of a replay stopped, reported at CONFIG EXIT (KREPLAY_REPLAY_END_* values). */
typedef uint32_t kreplay_replay_end_t;

/** Values of kreplay_replay_end_t. */
enum kreplay_replay_end_values {
    /** No loop ended (not replayed, or it failed). */
    KREPLAY_REPLAY_END_NONE = 0,
    /** All N passes ran. */
    KREPLAY_REPLAY_END_LAST_PASS = 1,
    /** The tool's continue callback returned 0. */
    KREPLAY_REPLAY_END_CONTINUE_STOPPED = 2,
    /** An indefinite loop's continue callback was cleared at PASS EXIT. */
    KREPLAY_REPLAY_END_CONTINUE_CLEARED = 3,
    /** An indefinite loop reached KREPLAY_MAX_PASSES passes. */
    KREPLAY_REPLAY_END_MAX_PASSES = 4,
    /** KREPLAY_REPLAY_BUDGET_MS was spent: no further pass was started (none was cut short). */
    KREPLAY_REPLAY_END_BUDGET = 5,
    /** One past the last end reason. */
    KREPLAY_REPLAY_END_LAST = 6
};

/** The cap on passes per dispatch when the environment variable KREPLAY_MAX_PASSES is not set. */
#define KREPLAY_DEFAULT_MAX_PASSES 1024

/* ============================================================================================== */
/* Snapshot storage tiers and restore strategies                                                  */
/* ============================================================================================== */

/** Where a snapshot is kept (KREPLAY_SNAPSHOT_TIER_* values). */
typedef uint32_t kreplay_snapshot_tier_t;

/** Values of kreplay_snapshot_tier_t. */
enum kreplay_snapshot_tier_values {
    /** No snapshot (not taken, or nothing to keep). */
    KREPLAY_SNAPSHOT_TIER_NONE = 0,
    /** A shadow copy in the agent's own memory. */
    KREPLAY_SNAPSHOT_TIER_DEVICE = 1,
    /** Pinned or ordinary host memory. */
    KREPLAY_SNAPSHOT_TIER_HOST = 2,
    /** A memory-mapped spill file (KREPLAY_SPILL_DIR). */
    KREPLAY_SNAPSHOT_TIER_FILE = 3,
    /** Regions are spread over more than one tier. */
    KREPLAY_SNAPSHOT_TIER_MIXED = 4,
    /** One past the last tier. */
    KREPLAY_SNAPSHOT_TIER_LAST = 5
};

/** How memory is restored between passes (KREPLAY_RESTORE_STRATEGY_* values). */
typedef uint32_t kreplay_restore_strategy_t;

/** Values of kreplay_restore_strategy_t. */
enum kreplay_restore_strategy_values {
    /** No restore (one pass, or the snapshot was declined). */
    KREPLAY_RESTORE_STRATEGY_NONE = 0,
    /** Every snapshotted byte is copied back. */
    KREPLAY_RESTORE_STRATEGY_FULL = 1,
    /** Chunks whose hash changed are copied back. */
    KREPLAY_RESTORE_STRATEGY_HASH = 2,
    /** Chunks that changed are copied back, using the write set learned from pass 0; verified
     *  before every pass unless KREPLAY_RESTORE=writeset-unverified (see `unverified`); or
     *  the chunks of the pages seen written (KREPLAY_RESTORE=tracked, or auto, where the
     *  device's memory is written only by the CPU of this process). */
    KREPLAY_RESTORE_STRATEGY_WRITESET = 3,
    /** One past the last strategy. */
    KREPLAY_RESTORE_STRATEGY_LAST = 4
};

/* ============================================================================================== */
/* Kernel replay payloads                                                                         */
/* ============================================================================================== */

/**
 * Asked at CONFIG ENTER (if the tool set it): how many passes to run for this dispatch.
 * NULL: not replayed (runs once). 1: runs once. N > 1: N passes (at most N with a continue
 * callback). 0: indefinite, requires a continue callback (without one the dispatch runs once and
 * a diagnostic is printed). `user_data` is the record's user data as left by CONFIG ENTER.
 */
typedef uint64_t (*kreplay_pass_count_cb_t)(kreplay_kernel_dispatch_info_t dispatch_info,
                                            kreplay_user_data_t user_data);

/**
 * Asked after each PASS EXIT except the last of a fixed count: return non-zero to run another
 * pass, zero to stop. `total_passes` is 0 for an indefinite replay.
 */
typedef int (*kreplay_continue_cb_t)(kreplay_kernel_dispatch_info_t dispatch_info,
                                     uint64_t current_pass, uint64_t total_passes,
                                     kreplay_user_data_t user_data);

/**
 * Masks a context on (start) or off (stop) for this and the following passes of the current
 * dispatch. Legal only during PASS ENTER and on the thread it is delivered on (else
 * KREPLAY_STATUS_ERROR_CONTEXT_ERROR, nothing changes: a helper thread of the tool cannot toggle
 * for the callback it serves); only for contexts started when the replay began (else
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED). Never changes the global started state; the mask is
 * reset when the dispatch's replay ends.
 */
typedef kreplay_status_t (*kreplay_context_toggle_cb_t)(kreplay_context_id_t context_id);

/** Payload of KERNEL_REPLAY CONFIG and PASS records. 216 bytes (read `size` first: the fields
 *  from byte 184 on were appended). */
typedef struct kreplay_callback_tracing_kernel_replay_data_t {
    /** sizeof this struct. */
    uint64_t size;                                     /*   0 */
    /** The dispatch being replayed (always set). */
    kreplay_kernel_dispatch_info_t dispatch_info;      /*   8 */
    /** PASS: the 0-based pass index. CONFIG EXIT: the number of passes that ran. */
    uint64_t current_pass;                             /* 136 */
    /** PASS: the pass count N, or 0 if indefinite. */
    uint64_t total_passes;                             /* 144 */
    /** CONFIG ENTER: the tool sets it (NULL: do not replay this dispatch). */
    kreplay_pass_count_cb_t replay_pass_count;         /* 152 */
    /** CONFIG ENTER: the tool may set it; PASS EXIT: the tool may override it. */
    kreplay_continue_cb_t replay_continue;             /* 160 */
    /** PASS ENTER: set by kreplay (see kreplay_context_toggle_cb_t). */
    kreplay_context_toggle_cb_t replay_start_context;  /* 168 */
    /** PASS ENTER: set by kreplay (see kreplay_context_toggle_cb_t). */
    kreplay_context_toggle_cb_t replay_stop_context;   /* 176 */
    /** CONFIG EXIT: how the replay ended (kreplay_replay_outcome_t). */
    kreplay_replay_outcome_t outcome;                  /* 184 */
    /** CONFIG EXIT: why the passes stopped (kreplay_replay_end_t). */
    kreplay_replay_end_t end_reason;                   /* 188 */
    /** CONFIG EXIT: KREPLAY_STATUS_SUCCESS, ERROR_REPLAY_DECLINED, ERROR (a pass failed) or
     *  ERROR_RESTORE_FAILED. */
    kreplay_status_t status;                           /* 192 */
    /** CONFIG EXIT of a declined replay or failed pass: why (kreplay_replay_decline_reason_t). */
    kreplay_replay_decline_reason_t decline_reason;    /* 196 */
    /** CONFIG EXIT: the passes that ran (1 when the dispatch ran once). After a failed pass it
     *  includes that pass, which never completed: no counter record came for it. */
    uint64_t passes_run;                               /* 200 */
    /** CONFIG EXIT after a failed restore: bytes that could not be restored. */
    uint64_t bytes_lost;                               /* 208 */
} kreplay_callback_tracing_kernel_replay_data_t;

/** Payload of KERNEL_REPLAY SNAPSHOT and RESTORE records: what replay's memory work costs and how
 *  it went. 280 bytes (read `size` first: the fields from byte 200 on were appended). The
 *  per-source fields (216..280) say where a snapshot's regions come from: the agent's own memory,
 *  memory a kernel argument points into, module-scope variables, adopted memory. */
typedef struct kreplay_callback_tracing_kernel_replay_memory_data_t {
    /** sizeof this struct. */
    uint64_t size;                                     /*   0 */
    /** The dispatch being replayed. */
    kreplay_kernel_dispatch_info_t dispatch_info;      /*   8 */
    /** RESTORE: the pass whose writes are undone (the next pass is current_pass + 1).
     *  SNAPSHOT: 0. */
    uint64_t current_pass;                             /* 136 */
    /** Bytes the snapshot covers (ENTER and EXIT). */
    uint64_t bytes_planned;                            /* 144 */
    /** EXIT: bytes actually copied (snapshot: into the store; restore: back to the agent). */
    uint64_t bytes_moved;                              /* 152 */
    /** Number of memory regions (allocations) in the snapshot. */
    uint64_t regions;                                  /* 160 */
    /** RESTORE EXIT: number of chunks copied back. */
    uint64_t chunks_restored;                          /* 168 */
    /** Where the snapshot lives (kreplay_snapshot_tier_t). */
    kreplay_snapshot_tier_t tier;                      /* 176 */
    /** How restores are done (kreplay_restore_strategy_t). */
    kreplay_restore_strategy_t strategy;               /* 180 */
    /** EXIT: KREPLAY_STATUS_SUCCESS, ERROR_REPLAY_DECLINED (snapshot) or ERROR_RESTORE_FAILED. */
    kreplay_status_t status;                           /* 184 */
    /** SNAPSHOT EXIT with status ERROR_REPLAY_DECLINED: why (kreplay_replay_decline_reason_t). */
    kreplay_replay_decline_reason_t decline_reason;    /* 188 */
    /** RESTORE EXIT with status ERROR_RESTORE_FAILED: bytes that could not be restored. */
    uint64_t bytes_lost;                               /* 192 */
    /** RESTORE EXIT: chunks found changed outside the write set learned from pass 0 and copied
     *  back (a repair; included in chunks_restored). */
    uint64_t chunks_repaired;                          /* 200 */
    /** RESTORE EXIT: 1 when the restore copied a learned write set back without checking the
     *  rest of the snapshot (only with KREPLAY_RESTORE=writeset-unverified): the next pass may
     *  not start from the bytes the first pass saw. Else 0. */
    uint32_t unverified;                               /* 208 */
    /** Reserved, zero. */
    uint32_t reserved;                                 /* 212 */
    /** SNAPSHOT ENTER/EXIT: regions selected as the agent's own memory (KREPLAY_SNAPSHOT_SCOPE=agent). */
    uint64_t agent_regions;                          /* 216 */
    /** SNAPSHOT ENTER/EXIT: bytes of those regions. */
    uint64_t agent_bytes;                            /* 224 */
    /** SNAPSHOT ENTER/EXIT: further allocations a kernel argument points into (any owner or kind). */
    uint64_t referenced_regions;                     /* 232 */
    /** SNAPSHOT ENTER/EXIT: bytes of those regions. */
    uint64_t referenced_bytes;                       /* 240 */
    /** SNAPSHOT ENTER/EXIT: writable module-scope variables of executables loaded on the agent, or reached by an argument. */
    uint64_t module_variable_regions;                /* 248 */
    /** SNAPSHOT ENTER/EXIT: bytes of those variables. */
    uint64_t module_variable_bytes;                  /* 256 */
    /** SNAPSHOT ENTER/EXIT: allocations kreplay never saw allocated, adopted with the runtime's base and size. */
    uint64_t adopted_regions;                        /* 264 */
    /** SNAPSHOT ENTER/EXIT: bytes of those regions. */
    uint64_t adopted_bytes;                          /* 272 */
} kreplay_callback_tracing_kernel_replay_memory_data_t;

/** Per-process replay counters (kreplay_get_counters). 240 bytes; fields are only appended. */
typedef struct kreplay_counters_t {
    /** In: the bytes the caller provides (sizeof(kreplay_counters_t) as it compiled). Out: the
     *  bytes kreplay filled in. */
    uint64_t size;                                     /*   0 */
    /** Dispatches that went through the replay loop (while KERNEL_REPLAY was configured). */
    uint64_t dispatches;                               /*   8 */
    /** Dispatches replayed (outcome REPLAYED or ENDED_EARLY). */
    uint64_t replays;                                  /*  16 */
    /** Passes run, all replays together. */
    uint64_t passes;                                   /*  24 */
    /** Dispatches the tool chose to run once (no pass-count callback, or one pass). */
    uint64_t ran_once;                                 /*  32 */
    /** Replays declined, every reason together. */
    uint64_t declines;                                 /*  40 */
    /** Replays kreplay ended early (KREPLAY_MAX_PASSES, KREPLAY_REPLAY_BUDGET_MS). */
    uint64_t ended_early;                              /*  48 */
    /** Replays stopped by a pass that failed. */
    uint64_t pass_failures;                            /*  56 */
    /** Replays stopped by a failed restore. */
    uint64_t restore_failures;                         /*  64 */
    /** Bytes copied into snapshots. */
    uint64_t bytes_snapshotted;                        /*  72 */
    /** Bytes written back by restores. */
    uint64_t bytes_restored;                           /*  80 */
    /** Bytes failed restores could not write back. */
    uint64_t bytes_lost;                               /*  88 */
    /** Chunks written outside a learned write set, repaired by verified restores. */
    uint64_t chunks_repaired;                          /*  96 */
    /** Restores that skipped verification (KREPLAY_RESTORE=writeset-unverified). */
    uint64_t unverified_restores;                      /* 104 */
    /** Declines per reason, indexed by kreplay_replay_decline_reason_t (entry 0 unused). */
    uint64_t declines_by_reason[16];                   /* 112 */
} kreplay_counters_t;

/**
 * Copies the replay counters of this process into `*counters`. Set `counters->size` to
 * sizeof(kreplay_counters_t) first: kreplay fills at most that many bytes and sets `size` to the
 * bytes it filled. KREPLAY_STATUS_ERROR_INVALID_ARGUMENT if `counters` is NULL or `size` < 8.
 * Callable from any thread at any time.
 */
kreplay_status_t kreplay_get_counters(kreplay_counters_t* counters);

/* ============================================================================================== */
/* Kernel dispatch payload                                                                        */
/* ============================================================================================== */

/** `replay_pass` of a dispatch that was not replayed. */
#define KREPLAY_REPLAY_PASS_NONE UINT64_MAX

/** Payload of KERNEL_DISPATCH records. 160 bytes. */
typedef struct kreplay_callback_tracing_kernel_dispatch_data_t {
    /** sizeof this struct. */
    uint64_t size;                                     /*   0 */
    /** The dispatch. */
    kreplay_kernel_dispatch_info_t dispatch_info;      /*   8 */
    /** COMPLETE: start of execution in nanoseconds (0 if the backend cannot tell). */
    uint64_t start_timestamp;                          /* 136 */
    /** COMPLETE: end of execution in nanoseconds (0 if the backend cannot tell). */
    uint64_t end_timestamp;                            /* 144 */
    /** The 0-based pass index, or KREPLAY_REPLAY_PASS_NONE when the dispatch is not replayed. */
    uint64_t replay_pass;                              /* 152 */
} kreplay_callback_tracing_kernel_dispatch_data_t;

/* ============================================================================================== */
/* Callback tracing service                                                                       */
/* ============================================================================================== */

/** One callback record. 48 bytes. */
typedef struct kreplay_callback_tracing_record_t {
    /** The context whose service produced this record. */
    kreplay_context_id_t context_id;                   /*   0 */
    /** The operating-system id of the thread running the callback. */
    uint64_t thread_id;                                /*   8 */
    /** Equal for every record of one operation (ENTER, EXIT, every PASS of one dispatch). */
    uint64_t correlation_id;                           /*  16 */
    /** kreplay_callback_tracing_kind_t. */
    kreplay_callback_tracing_kind_t kind;              /*  24 */
    /** An operation of `kind`. */
    kreplay_tracing_operation_t operation;             /*  28 */
    /** kreplay_callback_phase_t. */
    kreplay_callback_phase_t phase;                    /*  32 */
    /** KERNEL_REPLAY CONFIG EXIT: why the dispatch was not replayed
     *  (kreplay_replay_decline_reason_t, NONE if it was or if the tool opted out). Else 0. */
    kreplay_replay_decline_reason_t decline_reason;    /*  36 */
    /** The kind- and operation-specific payload (see the operation values). Valid only during
     *  the callback; fields marked "the tool sets" may be written. */
    void* payload;                                     /*  40 */
} kreplay_callback_tracing_record_t;

/**
 * A callback tracing callback. `user_data` is storage for this record's operation: what the tool
 * writes at ENTER it sees again at EXIT and, for kernel replay, in every PASS of the same
 * dispatch. `callback_data` is the pointer given when the service was configured.
 *
 * May be called from several threads at once (see "Threads" at the top of this file); the
 * record and its payload are valid only until it returns.
 */
typedef void (*kreplay_callback_tracing_cb_t)(kreplay_callback_tracing_record_t record,
                                              kreplay_user_data_t* user_data,
                                              void* callback_data);

/* ============================================================================================== */
/* Contexts                                                                                       */
/* ============================================================================================== */

/**
 * Creates a context (stopped, without services).
 * KREPLAY_STATUS_ERROR_INVALID_ARGUMENT if `context_id` is NULL.
 */
kreplay_status_t kreplay_create_context(kreplay_context_id_t* context_id);

/**
 * Starts a context: its services receive callbacks from now on.
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND for an unknown context;
 * KREPLAY_STATUS_ERROR_FINALIZED for a context of a tool that has been finalized (also from the
 * tool's own finalize): finalizing a tool stops its contexts for good.
 */
kreplay_status_t kreplay_start_context(kreplay_context_id_t context_id);

/**
 * Stops a context: its services receive no further callbacks.
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND for an unknown context.
 */
kreplay_status_t kreplay_stop_context(kreplay_context_id_t context_id);

/**
 * Writes 1 to `*status` if the context is started (global state; replay masks are not
 * considered), else 0. KREPLAY_STATUS_ERROR_INVALID_ARGUMENT if `status` is NULL,
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND for an unknown context.
 */
kreplay_status_t kreplay_context_is_active(kreplay_context_id_t context_id, int* status);

/**
 * Configures a callback tracing service of `kind` on a context.
 *
 * `operations` lists the operations of `kind` to report; `operations_count == 0` means all of
 * them (`operations` is then not read and may be NULL). `callback_data` is passed to every call of
 * `callback`.
 *
 * Errors: KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED after tool initialization has ended;
 * KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for a NULL callback, an unknown kind, an unknown operation,
 * `operations == NULL` with a non-zero count or a count larger than any array;
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND for an unknown context;
 * KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED if the context already has this
 * kind, or if `kind` is KERNEL_REPLAY and another context has configured it.
 */
kreplay_status_t kreplay_configure_callback_tracing_service(kreplay_context_id_t context_id,
                                                           kreplay_callback_tracing_kind_t kind,
                                                           const uint32_t* operations,
                                                           size_t operations_count,
                                                           kreplay_callback_tracing_cb_t callback,
                                                           void* callback_data);

/* ============================================================================================== */
/* Dispatch counter collection                                                                    */
/* ============================================================================================== */

/*
 * An agent counts events of a dispatch in hardware blocks; each block counts only a few counters
 * per pass (block_limit). A counter configuration is a set of counters of one agent counted
 * together in one pass. With kernel replay, a tool counts a different configuration in each pass
 * of the same dispatch: kreplay_plan_counter_passes splits the counters a user asks for into the
 * fewest passes, and the tool answers that count from its replay_pass_count callback.
 *
 * The dispatch counting service (at most one in a process) is asked at dispatch time, for every
 * dispatch and for every pass of a replayed one, which configuration to count; it is asked only
 * while its context is active on that thread (started, and not masked off for the pass by a
 * replay context toggle). Once the kernel has completed, the record callback receives one record
 * per counter, each carrying dispatch_id and replay_pass. Values of different passes are never
 * added together: a counter counted in two passes gives a record in each.
 *
 * An agent's counters are read from the runtime the first time one of the three counter
 * functions asks about that agent, and kept for the process: from then on all three answer from
 * them, also after hsa_shut_down (a configuration made then is accepted or refused as before; it
 * counts nothing, since no dispatch comes). An agent first asked about after hsa_shut_down is
 * unknown to all three (KREPLAY_STATUS_ERROR_INVALID_ARGUMENT).
 */

/** A counter of an agent. Handle 0 is never valid. */
typedef struct kreplay_counter_id_t {
    uint64_t handle;
} kreplay_counter_id_t;

/** A counter configuration. Handle 0: no configuration. */
typedef struct kreplay_counter_config_id_t {
    uint64_t handle;
} kreplay_counter_config_id_t;

/** One counter of an agent. 48 bytes. Strings have static storage. */
typedef struct kreplay_counter_info_t {
    /** sizeof this struct. */
    uint64_t size;                                     /*   0 */
    /** The counter. */
    kreplay_counter_id_t id;                           /*   8 */
    /** Its name, e.g. "SQ_WAVES". */
    const char* name;                                  /*  16 */
    /** What it counts. */
    const char* description;                           /*  24 */
    /** The hardware block it is counted in (a derived counter: its first input's). */
    const char* block;                                 /*  32 */
    /** How many counters of `block` one pass can count. */
    uint32_t block_limit;                              /*  40 */
    /** 1 if computed from other counters counted in the same pass (which it occupies). */
    uint32_t is_derived;                               /*  44 */
} kreplay_counter_info_t;

/** One counter's value for one pass of one dispatch. 56 bytes. */
typedef struct kreplay_counter_record_t {
    /** sizeof this struct. */
    uint64_t size;                                     /*   0 */
    /** The counter. */
    kreplay_counter_id_t counter_id;                   /*   8 */
    /** The dispatch (its dispatch_info.dispatch_id, as in dispatch-tracing records). */
    uint64_t dispatch_id;                              /*  16 */
    /** The 0-based pass, or KREPLAY_REPLAY_PASS_NONE when the dispatch was not replayed. */
    uint64_t replay_pass;                              /*  24 */
    /** The agent that ran the dispatch. */
    kreplay_agent_id_t agent_id;                       /*  32 */
    /** The context whose service counted it. */
    kreplay_context_id_t context_id;                   /*  40 */
    /** The value. */
    double value;                                      /*  48 */
} kreplay_counter_record_t;

/** Receives every counter of an agent (the array is valid during the call). Its return value is
 *  returned by kreplay_iterate_agent_counters. */
typedef kreplay_status_t (*kreplay_agent_counters_cb_t)(kreplay_agent_id_t agent_id,
                                                       const kreplay_counter_info_t* counters,
                                                       size_t counters_count, void* user_data);

/** Asked at dispatch time: write the configuration this dispatch (this pass of it) counts to
 *  `*config_id`, or leave it at handle 0 to count nothing. `replay_pass` is the 0-based pass or
 *  KREPLAY_REPLAY_PASS_NONE for a dispatch that runs once unreplayed: a plan of one pass (a pass
 *  count of 1 is not a replay), a replay declined (it runs once, after CONFIG EXIT), or no
 *  replay service. A tool whose plan has one pass counts its configuration there. A
 *  configuration of another agent counts nothing. */
typedef void (*kreplay_dispatch_counting_cb_t)(kreplay_kernel_dispatch_info_t dispatch_info,
                                               uint64_t replay_pass,
                                               kreplay_counter_config_id_t* config_id,
                                               void* callback_data);

/** Receives what a dispatch (one pass of it) counted, one record per counter of its
 *  configuration, in the configuration's order (valid during the call). Only while the counting
 *  context is started: a dispatch whose configuration was picked before the context was stopped
 *  (or its tool finalized) and that completes afterwards delivers nothing. */
typedef void (*kreplay_counter_record_cb_t)(kreplay_kernel_dispatch_info_t dispatch_info,
                                            const kreplay_counter_record_t* records,
                                            size_t records_count, void* callback_data);

/**
 * Calls `callback` once with every counter of `agent_id` (none for an agent without counters).
 * KREPLAY_STATUS_ERROR_NOT_INITIALIZED before kreplay is loaded into a runtime;
 * KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for a NULL callback, an unknown agent or a runtime
 * without counters (CUDA: counter collection is HSA-only, and the three counter functions return
 * it from the tool's initialize on). Call it after the runtime is initialized.
 */
kreplay_status_t kreplay_iterate_agent_counters(kreplay_agent_id_t agent_id,
                                                kreplay_agent_counters_cb_t callback,
                                                void* user_data);

/**
 * Creates a configuration counting `counters` (at least one, of `agent_id`) together in one
 * pass. KREPLAY_STATUS_ERROR_EXCEEDS_PASS_LIMIT when they do not fit one pass (the block and its
 * limit are logged); KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for NULL pointers, no counters, an
 * unknown counter or a count larger than any array; KREPLAY_STATUS_ERROR_NOT_INITIALIZED before
 * kreplay is loaded into a runtime.
 */
kreplay_status_t kreplay_create_counter_config(kreplay_agent_id_t agent_id,
                                               const kreplay_counter_id_t* counters,
                                               size_t counters_count,
                                               kreplay_counter_config_id_t* config_id);

/**
 * Splits `counters` into the fewest passes that count all of them (found exactly for up to 64
 * distinct counters within a bounded search; beyond, a first-fit packing) and writes that number to
 * `*pass_count` (0 for no counters); when `pass_of_counter` is not NULL, writes the 0-based pass
 * of each counter there (`counters_count` entries; a counter listed twice is counted once).
 * KREPLAY_STATUS_ERROR_EXCEEDS_PASS_LIMIT when one counter alone cannot be counted in a pass;
 * KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for NULL pointers, an unknown counter or a count larger
 * than any array; KREPLAY_STATUS_ERROR_NOT_INITIALIZED before kreplay is loaded into a runtime.
 */
kreplay_status_t kreplay_plan_counter_passes(kreplay_agent_id_t agent_id,
                                             const kreplay_counter_id_t* counters,
                                             size_t counters_count, uint32_t* pass_of_counter,
                                             uint64_t* pass_count);

/**
 * Configures the dispatch counting service on a context (see above). Both callbacks are
 * required. Errors: KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED after tool initialization has
 * ended; KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for a NULL callback;
 * KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND for an unknown context;
 * KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED if a context already has it.
 */
kreplay_status_t kreplay_configure_dispatch_counting_service(
    kreplay_context_id_t context_id, kreplay_dispatch_counting_cb_t dispatch_callback,
    kreplay_counter_record_cb_t record_callback, void* callback_data);

/* ============================================================================================== */
/* Tools: discovery and lifecycle                                                                 */
/* ============================================================================================== */

/** Identifies a tool. kreplay sets `handle`; the tool may set `name` (a string with static
 *  storage) inside kreplay_configure. */
typedef struct kreplay_client_id_t {
    const char* name;                                  /*   0 */
    uint32_t handle;                                   /*   8 */
} kreplay_client_id_t;

/** Given to the tool's initialize: calling it with the tool's client id finalizes the tool early
 *  (its contexts are stopped, then its finalize runs once); with another client id it finalizes
 *  no other tool (a warning says so). From a callback, nothing of the
 *  tool is called after it (its pass-count and continue callbacks neither: a replay in progress
 *  goes on without it; nor a service it configured on another tool's context); from another
 *  thread, its finalize waits (at most 10 s) for its callbacks running on other threads. From
 *  initialize, its services are given back for later tools.
 *  A call from outside callbacks while another thread finalizes the tool (this function, or
 *  OnUnload) returns once that finalize has run (at most 10 s); OnUnload returns only after it. */
typedef void (*kreplay_client_finalize_t)(kreplay_client_id_t client_id);

/** The tool's initialize: create, configure and start contexts here. Return 0 on success; any
 *  other value marks the tool as failed (its contexts are stopped and every service it
 *  configured is removed, also one on a context not its own). */
typedef int (*kreplay_tool_initialize_t)(kreplay_client_finalize_t finalize_func,
                                         void* tool_data);

/** The tool's finalize, called once at shutdown (tools in reverse order of initialization). */
typedef void (*kreplay_tool_finalize_t)(void* tool_data);

/** What kreplay_configure returns. Must stay valid until the tool's finalize has run. */
typedef struct kreplay_tool_configure_result_t {
    /** sizeof(kreplay_tool_configure_result_t); smaller results are rejected. */
    size_t size;                                       /*   0 */
    /** Called once after every tool was configured (may be NULL). */
    kreplay_tool_initialize_t initialize;              /*   8 */
    /** Called once at shutdown (may be NULL). */
    kreplay_tool_finalize_t finalize;                  /*  16 */
    /** Passed to initialize and finalize. */
    void* tool_data;                                   /*  24 */
} kreplay_tool_configure_result_t;

/** The type of kreplay_configure. */
typedef kreplay_tool_configure_result_t* (*kreplay_configure_func_t)(
    uint32_t version, const char* runtime_version, uint32_t priority,
    kreplay_client_id_t* client_id);

/**
 * Defined by a tool (not by kreplay) and exported with default visibility. kreplay looks it up in
 * the process and in each library listed in KREPLAY_TOOL_LIBRARIES (colon-separated paths).
 * `version` is KREPLAY_VERSION of the library, `runtime_version` its version as a string,
 * `priority` the tool's rank among those found (0 first). Return NULL to stay inactive.
 */
kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority,
                                                   kreplay_client_id_t* client_id);

/**
 * Registers a configure function for a tool linked into the application (no symbol lookup
 * needed). Must be called before kreplay initializes its tools; such tools come first, in
 * registration order. KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for NULL,
 * KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED once tool initialization has begun.
 */
kreplay_status_t kreplay_force_configure(kreplay_configure_func_t configure_func);

/**
 * Writes 1 to `*status` once kreplay has begun initializing tools (from then on
 * kreplay_force_configure is refused), else 0. KREPLAY_STATUS_ERROR_INVALID_ARGUMENT if NULL.
 */
kreplay_status_t kreplay_is_initialized(int* status);

/**
 * Writes 1 to `*status` once kreplay has finalized its tools, else 0.
 * KREPLAY_STATUS_ERROR_INVALID_ARGUMENT if NULL.
 */
kreplay_status_t kreplay_is_finalized(int* status);

/* ============================================================================================== */
/* Entry points for the runtime                                                                   */
/* ============================================================================================== */

/* The HSA runtime's API table (hsa_api_trace.h); only pointers to it appear here. */
struct HsaApiTable;

/**
 * The HSA tools-library entry point, defined by libkreplay (tools do not call it). The HSA
 * runtime calls it from hsa_init when HSA_TOOLS_LIB names libkreplay.so: kreplay reads its
 * KREPLAY_* configuration, finds and initializes the tools (kreplay_configure, initialize) and
 * installs itself into `table`. Returns false, with a line on stderr, when kreplay cannot be
 * loaded (a malformed KREPLAY_* value, a table without the entries kreplay needs; both are
 * checked before any tool is initialized), and when it was loaded once already in this process
 * and finalized by hsa_shut_down: tools are initialized once per process, so a runtime
 * initialized again is not profiled. The runtime then continues without kreplay.
 * `table` must stay valid and writable for every later call through it.
 */
bool OnLoad(struct HsaApiTable* table, uint64_t runtime_version, uint64_t failed_tool_count,
            const char* const* failed_tool_names);

/**
 * The HSA tools-library shutdown entry point, defined by libkreplay. The runtime calls it from
 * hsa_shut_down: replay stops, every active tool's contexts are stopped and its finalize runs
 * (in reverse order of initialization). A replay already running on another thread goes on to
 * its end, and work submitted meanwhile on its agents waits for it. In a child forked from the
 * process kreplay replays nothing, and its OnUnload does not wait for callbacks or finalizes
 * of the parent's other threads.
 */
void OnUnload(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KREPLAY_H */
