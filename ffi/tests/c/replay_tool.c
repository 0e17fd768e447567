/*
 * A kernel-replay tool written in C against kreplay.h, built as a shared library and loaded by
 * kreplay through KREPLAY_TOOL_LIBRARIES. It replays every dispatch in three passes, enables one
 * of its three dispatch-tracing contexts per pass, and records every callback it receives so the
 * test can check the flow. Compiled with -std=c99 -Wall -Wextra -Werror.
 */
#include "kreplay.h"

#include <stdio.h>
#include <string.h>

#define PASSES 3
#define TRACERS 3
#define MAX_EVENTS 1024
#define USER_MAGIC 0x6b7265706c6179ull /* "kreplay" */

/* One callback as the tool saw it (read by the test through c_tool_events). */
typedef struct c_tool_event_t {
    uint32_t kind;
    uint32_t operation;
    uint32_t phase;
    uint32_t tracer; /* KERNEL_DISPATCH: which tracing context (0..2); else UINT32_MAX */
    uint64_t dispatch_id;
    uint64_t current_pass;   /* KERNEL_REPLAY PASS/RESTORE; KERNEL_DISPATCH: replay_pass */
    uint64_t total_passes;
    uint64_t bytes_planned;  /* SNAPSHOT/RESTORE */
    uint64_t bytes_moved;    /* SNAPSHOT/RESTORE EXIT */
    uint64_t user_data;      /* the value seen in user_data */
    uint32_t decline_reason; /* CONFIG EXIT */
    uint32_t tier;           /* SNAPSHOT/RESTORE */
} c_tool_event_t;

static c_tool_event_t events[MAX_EVENTS];
static size_t event_count;
static int failures;
static char first_failure[256];
static kreplay_context_id_t replay_context;
static kreplay_context_id_t tracers[TRACERS];
static kreplay_context_toggle_cb_t saved_stop; /* to prove toggles refuse outside PASS ENTER */

static void fail(const char* what, int value) {
    if (failures++ == 0) {
        snprintf(first_failure, sizeof first_failure, "%s (%d)", what, value);
    }
}

