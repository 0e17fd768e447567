/*
 * pass_counter: a complete kreplay tool in C.
 *
 * It replays every kernel dispatch in EXAMPLE_TOOL_PASSES passes (default 3), counts what it
 * sees (passes, bytes snapshotted and restored, dispatch submissions and completions per pass,
 * declined dispatches) and writes one summary line when kreplay finalizes it: to the file named by
 * EXAMPLE_TOOL_OUTPUT, or to stderr (the application's standard output stays its own: kreplay run
 * --check compares it with a run without kreplay). docs/c-tools.md walks through it.
 *
 * Build (C11, for <stdatomic.h>):
 *   cc -std=c11 -fPIC -shared -I ffi/include examples/c-tool/pass_counter.c \
 *      -L target/release -lkreplay -o libpass_counter.so
 * Run it under the demo:
 *   kreplay demo --tool ./libpass_counter.so
 * or on ROCm:
 *   HSA_TOOLS_LIB=/path/libkreplay.so KREPLAY_TOOL_LIBRARIES=$PWD/libpass_counter.so ./app
 */
#include "kreplay.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_PASSES 3
#define MAX_PASSES 64

/* Callbacks may run on several runtime threads at once (one per queue being replayed, the
 * threads that complete dispatches), so every counter is atomic. */
static struct {
    uint64_t passes; /* asked for each dispatch; set once in initialize */
    atomic_uint_fast64_t dispatches;      /* CONFIG EXIT records */
    atomic_uint_fast64_t replayed;        /* ... of dispatches that ran more than one pass */
    atomic_uint_fast64_t declined;        /* ... of dispatches kreplay declined to replay */
    atomic_uint_fast64_t passes_run;      /* PASS EXIT records */
    atomic_uint_fast64_t bytes_snapshot;  /* SNAPSHOT EXIT: bytes copied into the snapshot */
    atomic_uint_fast64_t bytes_restored;  /* RESTORE EXIT: bytes copied back */
    atomic_uint_fast64_t restore_failures;
    atomic_uint_fast64_t completions_in_passes; /* KERNEL_DISPATCH COMPLETE with a pass */
    atomic_uint_fast64_t completions_once;      /* ... of dispatches that ran once */
    atomic_uint_fast64_t enqueues_in_passes;    /* KERNEL_DISPATCH ENQUEUE EXIT with a pass */
    atomic_uint_fast64_t enqueues_once;         /* ... of dispatches that ran once */
    atomic_uint_fast64_t user_data_errors;      /* user_data not carried through a dispatch */
} counts;

static void count(atomic_uint_fast64_t* counter, uint64_t amount) {
    atomic_fetch_add_explicit(counter, amount, memory_order_relaxed);
}

static uint64_t read_count(atomic_uint_fast64_t* counter) {
    return atomic_load_explicit(counter, memory_order_relaxed);
}

/* ---- kernel replay ---------------------------------------------------------------------- */

/* Asked once per dispatch, right after CONFIG ENTER: how many passes to run. */
static uint64_t pass_count(kreplay_kernel_dispatch_info_t dispatch, kreplay_user_data_t user_data) {
    /* user_data is what on_replay stored at CONFIG ENTER. */
    if (user_data.value != dispatch.dispatch_id) count(&counts.user_data_errors, 1);
    return counts.passes;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user_data,
                      void* callback_data) {
    (void)callback_data;
    switch (record.operation) {
    case KREPLAY_KERNEL_REPLAY_CONFIG: {
        kreplay_callback_tracing_kernel_replay_data_t* data = record.payload;
        if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            /* Opt in to replay: without a pass-count callback the dispatch just runs once. */
            data->replay_pass_count = pass_count;
            /* Seen again in pass_count, every PASS record and CONFIG EXIT of this dispatch. */
            user_data->value = data->dispatch_info.dispatch_id;
        } else {
            /* CONFIG EXIT: how the replay ended. `outcome` was appended to the payload in a
             * later version: read it only when this library filled it in (`size`), else fall
             * back to current_pass, the number of passes that ran. */
            int replayed = data->current_pass > 1;
            if (data->size >= offsetof(kreplay_callback_tracing_kernel_replay_data_t, outcome) +
                                  sizeof data->outcome) {
                replayed = data->outcome == KREPLAY_REPLAY_OUTCOME_REPLAYED ||
                           data->outcome == KREPLAY_REPLAY_OUTCOME_ENDED_EARLY;
            }
            count(&counts.dispatches, 1);
            if (replayed) count(&counts.replayed, 1);
            if (record.decline_reason != KREPLAY_REPLAY_DECLINE_NONE) {
                count(&counts.declined, 1);
                fprintf(stderr, "pass_counter: dispatch %" PRIu64 " not replayed: %s\n",
                        data->dispatch_info.dispatch_id,
                        kreplay_get_decline_reason_string(record.decline_reason));
            }
        }
        break;
    }
    case KREPLAY_KERNEL_REPLAY_PASS: {
        kreplay_callback_tracing_kernel_replay_data_t* data = record.payload;
        if (user_data->value != data->dispatch_info.dispatch_id) count(&counts.user_data_errors, 1);
        /* At PASS ENTER a tool would switch its counter sets here, e.g. with
         * data->replay_start_context / data->replay_stop_context. */
        if (record.phase == KREPLAY_CALLBACK_PHASE_EXIT) count(&counts.passes_run, 1);
        break;
    }
    case KREPLAY_KERNEL_REPLAY_SNAPSHOT:
    case KREPLAY_KERNEL_REPLAY_RESTORE: {
        kreplay_callback_tracing_kernel_replay_memory_data_t* memory = record.payload;
        if (record.phase != KREPLAY_CALLBACK_PHASE_EXIT) break;
        if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT) {
            count(&counts.bytes_snapshot, memory->bytes_moved);
        } else {
            count(&counts.bytes_restored, memory->bytes_moved);
            if (memory->status == KREPLAY_STATUS_ERROR_RESTORE_FAILED) {
                count(&counts.restore_failures, 1);
            }
        }
        break;
    }
    default: /* operations appended in later versions */
        break;
    }
}

