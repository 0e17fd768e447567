/*
 * A tool that tears kreplay down from inside its own callback: it calls OnUnload (exported by
 * libkreplay, declared in kreplay.h for runtimes) from the record PROBE_AT names: config_enter,
 * pass_enter, snapshot_exit, restore_enter, enqueue_enter, enqueue_exit or complete. The call
 * must return promptly (nothing waits for the callback it is made from: within 5 s, where every
 * wait of kreplay's for other threads is 10 s), the tool's finalize must run once, no
 * callback of the tool may begin after the call returned, kreplay must say it is finalized and
 * refuse to start the tool's contexts again, and the application's results must stay those of
 * one run (the harness checks them; its own OnUnload later finds nothing left to do).
 *
 * PROBE_ARMED=0: the call is made only once the harness armed the tool (`probe_arm`), so that it
 * comes from the record of one dispatch the harness chose (one made from a thread-local
 * destructor, say).
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* at;
static kreplay_context_id_t replay_ctx, trace_ctx;
static atomic_int unloading, unloaded, finalizes, late_calls, finalize_inside, armed = 1;
static char report[512];

static void problem(const char* fmt, long long a) {
    size_t len = strlen(report);
    if (len + 160 > sizeof report) return;
    snprintf(report + len, sizeof report - len, fmt, a);
    strcat(report, "; ");
}

void probe_arm(void) { atomic_store(&armed, 1); }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void entered(void) {
    if (atomic_load(&unloaded)) atomic_fetch_add(&late_calls, 1);
}

static void maybe_unload(const char* here) {
    int flag = -1;
    double began;
    if (strcmp(here, at) != 0 || !atomic_load(&armed) || atomic_exchange(&unloading, 1)) return;
    began = now_s();
    OnUnload();
    if (now_s() - began > 5.0) problem("OnUnload took %lld ms", (long long)((now_s() - began) * 1000.0));
    atomic_store(&unloaded, 1);
    if (atomic_load(&finalizes) != 1) problem("after OnUnload the tool was finalized %lld time(s)", atomic_load(&finalizes));
    if (kreplay_is_finalized(&flag) != KREPLAY_STATUS_SUCCESS || flag != 1)
        problem("after OnUnload kreplay_is_finalized says %lld", flag);
    if (kreplay_start_context(replay_ctx) != KREPLAY_STATUS_ERROR_FINALIZED)
        problem("after OnUnload a context of the tool could be started (%lld)", 0);
}

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t ud) {
    (void)info;
    (void)ud;
    entered();
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)ud;
    (void)data;
    entered();
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = three;
        maybe_unload("config_enter");
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        maybe_unload("pass_enter");
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        maybe_unload("snapshot_exit");
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_RESTORE && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        maybe_unload("restore_enter");
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    (void)ud;
    (void)data;
    entered();
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        maybe_unload("enqueue_enter");
    else if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE && record.phase == KREPLAY_CALLBACK_PHASE_EXIT)
        maybe_unload("enqueue_exit");
    else if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE)
        maybe_unload("complete");
}

static int initialize(kreplay_client_finalize_t fini, void* tool_data) {
    (void)fini;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx) != KREPLAY_STATUS_SUCCESS ||
        kreplay_create_context(&trace_ctx) != KREPLAY_STATUS_SUCCESS ||
        kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) != KREPLAY_STATUS_SUCCESS ||
        kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL) != KREPLAY_STATUS_SUCCESS ||
        kreplay_start_context(replay_ctx) != KREPLAY_STATUS_SUCCESS ||
        kreplay_start_context(trace_ctx) != KREPLAY_STATUS_SUCCESS)
        problem("setup failed (%lld)", 0);
    return 0;
}

static void finalize(void* tool_data) {
    (void)tool_data;
    atomic_fetch_add(&finalizes, 1);
    if (atomic_load(&unloading) && !atomic_load(&unloaded)) atomic_store(&finalize_inside, 1);
}

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), initialize, finalize, NULL};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "unload_from_callback";
    at = getenv("PROBE_AT");
    if (at == NULL) at = "pass_enter";
    if (getenv("PROBE_ARMED") != NULL && strcmp(getenv("PROBE_ARMED"), "0") == 0) atomic_store(&armed, 0);
    return &result;
}

const char* probe_report(void) {
    if (!atomic_load(&unloaded)) problem("the tool never reached its OnUnload call (%lld)", 0);
    if (atomic_load(&finalizes) != 1) problem("the tool was finalized %lld time(s)", atomic_load(&finalizes));
    if (!atomic_load(&finalize_inside)) problem("the tool's finalize did not run within its OnUnload call%lld", 0);
    if (atomic_load(&late_calls) != 0)
        problem("%lld callback(s) of the tool began after its OnUnload call returned", atomic_load(&late_calls));
    return report;
}
