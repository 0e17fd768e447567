/*
 * A minimal kreplay tool library, loaded by the lifecycle tests through KREPLAY_TOOL_LIBRARIES or
 * the process's global scope. It does not call into kreplay (so it loads without libkreplay); it
 * records what kreplay asked of it, which the tests read back with tool_probe().
 */
#include <stddef.h>
#include <stdint.h>

#include "kreplay.h"

static int configure_calls;
static int initialize_calls;
static int finalize_calls;
static uint32_t seen_version;
static uint32_t seen_priority;
static uint32_t seen_handle;
static int seen_tool_data_ok;

static int tool_initialize(kreplay_client_finalize_t finalize_func, void* tool_data) {
    ++initialize_calls;
    seen_tool_data_ok = (tool_data == (void*)&configure_calls) && finalize_func != NULL;
    return 0;
}

static void tool_finalize(void* tool_data) {
    if (tool_data == (void*)&configure_calls) {
        ++finalize_calls;
    }
}

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t),
                                                 tool_initialize, tool_finalize,
                                                 (void*)&configure_calls};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    (void)runtime_version;
    ++configure_calls;
    seen_version = version;
    seen_priority = priority;
    seen_handle = client_id->handle;
    client_id->name = "c-tool";
    return &result;
}

/* Counters for the tests: configure, initialize, finalize calls; version, priority, handle; and
 * whether initialize got the tool's data and a finalize function. */
void tool_probe(int counts[3], uint32_t seen[3], int* tool_data_ok);
void tool_probe(int counts[3], uint32_t seen[3], int* tool_data_ok) {
    counts[0] = configure_calls;
    counts[1] = initialize_calls;
    counts[2] = finalize_calls;
    seen[0] = seen_version;
    seen[1] = seen_priority;
    seen[2] = seen_handle;
    *tool_data_ok = seen_tool_data_ok;
}
