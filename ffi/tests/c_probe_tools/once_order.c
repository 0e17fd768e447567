/*
 * Where a dispatch that runs once gets its dispatch records: the tool opts out of odd dispatches
 * (no pass-count callback) and answers 1 for even ones. Each such dispatch must be submitted
 * once after its CONFIG EXIT: ENQUEUE ENTER, ENQUEUE EXIT and COMPLETE (replay_pass NONE) all
 * come after it, as docs/abi.md says, in that order: the tool takes its time in ENQUEUE EXIT
 * (up to half a second, until a COMPLETE arrives), so a kernel that finished while ENQUEUE EXIT
 * ran must still have its COMPLETE after ENQUEUE EXIT returned.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_IDS 256

static atomic_int config_exited[MAX_IDS];
static atomic_int records[MAX_IDS];
static atomic_int early[MAX_IDS];
static atomic_int in_exit[MAX_IDS];
static atomic_int completed[MAX_IDS];
static atomic_int complete_in_exit[MAX_IDS];
static atomic_int complete_before_exit[MAX_IDS];
static atomic_int exited[MAX_IDS];
static atomic_int with_pass;
static atomic_int dispatches;

static uint64_t one(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    const kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG || id >= MAX_IDS) return;
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        if (id % 2 == 0) ((kreplay_callback_tracing_kernel_replay_data_t*)record.payload)->replay_pass_count = one;
        atomic_fetch_add(&dispatches, 1);
    } else {
        atomic_store(&config_exited[id], 1);
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    const kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)user;
    (void)data;
    if (id >= MAX_IDS) return;
    if (p->replay_pass != KREPLAY_REPLAY_PASS_NONE) atomic_fetch_add(&with_pass, 1);
    atomic_fetch_add(&records[id], 1);
    if (!atomic_load(&config_exited[id])) atomic_fetch_add(&early[id], 1);
    if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE) {
        if (atomic_load(&in_exit[id])) atomic_fetch_add(&complete_in_exit[id], 1);
        if (!atomic_load(&exited[id])) atomic_fetch_add(&complete_before_exit[id], 1);
        atomic_store(&completed[id], 1);
    } else if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        /* A slow ENQUEUE EXIT: the kernel finishes meanwhile. */
        struct timespec ms = {0, 1000000};
        int i;
        atomic_store(&in_exit[id], 1);
        for (i = 0; i < 500 && !atomic_load(&completed[id]); i++) nanosleep(&ms, NULL);
        atomic_store(&in_exit[id], 0);
        atomic_store(&exited[id], 1);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t replay, trace;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay) || kreplay_create_context(&trace)) return 1;
    if (kreplay_configure_callback_tracing_service(replay, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(trace, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    return kreplay_start_context(replay) || kreplay_start_context(trace);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-once-order";
    return &result;
}

const char* probe_report(void) {
    static char report[1024];
    int i;
    report[0] = 0;
    if (atomic_load(&dispatches) == 0) return "no dispatch reached the tool";
    if (atomic_load(&with_pass))
        snprintf(report, sizeof report, "%d record(s) of dispatches run once carried a pass; ",
                 atomic_load(&with_pass));
    for (i = 1; i < MAX_IDS && i <= atomic_load(&dispatches); i++) {
        size_t used = strlen(report);
        if (atomic_load(&records[i]) != 3)
            snprintf(report + used, sizeof report - used, "dispatch %d: %d dispatch records, want 3; ", i,
                     atomic_load(&records[i]));
        used = strlen(report);
        if (atomic_load(&early[i]))
            snprintf(report + used, sizeof report - used, "dispatch %d: %d record(s) before CONFIG EXIT; ", i,
                     atomic_load(&early[i]));
        used = strlen(report);
        if (atomic_load(&complete_in_exit[i]) || atomic_load(&complete_before_exit[i]))
            snprintf(report + used, sizeof report - used,
                     "dispatch %d: COMPLETE came while its ENQUEUE EXIT ran (%d) or before it (%d); ", i,
                     atomic_load(&complete_in_exit[i]), atomic_load(&complete_before_exit[i]));
    }
    return report;
}
