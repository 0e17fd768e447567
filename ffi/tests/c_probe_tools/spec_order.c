/*
 * SPEC §2 callback flow: "CONFIG EXIT; fire the application's completion signal once; release the
 * lock". The application's completion signal must still be unfired in every record of a replay,
 * CONFIG EXIT included; for a dispatch that runs once (pass count 1) it fires after CONFIG EXIT
 * too. The test hands the tool the signal of each dispatch and the runtime's load function before
 * it submits the dispatch. Odd dispatches: 3 passes; even ones: 1.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct { uint64_t handle; } spec_signal_t;
typedef int64_t (*spec_load_t)(spec_signal_t);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[4096];
static size_t problems, checked;
static spec_signal_t watched;
static spec_load_t load;

static void problem(const char* what, uint64_t id, int64_t value) {
    size_t used = strlen(report);
    problems++;
    if (used + 200 < sizeof report)
        snprintf(report + used, sizeof report - used, "dispatch %llu: %s (signal value %lld); ", (unsigned long long)id,
                 what, (long long)value);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)user;
    return info.dispatch_id % 2 ? 3 : 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    static const char* names[5][3] = {{"?", "?", "?"},
                                      {"?", "CONFIG ENTER", "CONFIG EXIT"},
                                      {"?", "PASS ENTER", "PASS EXIT"},
                                      {"?", "SNAPSHOT ENTER", "SNAPSHOT EXIT"},
                                      {"?", "RESTORE ENTER", "RESTORE EXIT"}};
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
    uint64_t id = record.operation <= KREPLAY_KERNEL_REPLAY_PASS ? p->dispatch_info.dispatch_id : m->dispatch_info.dispatch_id;
    (void)user;
    (void)data;
    pthread_mutex_lock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = pass_count;
    if (load && record.operation < 5 && record.phase < 3) {
        int64_t v = load(watched);
        checked++;
        if (v != 1) {
            char what[96];
            snprintf(what, sizeof what, "the application's completion fired before %s", names[record.operation][record.phase]);
            problem(what, id, v);
        }
    }
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL))
        return 1;
    return kreplay_start_context(ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "spec-order";
    return &result;
}

/* Called by the test before it submits a dispatch whose completion is `signal`. */
void spec_watch(spec_signal_t signal, spec_load_t loader) {
    pthread_mutex_lock(&lock);
    watched = signal;
    load = loader;
    pthread_mutex_unlock(&lock);
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    /* 2 replayed dispatches of 14 records, 2 run once of 2. */
    if (!problems && checked != 32) problem("not every record was checked (count)", 0, (int64_t)checked);
    pthread_mutex_unlock(&lock);
    return report;
}
