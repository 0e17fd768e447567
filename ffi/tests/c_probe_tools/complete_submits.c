/*
 * A tracing tool that reads results back with a small kernel of its own when an application
 * dispatch completes (what a profiler does to collect a buffer its instrumentation filled):
 * in its KERNEL_DISPATCH COMPLETE callback it submits one dispatch through the HSA runtime (the
 * harness's `submit` hook goes through the same kreplay-wrapped table the application uses) and
 * waits for it. kreplay.h: "A callback may submit GPU work. ... it never deadlocks"; RELIABILITY.md:
 * such work "runs exactly once, promptly (the tool may wait for it in the callback)".
 * PROBE_WITH_REPLAY=1 also owns kernel replay (3 passes) so the application's dispatches are
 * replayed and the COMPLETE records are those of passes.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*submit_fn)(uint64_t agent, uint32_t timeout_ms);
static submit_fn submit;
static uint64_t own_kernel;
static kreplay_context_id_t trace_ctx, replay_ctx;
static atomic_int submitted, completed_in_time, timed_out, errors, app_completes;
static char report[512];
static char cb_thread[32];

void probe_set_submit(submit_fn f, uint64_t kernel) {
    submit = f;
    own_kernel = kernel;
}

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->dispatch_info.kernel_id != own_kernel)
        p->replay_pass_count = three;
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    int rc;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_DISPATCH_COMPLETE || !submit) return;
    if (p->dispatch_info.kernel_id == own_kernel) return;
    atomic_fetch_add(&app_completes, 1);
    if (!cb_thread[0]) {
        FILE* f = fopen("/proc/thread-self/comm", "r");
        if (f) {
            if (!fgets(cb_thread, sizeof cb_thread, f)) cb_thread[0] = 0;
            cb_thread[strcspn(cb_thread, "\n")] = 0;
            fclose(f);
        }
    }
    /* Only for the first two application completions: enough to show it, bounded in time. */
    if (atomic_fetch_add(&submitted, 1) >= 2) return;
    rc = submit(p->dispatch_info.agent_id.handle, 3000);
    if (rc == 0)
        atomic_fetch_add(&completed_in_time, 1);
    else if (rc == 1)
        atomic_fetch_add(&timed_out, 1);
    else
        atomic_fetch_add(&errors, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    uint32_t ops[1] = {KREPLAY_KERNEL_DISPATCH_COMPLETE};
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, ops, 1,
                                                   on_dispatch, NULL))
        return 1;
    if (getenv("PROBE_WITH_REPLAY") && strcmp(getenv("PROBE_WITH_REPLAY"), "1") == 0) {
        if (kreplay_create_context(&replay_ctx)) return 1;
        if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                       on_replay, NULL))
            return 1;
        if (kreplay_start_context(replay_ctx)) return 1;
    }
    return kreplay_start_context(trace_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-complete-submits";
    return &result;
}

const char* probe_report(void) {
    report[0] = 0;
    if (atomic_load(&timed_out) || atomic_load(&errors) || atomic_load(&completed_in_time) == 0)
        snprintf(report, sizeof report,
                 "of %d dispatch(es) the tool submitted from its COMPLETE callback and waited for (3 s each), "
                 "%d completed in time, %d did not complete within 3 s, %d could not be submitted "
                 "(%d application COMPLETE records seen, delivered on thread '%s')",
                 atomic_load(&submitted) < 2 ? atomic_load(&submitted) : 2, atomic_load(&completed_in_time),
                 atomic_load(&timed_out), atomic_load(&errors), atomic_load(&app_completes), cb_thread);
    return report;
}
