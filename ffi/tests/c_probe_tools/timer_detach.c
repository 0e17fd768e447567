/*
 * A profiler with a time limit: a thread of its own detaches it (kreplay_client_finalize_t) while
 * the application runs. Here the timer fires while a replay callback of the tool is running on
 * the application's thread (PASS ENTER of the first dispatch, which takes 300 ms). The header
 * says finalizing stops the tool's contexts and *then* runs its finalize, and that kreplay passes
 * the tool's data "until the tool is finalized": a profiler frees its state in finalize, so
 * finalize must not run while one of its callbacks is still running.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static atomic_int in_callback, finalize_overlapped, finalized, fired;
static pthread_t timer;
static char report[256];

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void* timer_main(void* arg) {
    int waited = 0;
    (void)arg;
    while (!atomic_load(&in_callback) && waited < 10000) {
        sleep_ms(1);
        waited++;
    }
    if (atomic_load(&in_callback)) {
        atomic_store(&fired, 1);
        finalize_self(self_id);
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
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = two;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && p->dispatch_info.dispatch_id == 1) {
        atomic_store(&in_callback, 1);
        sleep_ms(300); /* the profiler programs its counters */
        atomic_store(&in_callback, 0);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)tool_data;
    finalize_self = fin;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL))
        return 1;
    if (kreplay_start_context(ctx)) return 1;
    return pthread_create(&timer, NULL, timer_main, NULL) != 0;
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    if (atomic_load(&in_callback)) atomic_store(&finalize_overlapped, 1);
    atomic_fetch_add(&finalized, 1);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, tool_fini,
                                                     NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-timer-detach";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    pthread_join(timer, NULL);
    if (!atomic_load(&fired)) return "the timer never saw the callback running";
    if (atomic_load(&finalized) != 1) {
        snprintf(report, sizeof report, "finalize ran %d time(s)", atomic_load(&finalized));
        return report;
    }
    if (atomic_load(&finalize_overlapped))
        return "the tool's finalize ran while its PASS ENTER callback was still running on the application "
               "thread (finalize_func called from the tool's timer thread did not wait for it)";
    return "";
}
