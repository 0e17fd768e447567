/*
 * SPEC §2 callback flow: "CONFIG EXIT; fire the application's completion signal once; release the
 * lock". The application's completion signal must still be unfired in every record of a replay,
 * CONFIG EXIT included; for a dispatch that runs once (pass count 1) it fires after CONFIG EXIT
 * too. The test hands the tool the signal of each dispatch and the runtime's load function before
 * it submits the dispatch, and what each dispatch_info must say (the packet's agent, the `id` of
 * its hsa_queue_t, kernel object, sizes). Odd dispatches: 3 passes; even ones: 1.
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
static kreplay_kernel_dispatch_info_t expected; /* set by the test: the packet's fields */

static void problem(const char* what, uint64_t id, int64_t value) {
    size_t used = strlen(report);
    problems++;
    if (used + 700 < sizeof report)
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
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        kreplay_kernel_dispatch_info_t got = p->dispatch_info;
        p->replay_pass_count = pass_count;
        /* dispatch_info describes the packet the application submitted. */
        got.dispatch_id = 0;
        if (memcmp(&got, &expected, sizeof got) != 0) {
            char what[512];
            snprintf(what, sizeof what,
                     "CONFIG ENTER dispatch_info does not describe the submitted packet: size %llu agent %llx queue %llx "
                     "kernel %llx private %u group %u workgroup %u,%u,%u grid %u,%u,%u; want agent %llx queue %llx kernel %llx",
                     (unsigned long long)got.size, (unsigned long long)got.agent_id.handle,
                     (unsigned long long)got.queue_id.handle, (unsigned long long)got.kernel_id, got.private_segment_size,
                     got.group_segment_size, got.workgroup_size.x, got.workgroup_size.y, got.workgroup_size.z,
                     got.grid_size.x, got.grid_size.y, got.grid_size.z, (unsigned long long)expected.agent_id.handle,
                     (unsigned long long)expected.queue_id.handle, (unsigned long long)expected.kernel_id);
            problem(what, id, 1);
        }
    }
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

/* Called by the test once: what every dispatch's dispatch_info must say (dispatch_id aside). */
void spec_expect(uint64_t agent, uint64_t queue, uint64_t kernel, uint32_t grid_x, uint32_t group_x, uint32_t private_size,
                 uint32_t group_size) {
    memset(&expected, 0, sizeof expected);
    expected.size = sizeof expected;
    expected.agent_id.handle = agent;
    expected.queue_id.handle = queue;
    expected.kernel_id = kernel;
    expected.private_segment_size = private_size;
    expected.group_segment_size = group_size;
    expected.workgroup_size.x = group_x;
    expected.workgroup_size.y = 1;
    expected.workgroup_size.z = 1;
    expected.grid_size.x = grid_x;
    expected.grid_size.y = 1;
    expected.grid_size.z = 1;
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    /* 2 replayed dispatches of 14 records, 2 run once of 2. */
    if (!problems && checked != 32) problem("not every record was checked (count)", 0, (int64_t)checked);
    pthread_mutex_unlock(&lock);
    return report;
}
