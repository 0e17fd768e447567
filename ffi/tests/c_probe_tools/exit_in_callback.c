/*
 * A tool that ends the process from inside a replay callback (PROBE_EXIT_AT: config_enter,
 * pass_enter, restore_exit): exit(7) while kreplay holds the agent, a snapshot and a mask. The
 * process must end promptly with status 7, and the run record (KREPLAY_RECORD_DIR) must still be
 * written, naming the dispatches that completed.
 */
#include "kreplay.h"

#include <stdlib.h>
#include <string.h>

static const char* where;

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = three;
        if (p->dispatch_info.dispatch_id == 2 && strcmp(where, "config_enter") == 0) exit(7);
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->dispatch_info.dispatch_id == 2 && p->current_pass == 1 && strcmp(where, "pass_enter") == 0)
        exit(7);
    if (record.operation == KREPLAY_KERNEL_REPLAY_RESTORE && record.phase == KREPLAY_CALLBACK_PHASE_EXIT &&
        strcmp(where, "restore_exit") == 0) {
        kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        if (m->dispatch_info.dispatch_id == 2) exit(7);
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
    return kreplay_start_context(ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    where = getenv("PROBE_EXIT_AT") ? getenv("PROBE_EXIT_AT") : "pass_enter";
    client_id->name = "probe-exit-in-callback";
    return &result;
}

const char* probe_report(void) { return "the tool's exit(7) never ran"; }
