/*
 * SPEC §2: a callback tracing service reports the operations it lists. The KERNEL_REPLAY owner
 * lists operations (SPEC_FILTER):
 *   config_pass  {CONFIG, PASS}: every dispatch is replayed in 3 passes as answered, the owner
 *                gets CONFIG ENTER/EXIT and 3 PASS ENTER/EXIT and no SNAPSHOT or RESTORE record,
 *                and its PASS ENTER toggles still mask (tracer T, masked off at pass 0, gets no
 *                record of any pass);
 *   pass_only    {PASS}: without CONFIG ENTER the owner never answers, so no dispatch is replayed:
 *                no record at all, and T sees each dispatch once (replay_pass NONE).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXD 64
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kreplay_context_id_t tracer;
static int counts[MAXD][5][3]; /* per dispatch, operation, phase: owner records */
static int t_pass[MAXD], t_once[MAXD];
static int pass_only;
static uint64_t last_id;

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
    uint64_t id = record.operation <= KREPLAY_KERNEL_REPLAY_PASS ? p->dispatch_info.dispatch_id : m->dispatch_info.dispatch_id;
    (void)user;
    (void)data;
    if (id >= MAXD || record.operation >= 5 || record.phase >= 3) return;
    pthread_mutex_lock(&lock);
    counts[id][record.operation][record.phase]++;
    if (id > last_id) last_id = id;
    pthread_mutex_unlock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = three;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && p->replay_stop_context(tracer) != KREPLAY_STATUS_SUCCESS)
        counts[id][0][0]++; /* reported below */
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)user;
    (void)data;
    if (id >= MAXD || record.operation != KREPLAY_KERNEL_DISPATCH_COMPLETE) return;
    pthread_mutex_lock(&lock);
    if (p->replay_pass == KREPLAY_REPLAY_PASS_NONE) t_once[id]++;
    else t_pass[id]++;
    if (id > last_id) last_id = id;
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t owner;
    uint32_t config_pass[2] = {KREPLAY_KERNEL_REPLAY_CONFIG, KREPLAY_KERNEL_REPLAY_PASS};
    uint32_t pass[1] = {KREPLAY_KERNEL_REPLAY_PASS};
    const char* f = getenv("SPEC_FILTER");
    (void)fin;
    (void)tool_data;
    pass_only = f && strcmp(f, "pass_only") == 0;
    if (kreplay_create_context(&owner) || kreplay_create_context(&tracer)) return 1;
    if (kreplay_configure_callback_tracing_service(owner, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                   pass_only ? pass : config_pass, pass_only ? 1 : 2, on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(tracer, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, on_dispatch,
                                                   NULL))
        return 1;
    return kreplay_start_context(owner) || kreplay_start_context(tracer);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "spec-filter";
    return &result;
}

const char* probe_report(void) {
    static char report[1024];
    uint64_t id;
    report[0] = 0;
    pthread_mutex_lock(&lock);
    if (last_id == 0) snprintf(report, sizeof report, "no dispatch seen");
    for (id = 1; id <= last_id && !report[0]; id++) {
        int (*c)[3] = counts[id];
        int want_config = pass_only ? 0 : 1, want_pass = pass_only ? 0 : 3;
        if (c[0][0] || c[1][1] != want_config || c[1][2] != want_config || c[2][1] != want_pass ||
            c[2][2] != want_pass || c[3][1] || c[3][2] || c[4][1] || c[4][2])
            snprintf(report, sizeof report,
                     "dispatch %llu: owner records CONFIG %d/%d PASS %d/%d SNAPSHOT %d/%d RESTORE %d/%d toggle failures %d "
                     "(want %d/%d %d/%d 0/0 0/0 0)",
                     (unsigned long long)id, c[1][1], c[1][2], c[2][1], c[2][2], c[3][1], c[3][2], c[4][1], c[4][2],
                     c[0][0], want_config, want_config, want_pass, want_pass);
        else if (t_pass[id] != 0 || t_once[id] != (pass_only ? 1 : 0))
            snprintf(report, sizeof report, "dispatch %llu: T got %d pass COMPLETE(s) and %d run-once COMPLETE(s)",
                     (unsigned long long)id, t_pass[id], t_once[id]);
    }
    pthread_mutex_unlock(&lock);
    return report;
}
