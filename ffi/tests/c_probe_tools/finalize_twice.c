/*
 * A tool finalized from two places at once. After the CONFIG EXIT of a chosen dispatch a tool
 * thread calls the client finalize function; the tool's finalize then waits (bounded) while
 *   PROBE_MODE=two_threads  a second tool thread calls the client finalize function too: when
 *                           that call returns, the tool must be finalized (its finalize done);
 *   PROBE_MODE=unload       the application ends and the runtime calls OnUnload: kreplay must
 *                           not report itself finalized (kreplay_is_finalized) while the tool's
 *                           finalize still runs, since after OnUnload the library may be gone.
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
static int in_fini, fini_done, second_returned, started;
static int config_exits, trigger_at;
static pthread_t first, second;
static char report[512];

static void problem(const char* what) {
    size_t len = strlen(report);
    if (len + strlen(what) + 3 < sizeof report) {
        strcat(report, what);
        strcat(report, "; ");
    }
}

/* Waits (lock held) until *flag is set or `seconds` passed. */
static void wait_for(int* flag, int seconds) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    while (!*flag)
        if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT) break;
}

static void* first_finalizer(void* arg) {
    (void)arg;
    finalize_self(self_id);
    return NULL;
}

static void* second_finalizer(void* arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    wait_for(&in_fini, 20);
    pthread_mutex_unlock(&lock);
    finalize_self(self_id);
    pthread_mutex_lock(&lock);
    second_returned = 1;
    if (!fini_done)
        problem("a second call of the client finalize function returned while the tool's finalize "
                "(started by another thread) had not finished");
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG || record.phase != KREPLAY_CALLBACK_PHASE_EXIT) return;
    pthread_mutex_lock(&lock);
    if (++config_exits == trigger_at && !started) {
        started = 1;
        pthread_create(&first, NULL, first_finalizer, NULL);
        if (strcmp(mode, "two_threads") == 0) pthread_create(&second, NULL, second_finalizer, NULL);
    }
    pthread_mutex_unlock(&lock);
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
    int unloaded = 0, i;
    (void)tool_data;
    pthread_mutex_lock(&lock);
    in_fini = 1;
    pthread_cond_broadcast(&cond);
    if (strcmp(mode, "two_threads") == 0) wait_for(&second_returned, 3);
    pthread_mutex_unlock(&lock);
    if (strcmp(mode, "unload") == 0) {
        /* Up to 5 s: does OnUnload finish meanwhile? */
        for (i = 0; i < 500 && !unloaded; i++) {
            struct timespec ten_ms = {0, 10 * 1000 * 1000};
            int s = 0;
            if (kreplay_is_finalized(&s) == KREPLAY_STATUS_SUCCESS && s) unloaded = 1;
            else nanosleep(&ten_ms, NULL);
        }
    }
    pthread_mutex_lock(&lock);
    if (unloaded) problem("kreplay reported itself finalized (OnUnload done) while the tool's finalize still ran");
    fini_done = 1;
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
    mode = getenv("PROBE_MODE") ? getenv("PROBE_MODE") : "two_threads";
    trigger_at = getenv("PROBE_TRIGGER_AT") ? atoi(getenv("PROBE_TRIGGER_AT")) : 1;
    client_id->name = "probe-finalize-twice";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    if (started) {
        pthread_join(first, NULL);
        if (strcmp(mode, "two_threads") == 0) pthread_join(second, NULL);
    }
    pthread_mutex_lock(&lock);
    if (!started) problem("the finalizing thread never started");
    else if (!fini_done) problem("the tool's finalize never ran");
    pthread_mutex_unlock(&lock);
    return report;
}
