/*
 * A second profiler, initialized after another tool: it configures kernel replay in initialize
 * and replays every dispatch in 3 passes. It reports the status of configuring the service and
 * how many dispatches it replayed.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>

static kreplay_status_t configure_status = -1;
static atomic_int replayed, config_enters;
static char report[512];

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG) return;
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        atomic_fetch_add(&config_enters, 1);
        p->replay_pass_count = three;
    } else if (p->outcome == KREPLAY_REPLAY_OUTCOME_REPLAYED) {
        atomic_fetch_add(&replayed, 1);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    configure_status =
        kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL);
    return kreplay_start_context(ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-replay-owner";
    return &result;
}

const char* probe_report(void) {
    report[0] = 0;
    if (configure_status != KREPLAY_STATUS_SUCCESS || atomic_load(&replayed) == 0)
        snprintf(report, sizeof report,
                 "configuring KERNEL_REPLAY in initialize returned %s; %d CONFIG ENTER(s) seen, %d dispatch(es) "
                 "replayed",
                 kreplay_get_status_name(configure_status), atomic_load(&config_enters), atomic_load(&replayed));
    return report;
}
