/*
 * A profiler that keeps all its HSA calls on one helper thread of its own: at PASS ENTER of pass
 * 0 its replay callback asks the helper to run a small readback dispatch on the replayed agent
 * and waits (up to 4 s) for the answer. PROBE_SAME_THREAD=1 does the same from the callback's own
 * thread instead (the case kreplay documents).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*submit_fn)(uint64_t agent, uint32_t timeout_ms);
static submit_fn submit;
static uint64_t own_kernel;
static pthread_t helper;
static atomic_ullong request_agent;
static atomic_int request, answer, done_count, late_count, asked;
static char report[256];

void probe_set_submit(submit_fn f, uint64_t kernel) {
    submit = f;
    own_kernel = kernel;
}

static void* helper_main(void* arg) {
    (void)arg;
    for (;;) {
        while (!atomic_load(&request)) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
        atomic_store(&answer, submit(atomic_load(&request_agent), 3000) == 0 ? 1 : 2);
        atomic_store(&request, 0);
    }
    return NULL;
}

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (p->dispatch_info.kernel_id == own_kernel) return;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = two;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && submit && atomic_fetch_add(&asked, 1) < 1) {
        const char* same = getenv("PROBE_SAME_THREAD");
        if (same && same[0] == '1') {
            if (submit(p->dispatch_info.agent_id.handle, 3000) == 0)
                atomic_fetch_add(&done_count, 1);
            else
                atomic_fetch_add(&late_count, 1);
            return;
        }
        int waited = 0;
        atomic_store(&answer, 0);
        atomic_store(&request_agent, p->dispatch_info.agent_id.handle);
        atomic_store(&request, 1);
        while (atomic_load(&answer) == 0 && waited < 4000) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
            waited++;
        }
        if (atomic_load(&answer) == 1)
            atomic_fetch_add(&done_count, 1);
        else
            atomic_fetch_add(&late_count, 1);
        /* The helper may still be stuck submitting: it finishes once the replay is over. */
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL))
        return 1;
    if (kreplay_start_context(ctx)) return 1;
    return pthread_create(&helper, NULL, helper_main, NULL) != 0;
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-worker-submits";
    return &result;
}

const char* probe_report(void) {
    if (atomic_load(&late_count) || atomic_load(&done_count) == 0) {
        snprintf(report, sizeof report,
                 "readback dispatches the tool's helper thread submitted while the callback waited: %d completed "
                 "in time, %d did not complete within 3 s",
                 atomic_load(&done_count), atomic_load(&late_count));
        return report;
    }
    return "";
}
