/*
 * A kernel-replay tool written in C against kreplay.h that records how each replay ended, as
 * the payloads tell it: CONFIG EXIT (outcome, end reason, status, decline reason, passes run,
 * bytes lost), SNAPSHOT and RESTORE EXIT (status, decline reason, bytes lost, repairs,
 * unverified). The test picks the pass-count answer before each dispatch. Compiled with
 * -std=c99 -Wall -Wextra -Werror.
 */
#include "kreplay.h"

#include <stdio.h>
#include <string.h>

#define MAX_EVENTS 256

/* One EXIT record as the tool saw it (read by the test through outcomes_tool_events). */
typedef struct outcomes_event_t {
    uint32_t operation;
    uint32_t record_decline_reason;
    uint64_t dispatch_id;
    uint64_t current_pass;
    /* CONFIG EXIT */
    uint32_t outcome;
    uint32_t end_reason;
    int32_t status;
    uint32_t decline_reason;
    uint64_t passes_run;
    uint64_t bytes_lost;
    /* SNAPSHOT / RESTORE EXIT */
    uint64_t bytes_moved;
    uint64_t chunks_restored;
    uint64_t chunks_repaired;
    uint32_t unverified;
    uint32_t strategy;
} outcomes_event_t;

static outcomes_event_t events[MAX_EVENTS];
static size_t event_count;
static int failures;
static char first_failure[256];
static int initialized;
static uint64_t answer_passes = 1;
static int answer_continue;

static void fail(const char* what, long long value) {
    if (failures++ == 0) snprintf(first_failure, sizeof first_failure, "%s (%lld)", what, value);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return answer_passes;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t current, uint64_t total,
                      kreplay_user_data_t user) {
    (void)info;
    (void)current;
    (void)total;
    (void)user;
    return 1; /* never stops on its own */
}

static outcomes_event_t* push(kreplay_callback_tracing_record_t record) {
    outcomes_event_t* e;
    if (event_count == MAX_EVENTS) {
        fail("event log full", 0);
        return NULL;
    }
    e = &events[event_count++];
    memset(e, 0, sizeof *e);
    e->operation = record.operation;
    e->record_decline_reason = record.decline_reason;
    return e;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG || record.operation == KREPLAY_KERNEL_REPLAY_PASS) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        if (p->size < sizeof *p) fail("replay payload without the outcome fields", (long long)p->size);
        if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            p->replay_pass_count = pass_count;
            p->replay_continue = answer_continue ? keep_going : NULL;
            if (p->outcome != KREPLAY_REPLAY_OUTCOME_NONE) fail("outcome set at CONFIG ENTER", p->outcome);
        } else if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) {
            outcomes_event_t* e = push(record);
            if (!e) return;
            e->dispatch_id = p->dispatch_info.dispatch_id;
            e->current_pass = p->current_pass;
            e->outcome = p->outcome;
            e->end_reason = p->end_reason;
            e->status = p->status;
            e->decline_reason = p->decline_reason;
            e->passes_run = p->passes_run;
            e->bytes_lost = p->bytes_lost;
        }
    } else if (record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        outcomes_event_t* e;
        if (m->size < sizeof *m) fail("memory payload without the appended fields", (long long)m->size);
        e = push(record);
        if (!e) return;
        e->dispatch_id = m->dispatch_info.dispatch_id;
        e->current_pass = m->current_pass;
        e->status = m->status;
        e->decline_reason = m->decline_reason;
        e->bytes_lost = m->bytes_lost;
        e->bytes_moved = m->bytes_moved;
        e->chunks_restored = m->chunks_restored;
        e->chunks_repaired = m->chunks_repaired;
        e->unverified = m->unverified;
        e->strategy = m->strategy;
    }
}

static int tool_initialize(kreplay_client_finalize_t finalize, void* tool_data) {
    kreplay_context_id_t context;
    (void)finalize;
    (void)tool_data;
    initialized++;
    if (kreplay_create_context(&context) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_configure_callback_tracing_service(context, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) != KREPLAY_STATUS_SUCCESS)
        return -1;
    if (kreplay_start_context(context) != KREPLAY_STATUS_SUCCESS) return -1;
    return 0;
}

static void tool_finalize(void* tool_data) { (void)tool_data; }

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result;
    (void)runtime_version;
    (void)priority;
    if (version / 10000 != KREPLAY_VERSION_MAJOR) return NULL;
    client_id->name = "c-outcomes-tool";
    result.size = sizeof result;
    result.initialize = tool_initialize;
    result.finalize = tool_finalize;
    result.tool_data = NULL;
    return &result;
}

/* Driven and read by the test. */
void outcomes_tool_answer(uint64_t passes, int with_continue) {
    answer_passes = passes;
    answer_continue = with_continue;
}
int outcomes_tool_initialized(void) { return initialized; }
size_t outcomes_tool_event_count(void) { return event_count; }
const outcomes_event_t* outcomes_tool_events(void) { return events; }
int outcomes_tool_failures(const char** first) {
    *first = first_failure;
    return failures;
}
/* The counters as the C ABI gives them. */
kreplay_status_t outcomes_tool_counters(kreplay_counters_t* out) {
    out->size = sizeof *out;
    return kreplay_get_counters(out);
}
