/*
 * A tool that asks for 3 passes of every dispatch and keeps, per dispatch, the SNAPSHOT records
 * it gets and what CONFIG EXIT says. Run with KREPLAY_MAX_SNAPSHOT_BYTES=1, every replay is
 * declined as footprint_budget before the snapshot starts: the tool must learn it from CONFIG
 * EXIT (outcome, status, both decline reasons, one pass run), and gets no SNAPSHOT record, as
 * docs/abi.md says of a decline decided before the snapshot.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[2048];
static int config_exits;

static void problem(const char* what, unsigned long long dispatch, long long got) {
    pthread_mutex_lock(&lock);
    size_t used = strlen(report);
    snprintf(report + used, sizeof report - used, "dispatch %llu: %s (got %lld); ", dispatch, what,
             got);
    pthread_mutex_unlock(&lock);
}

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user,
                      void* data) {
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG &&
        record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        p->replay_pass_count = three;
        user->value = 0; /* SNAPSHOT records seen */
        return;
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT) {
        user->value++;
        return;
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) {
        const kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        unsigned long long id = p->dispatch_info.dispatch_id;
        pthread_mutex_lock(&lock);
        config_exits++;
        pthread_mutex_unlock(&lock);
        if (p->outcome != KREPLAY_REPLAY_OUTCOME_DECLINED) problem("outcome not DECLINED", id, p->outcome);
        if (p->status != KREPLAY_STATUS_ERROR_REPLAY_DECLINED) problem("status", id, p->status);
        if (p->decline_reason != KREPLAY_REPLAY_DECLINE_FOOTPRINT_BUDGET)
            problem("payload decline_reason", id, p->decline_reason);
        if (record.decline_reason != KREPLAY_REPLAY_DECLINE_FOOTPRINT_BUDGET)
            problem("record decline_reason", id, record.decline_reason);
        if (p->passes_run != 1) problem("passes_run", id, (long long)p->passes_run);
        if (user->value != 0) problem("SNAPSHOT records before a budget decline", id, (long long)user->value);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    return kreplay_start_context(ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-decline-records";
    return &result;
}

const char* probe_report(void) {
    if (config_exits == 0) return "no CONFIG EXIT reached the tool";
    return report;
}
