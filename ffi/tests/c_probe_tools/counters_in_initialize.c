/*
 * kreplay.h: the counter functions return KREPLAY_STATUS_ERROR_NOT_INITIALIZED before kreplay is
 * loaded into a runtime, which under ROCm-style loading is the case in a tool's initialize.
 * What the tool is told for it must say so (not that no function returns it, nor that tools are
 * not initialized: this tool is being initialized).
 */
#include "kreplay.h"

#include <stdio.h>
#include <string.h>

static char report[1024];

static kreplay_status_t ignore(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                               void* data) {
    (void)agent;
    (void)c;
    (void)n;
    (void)data;
    return KREPLAY_STATUS_SUCCESS;
}

static void noop(kreplay_callback_tracing_record_t r, kreplay_user_data_t* u, void* d) {
    (void)r;
    (void)u;
    (void)d;
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_agent_id_t agent = {1};
    kreplay_counter_id_t id = {1};
    kreplay_counter_config_id_t config;
    uint64_t passes = 0;
    kreplay_status_t got[3];
    const char* said;
    kreplay_context_id_t ctx;
    int i;
    (void)fin;
    (void)tool_data;
    got[0] = kreplay_iterate_agent_counters(agent, ignore, NULL);
    got[1] = kreplay_plan_counter_passes(agent, &id, 1, NULL, &passes);
    got[2] = kreplay_create_counter_config(agent, &id, 1, &config);
    for (i = 0; i < 3; i++)
        if (got[i] != KREPLAY_STATUS_ERROR_NOT_INITIALIZED)
            snprintf(report + strlen(report), sizeof report - strlen(report),
                     "counter function %d in initialize returned %s; ", i, kreplay_get_status_name(got[i]));
    said = kreplay_get_status_string(KREPLAY_STATUS_ERROR_NOT_INITIALIZED);
    if (strstr(said, "runtime") == NULL)
        snprintf(report + strlen(report), sizeof report - strlen(report),
                 "the description of NOT_INITIALIZED does not say a runtime is missing: \"%s\"; ", said);
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, noop,
                                                   NULL))
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
    client_id->name = "probe-counters-in-initialize";
    return &result;
}

const char* probe_report(void) { return report; }
