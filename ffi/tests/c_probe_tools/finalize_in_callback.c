/*
 * A profiler that detaches itself once it has what it wants: on the first dispatch it calls the
 * kreplay_client_finalize_t it was given in initialize (header: "calling it with the tool's
 * client id finalizes the tool early (its contexts are stopped, then its finalize runs once)")
 * from inside one of its replay callbacks (PROBE_FINALIZE_AT: config_enter or pass_enter).
 * After its finalize has run, nothing of the tool may be called any more: it records every
 * call of its callbacks, pass-count and continue functions that arrives after finalize.
 * PROBE_RESTART_IN_FINALIZE=1: its finalize also starts its contexts again (an author's slip);
 * that must be refused and must not bring its callbacks back.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static kreplay_context_id_t replay_ctx, trace_ctx;
static atomic_int finalized;
static atomic_int finalize_calls;
static atomic_int did_finalize_request;
static atomic_int after[8]; /* 0 replay records, 1 pass_count, 2 continue, 3 dispatch records */
static kreplay_status_t restart_status[2] = {-1, -1};
static char report[1024];
static const char* where;

static void note_after(int what) {
    if (atomic_load(&finalized)) atomic_fetch_add(&after[what], 1);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    note_after(1);
    return 4;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t pass, uint64_t total,
                      kreplay_user_data_t user) {
    (void)info;
    (void)pass;
    (void)total;
    (void)user;
    note_after(2);
    return 1;
}

static void detach_once(void) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&did_finalize_request, &expected, 1)) finalize_self(self_id);
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)user;
    (void)data;
    note_after(0);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        p->replay_pass_count = pass_count;
        p->replay_continue = keep_going;
        if (strcmp(where, "config_enter") == 0) detach_once();
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        strcmp(where, "pass_enter") == 0)
        detach_once();
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)record;
    (void)user;
    (void)data;
    note_after(3);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)tool_data;
    finalize_self = fin;
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    return kreplay_start_context(replay_ctx) || kreplay_start_context(trace_ctx);
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    atomic_fetch_add(&finalize_calls, 1);
    atomic_store(&finalized, 1);
    if (getenv("PROBE_RESTART_IN_FINALIZE")) {
        restart_status[0] = kreplay_start_context(replay_ctx);
        restart_status[1] = kreplay_start_context(trace_ctx);
    }
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    where = getenv("PROBE_FINALIZE_AT") ? getenv("PROBE_FINALIZE_AT") : "config_enter";
    client_id->name = "probe-finalize-in-callback";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    report[0] = 0;
    if (atomic_load(&finalize_calls) != 1)
        snprintf(report + strlen(report), sizeof report - strlen(report), "finalize ran %d time(s), want 1; ",
                 atomic_load(&finalize_calls));
    if (atomic_load(&after[0]) || atomic_load(&after[1]) || atomic_load(&after[2]) || atomic_load(&after[3]))
        snprintf(report + strlen(report), sizeof report - strlen(report),
                 "after the tool's finalize ran (requested at %s), kreplay still called it: %d replay "
                 "record(s), %d replay_pass_count call(s), %d replay_continue call(s), %d dispatch record(s); ",
                 where, atomic_load(&after[0]), atomic_load(&after[1]), atomic_load(&after[2]),
                 atomic_load(&after[3]));
    if (getenv("PROBE_RESTART_IN_FINALIZE") &&
        (restart_status[0] != KREPLAY_STATUS_ERROR_FINALIZED ||
         restart_status[1] != KREPLAY_STATUS_ERROR_FINALIZED))
        snprintf(report + strlen(report), sizeof report - strlen(report),
                 "kreplay_start_context from the tool's finalize returned %s and %s, not "
                 "KREPLAY_STATUS_ERROR_FINALIZED; ",
                 kreplay_get_status_name(restart_status[0]),
                 kreplay_get_status_name(restart_status[1]));
    return report;
}
