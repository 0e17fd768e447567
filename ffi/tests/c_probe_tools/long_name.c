/*
 * A tool whose client name has no NUL within reason: `client_id->name` points at a 64 KiB run
 * of 'N' (its NUL only at the very end), as a name copied into a buffer without its terminator
 * reads. kreplay names tools in its messages; it must not print such a name whole. The tool
 * itself works normally (it replays every dispatch twice).
 */
#include "kreplay.h"

#include <string.h>

static char name[64 * 1024 + 1];
static kreplay_context_id_t ctx;
static int config_enters;

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t ud) {
    (void)info;
    (void)ud;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)ud;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        config_enters++;
        p->replay_pass_count = two;
    }
}

static int initialize(kreplay_client_finalize_t fini, void* tool_data) {
    (void)fini;
    (void)tool_data;
    if (kreplay_create_context(&ctx) != KREPLAY_STATUS_SUCCESS ||
        kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL) != KREPLAY_STATUS_SUCCESS ||
        kreplay_start_context(ctx) != KREPLAY_STATUS_SUCCESS)
        return 1;
    return 0;
}

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), initialize, NULL, NULL};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    (void)version;
    (void)runtime_version;
    (void)priority;
    memset(name, 'N', sizeof name - 1);
    client_id->name = name;
    return &result;
}

const char* probe_report(void) { return config_enters > 0 ? "" : "the tool never saw CONFIG ENTER"; }
