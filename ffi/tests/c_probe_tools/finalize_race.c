/*
 * A replay tool finalized by one of its own threads while kreplay is inside one of its function
 * callbacks on another: the pass-count callback (PROBE_MODE=pass_count) or the continue callback
 * (PROBE_MODE=continue) of the first dispatch starts a thread that calls the client finalize
 * function, then waits up to 3 s to see whether the tool's finalize runs meanwhile. kreplay
 * finalizes a tool only after its callbacks running on other threads have returned, so the
 * finalize must not run while the callback still does; nothing may reach the tool after it.
 */
#include "kreplay.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* mode;
static kreplay_context_id_t replay_ctx;
static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int finalized;
static atomic_int started_race, overlapped, calls_after;
static char report[512];

static void* finalizer(void* arg) {
    (void)arg;
    finalize_self(self_id);
    return NULL;
}

/* In a callback: have another thread finalize the tool; did its finalize run before we return? */
static void race(void) {
    int expected = 0;
    pthread_t t;
    struct timespec until;
    if (!atomic_compare_exchange_strong(&started_race, &expected, 1)) return;
    if (pthread_create(&t, NULL, finalizer, NULL) != 0) return;
    pthread_detach(t);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 3;
    pthread_mutex_lock(&lock);
    while (!finalized)
        if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT) break;
    if (finalized) atomic_store(&overlapped, 1);
    pthread_mutex_unlock(&lock);
}

static void note_call(void) {
    pthread_mutex_lock(&lock);
    if (finalized) atomic_fetch_add(&calls_after, 1);
    pthread_mutex_unlock(&lock);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    note_call();
    if (strcmp(mode, "pass_count") == 0) race();
    return 3;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t pass, uint64_t total, kreplay_user_data_t user) {
    (void)info;
    (void)pass;
    (void)total;
    (void)user;
    note_call();
    if (strcmp(mode, "continue") == 0) race();
    return 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    note_call();
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = pass_count;
        p->replay_continue = keep_going;
    }
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
    pthread_mutex_lock(&lock);
    finalized = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    mode = getenv("PROBE_MODE") ? getenv("PROBE_MODE") : "pass_count";
    client_id->name = "probe-finalize-race";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    if (!atomic_load(&started_race))
        snprintf(report, sizeof report, "%s: the callback that finalizes was never called", mode);
    else if (!finalized)
        snprintf(report, sizeof report, "%s: the tool was never finalized", mode);
    else if (atomic_load(&overlapped) || atomic_load(&calls_after))
        snprintf(report, sizeof report,
                 "%s: the tool's finalize %s while its %s callback was still running on another "
                 "thread; %d call(s) reached it after its finalize",
                 mode, atomic_load(&overlapped) ? "ran" : "did not run", mode, atomic_load(&calls_after));
    pthread_mutex_unlock(&lock);
    return report;
}
