/*
 * OnUnload while an application thread is in the middle of a replay. Every dispatch asks for 3
 * passes; at PASS ENTER of pass 1 of the first one the tool lets the application's main thread
 * call OnUnload (probe_unload_go) and waits (bounded, 20 s) until kreplay has stopped its context,
 * which OnUnload does after kreplay stopped intercepting. The replay must then end with the
 * application's memory as after one run, later dispatches (kreplay no longer intercepting) must
 * run once each, and nothing of the tool may be called after its finalize.
 * PROBE_MODE=finalize_in_callback: once its context is stopped, the waiting callback also calls
 * the client finalize function itself; OnUnload's finalize waits for that callback, so the
 * call must not wait for OnUnload's finalize in turn, and the tool's finalize must come after
 * the callback returned.
 */
#include "kreplay.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static kreplay_context_id_t replay_ctx;
static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static atomic_int go, finalized, after_finalize, waited_in_vain, did_wait;
static atomic_int in_callback, finalize_during_callback;
static char report[256];

/* For the application: has the replay reached the point where OnUnload should run? */
int probe_unload_go(void) { return atomic_load(&go); }

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    if (atomic_load(&finalized)) atomic_fetch_add(&after_finalize, 1);
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    int expected = 0;
    (void)user;
    (void)data;
    if (atomic_load(&finalized)) atomic_fetch_add(&after_finalize, 1);
    atomic_fetch_add(&in_callback, 1);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = three;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 1 && atomic_compare_exchange_strong(&did_wait, &expected, 1)) {
        time_t until = time(NULL) + 20;
        int active = 1;
        atomic_store(&go, 1);
        while (active && time(NULL) < until) {
            if (kreplay_context_is_active(replay_ctx, &active) != KREPLAY_STATUS_SUCCESS) break;
            sched_yield();
        }
        if (active) atomic_store(&waited_in_vain, 1);
        if (getenv("PROBE_MODE") && strcmp(getenv("PROBE_MODE"), "finalize_in_callback") == 0)
            finalize_self(self_id);
    }
    atomic_fetch_sub(&in_callback, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)tool_data;
    finalize_self = fin;
    if (kreplay_create_context(&replay_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    return kreplay_start_context(replay_ctx) != KREPLAY_STATUS_SUCCESS;
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    if (atomic_load(&in_callback)) atomic_store(&finalize_during_callback, 1);
    atomic_store(&finalized, 1);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-unload-mid-replay";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    if (!atomic_load(&did_wait)) snprintf(report, sizeof report, "no replay reached pass 1");
    else if (atomic_load(&waited_in_vain))
        snprintf(report, sizeof report, "OnUnload did not stop the tool's context within 20 s");
    else if (!atomic_load(&finalized)) snprintf(report, sizeof report, "the tool was never finalized");
    else if (atomic_load(&finalize_during_callback))
        snprintf(report, sizeof report, "the tool's finalize ran while one of its callbacks was still running");
    else if (atomic_load(&after_finalize))
        snprintf(report, sizeof report, "%d call(s) reached the tool after its finalize", atomic_load(&after_finalize));
    return report;
}
