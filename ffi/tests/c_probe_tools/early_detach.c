/*
 * A profiler that sets itself up (kernel replay included) and then, still inside initialize,
 * decides it has nothing to do here (say, no supported GPU) and detaches with the
 * kreplay_client_finalize_t it was given. kreplay finalizes it once initialize returns.
 * PROBE_DETACH_HOW=fail returns non-zero from initialize instead (the other documented way out).
 */
#include "kreplay.h"

#include <stdlib.h>
#include <string.h>

static kreplay_client_id_t self_id;
static int finalized;

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)record;
    (void)user;
    (void)data;
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    const char* how = getenv("PROBE_DETACH_HOW");
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL))
        return 1;
    if (kreplay_start_context(ctx)) return 1;
    if (how && strcmp(how, "fail") == 0) return 1;
    fin(self_id);
    return 0;
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    finalized++;
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, tool_fini,
                                                     NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-early-detach";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    const char* how = getenv("PROBE_DETACH_HOW");
    if (!(how && strcmp(how, "fail") == 0) && finalized != 1) return "the detached tool was not finalized once";
    return "";
}