/* ---- kernel dispatch tracing ------------------------------------------------------------ */

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user_data,
                        void* callback_data) {
    const kreplay_callback_tracing_kernel_dispatch_data_t* data = record.payload;
    int in_pass = data->replay_pass != KREPLAY_REPLAY_PASS_NONE;
    (void)callback_data;
    /* ENQUEUE and COMPLETE were asked for (see initialize): for each pass of a replayed
     * dispatch, and for each dispatch that ran once, ENQUEUE ENTER before its submission,
     * ENQUEUE EXIT right after, then one COMPLETE once it finished. */
    switch (record.operation) {
    case KREPLAY_KERNEL_DISPATCH_ENQUEUE:
        if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            /* Comes back at this submission's EXIT. */
            user_data->value = data->dispatch_info.dispatch_id + 1;
            break;
        }
        if (user_data->value != data->dispatch_info.dispatch_id + 1) {
            count(&counts.user_data_errors, 1);
        }
        count(in_pass ? &counts.enqueues_in_passes : &counts.enqueues_once, 1);
        break;
    case KREPLAY_KERNEL_DISPATCH_COMPLETE:
        count(in_pass ? &counts.completions_in_passes : &counts.completions_once, 1);
        break;
    default: /* operations appended in later versions */
        break;
    }
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static int check(kreplay_status_t status, const char* what) {
    if (status == KREPLAY_STATUS_SUCCESS) return 0;
    fprintf(stderr, "pass_counter: %s: %s\n", what, kreplay_get_status_string(status));
    return 1;
}

static int initialize(kreplay_client_finalize_t finalize, void* tool_data) {
    kreplay_context_id_t replay;
    kreplay_context_id_t tracing;
    const uint32_t operations[] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE,
                                   KREPLAY_KERNEL_DISPATCH_COMPLETE};
    const char* passes = getenv("EXAMPLE_TOOL_PASSES");
    (void)finalize;
    (void)tool_data;

    counts.passes = DEFAULT_PASSES;
    if (passes != NULL) {
        char* end = NULL;
        unsigned long long value = strtoull(passes, &end, 10);
        if (*passes == '\0' || *end != '\0' || value < 1 || value > MAX_PASSES) {
            fprintf(stderr, "pass_counter: EXAMPLE_TOOL_PASSES=%s is not a number from 1 to %d\n",
                    passes, MAX_PASSES);
            return 1; /* non-zero: kreplay marks this tool as failed */
        }
        counts.passes = value;
    }

    /* One context owns kernel replay (only one in the process may), ... */
    if (check(kreplay_create_context(&replay), "kreplay_create_context")) return 1;
    if (check(kreplay_configure_callback_tracing_service(replay,
                                                         KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                         NULL, 0, on_replay, NULL),
              "configuring kernel replay")) {
        return 1;
    }
    /* ... another traces dispatch submissions and completions. */
    if (check(kreplay_create_context(&tracing), "kreplay_create_context")) return 1;
    if (check(kreplay_configure_callback_tracing_service(
                  tracing, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, operations,
                  sizeof operations / sizeof operations[0], on_dispatch, NULL),
              "configuring dispatch tracing")) {
        return 1;
    }
    if (check(kreplay_start_context(replay), "kreplay_start_context")) return 1;
    if (check(kreplay_start_context(tracing), "kreplay_start_context")) return 1;
    return 0;
}

static void finalize(void* tool_data) {
    const char* path = getenv("EXAMPLE_TOOL_OUTPUT");
    FILE* out = path != NULL ? fopen(path, "w") : stderr;
    (void)tool_data;
    if (out == NULL) {
        perror("pass_counter: cannot open EXAMPLE_TOOL_OUTPUT");
        return;
    }
    fprintf(out, "pass_counter: %" PRIu64 " dispatches, %" PRIu64 " replayed, %" PRIu64
           " declined; %" PRIu64 " passes; snapshot %" PRIu64 " bytes, restored %" PRIu64
           " bytes, %" PRIu64 " restore failures; %" PRIu64 " completions in passes, %" PRIu64
           " single; %" PRIu64 " enqueues in passes, %" PRIu64 " single; %" PRIu64
           " user_data errors\n",
           read_count(&counts.dispatches), read_count(&counts.replayed),
           read_count(&counts.declined), read_count(&counts.passes_run),
           read_count(&counts.bytes_snapshot), read_count(&counts.bytes_restored),
           read_count(&counts.restore_failures), read_count(&counts.completions_in_passes),
           read_count(&counts.completions_once), read_count(&counts.enqueues_in_passes),
           read_count(&counts.enqueues_once), read_count(&counts.user_data_errors));
    if (out == stderr) {
        fflush(out);
    } else {
        fclose(out);
    }
}

/* kreplay finds this symbol in every library of KREPLAY_TOOL_LIBRARIES. */
kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {
        sizeof(kreplay_tool_configure_result_t), initialize, finalize, NULL};
    (void)runtime_version;
    (void)priority;
    /* Built against a header of another major version: stay out (return NULL). */
    if (version / 10000 != KREPLAY_VERSION_MAJOR) return NULL;
    client_id->name = "pass_counter";
    return &result;
}