static c_tool_event_t* push(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user) {
    c_tool_event_t* e;
    if (event_count == MAX_EVENTS) {
        fail("event log full", 0);
        return NULL;
    }
    e = &events[event_count++];
    memset(e, 0, sizeof *e);
    e->kind = record.kind;
    e->operation = record.operation;
    e->phase = record.phase;
    e->tracer = UINT32_MAX;
    e->user_data = user ? user->value : 0;
    e->decline_reason = record.decline_reason;
    return e;
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    if (user.value != (USER_MAGIC ^ info.dispatch_id)) fail("pass_count saw other user_data", 0);
    return PASSES;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    c_tool_event_t* e = push(record, user);
    (void)data;
    if (!e) return;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG || record.operation == KREPLAY_KERNEL_REPLAY_PASS) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        if (p->size != sizeof *p) fail("replay payload size", (int)p->size);
        e->dispatch_id = p->dispatch_info.dispatch_id;
        e->current_pass = p->current_pass;
        e->total_passes = p->total_passes;
        if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            p->replay_pass_count = pass_count;
            user->value = USER_MAGIC ^ p->dispatch_info.dispatch_id;
            e->user_data = user->value;
        } else if (user->value != (USER_MAGIC ^ p->dispatch_info.dispatch_id)) {
            fail("user_data lost between callbacks", (int)record.operation);
        }
        if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            int c;
            if (!p->replay_start_context || !p->replay_stop_context) {
                fail("PASS ENTER without toggles", 0);
                return;
            }
            for (c = 0; c < TRACERS; c++) {
                kreplay_status_t s = (uint64_t)c == p->current_pass % TRACERS
                                         ? p->replay_start_context(tracers[c])
                                         : p->replay_stop_context(tracers[c]);
                if (s != KREPLAY_STATUS_SUCCESS) fail("toggle in PASS ENTER", s);
            }
            saved_stop = p->replay_stop_context;
        }
        if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_EXIT && saved_stop) {
            kreplay_status_t s = saved_stop(tracers[0]);
            if (s != KREPLAY_STATUS_ERROR_CONTEXT_ERROR) fail("toggle outside PASS ENTER was accepted", s);
        }
    } else {
        kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        e->dispatch_id = m->dispatch_info.dispatch_id;
        e->current_pass = m->current_pass;
        e->bytes_planned = m->bytes_planned;
        e->bytes_moved = m->bytes_moved;
        e->tier = m->tier;
        if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
            /* Where the snapshot's regions came from: the test's buffers are the agent's own
             * coarse-grained memory, and the sources add up to what was copied. */
            if (m->size < sizeof *m) {
                fail("SNAPSHOT EXIT payload without the per-source fields", (int)m->size);
            } else if (m->agent_bytes + m->referenced_bytes + m->module_variable_bytes + m->adopted_bytes
                       != m->bytes_moved) {
                fail("per-source bytes do not add up to the bytes moved", (int)m->bytes_moved);
            } else if (m->agent_regions + m->referenced_regions + m->module_variable_regions + m->adopted_regions
                           != m->regions || m->agent_regions == 0) {
                fail("per-source regions do not add up, or the agent's buffers are missing", (int)m->regions);
            }
        }
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    c_tool_event_t* e = push(record, user);
    if (!e) return;
    e->tracer = (uint32_t)(uintptr_t)data;
    e->dispatch_id = p->dispatch_info.dispatch_id;
    e->current_pass = p->replay_pass;
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE) {
        /* user_data written at ENTER must come back at EXIT */
        if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            user->value = 0xe0 + p->replay_pass;
        } else if (user->value != 0xe0 + p->replay_pass) {
            fail("ENQUEUE EXIT lost the user_data of its ENTER", (int)user->value);
        }
    } else if (p->end_timestamp < p->start_timestamp || p->start_timestamp == 0) {
        fail("COMPLETE without ordered timestamps", 0);
    }
}

static int tool_initialize(kreplay_client_finalize_t finalize, void* tool_data) {
    int c;
    (void)finalize;
    (void)tool_data;
    if (kreplay_create_context(&replay_context) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_configure_callback_tracing_service(replay_context, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) != KREPLAY_STATUS_SUCCESS)
        return -1;
    if (kreplay_start_context(replay_context) != KREPLAY_STATUS_SUCCESS) return -1;
    for (c = 0; c < TRACERS; c++) {
        uint32_t operations[2] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE, KREPLAY_KERNEL_DISPATCH_COMPLETE};
        if (kreplay_create_context(&tracers[c]) != KREPLAY_STATUS_SUCCESS) return -1;
        if (kreplay_configure_callback_tracing_service(tracers[c], KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, operations,
                                                       2, on_dispatch, (void*)(uintptr_t)c) != KREPLAY_STATUS_SUCCESS)
            return -1;
        if (kreplay_start_context(tracers[c]) != KREPLAY_STATUS_SUCCESS) return -1;
    }
    return 0;
}

static void tool_finalize(void* tool_data) { (void)tool_data; }

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result;
    (void)runtime_version;
    (void)priority;
    if (version / 10000 != KREPLAY_VERSION_MAJOR) return NULL;
    client_id->name = "c-replay-tool";
    result.size = sizeof result;
    result.initialize = tool_initialize;
    result.finalize = tool_finalize;
    result.tool_data = NULL;
    return &result;
}

/* Read by the test. */
size_t c_tool_event_count(void) { return event_count; }
const c_tool_event_t* c_tool_events(void) { return events; }
int c_tool_failures(const char** first) {
    *first = first_failure;
    return failures;
}
int c_tool_contexts_active(void) {
    int c, active = 0, all = 1;
    for (c = 0; c < TRACERS; c++) {
        if (kreplay_context_is_active(tracers[c], &active) != KREPLAY_STATUS_SUCCESS || !active) all = 0;
    }
    return all;
}
