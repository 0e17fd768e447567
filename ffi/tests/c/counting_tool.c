/*
 * A counter-collection tool written in C against kreplay.h. Once the runtime is up, the test
 * names the counters it wants (counting_tool_prepare): the tool finds them in the agent's
 * catalogue, plans them into passes with kreplay_plan_counter_passes, builds one configuration
 * per pass and answers the pass count from replay_pass_count. Each pass counts its own
 * configuration; the tool records every counter record and every dispatch-tracing COMPLETE
 * record. On request it masks its counting context off for one pass (at that pass's PASS ENTER)
 * and back on at the next. Compiled with -std=c99 -Wall -Wextra -Werror -pedantic.
 */
#include "kreplay.h"

#include <stdio.h>
#include <string.h>

#define MAX_RECORDS 1024
#define MAX_COUNTERS 32
#define MAX_PASSES 8

/* One counter record as the tool saw it (read by the test). */
typedef struct counting_record_t {
    uint64_t counter; /* catalogue index */
    uint64_t dispatch_id;
    uint64_t replay_pass;
    double value;
} counting_record_t;

/* One dispatch-tracing COMPLETE record. */
typedef struct counting_trace_t {
    uint64_t dispatch_id;
    uint64_t replay_pass;
} counting_trace_t;

static counting_record_t records[MAX_RECORDS];
static size_t record_count;
static counting_trace_t traces[MAX_RECORDS];
static size_t trace_count;
static int failures;
static char first_failure[256];
static kreplay_context_id_t counting_context;
static uint64_t planned_passes;
static kreplay_counter_config_id_t configs[MAX_PASSES];
static uint64_t mask_pass = UINT64_MAX;

/* Catalogue lookup state. */
static const char* const* wanted_names;
static size_t wanted_count;
static kreplay_counter_id_t wanted_ids[MAX_COUNTERS];
static size_t found;

static void fail(const char* what, long long value) {
    if (failures++ == 0) snprintf(first_failure, sizeof first_failure, "%s (%lld)", what, value);
}

static kreplay_status_t find_counters(kreplay_agent_id_t agent, const kreplay_counter_info_t* counters,
                                      size_t count, void* user_data) {
    size_t i, j;
    (void)agent;
    (void)user_data;
    for (j = 0; j < wanted_count; j++) {
        for (i = 0; i < count; i++) {
            if (counters[i].size < sizeof counters[i]) fail("short counter info", (long long)counters[i].size);
            if (!counters[i].description || !counters[i].description[0]) fail("counter without description", (long long)i);
            if (strcmp(counters[i].name, wanted_names[j]) == 0) {
                wanted_ids[j] = counters[i].id;
                found++;
            }
        }
    }
    return KREPLAY_STATUS_SUCCESS;
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return planned_passes;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = pass_count;
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        if (p->current_pass == mask_pass) {
            if (p->replay_stop_context(counting_context) != KREPLAY_STATUS_SUCCESS) fail("stop toggle", 0);
        } else if (mask_pass != UINT64_MAX && p->current_pass == mask_pass + 1) {
            if (p->replay_start_context(counting_context) != KREPLAY_STATUS_SUCCESS) fail("start toggle", 0);
        }
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* d = record.payload;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_DISPATCH_COMPLETE) return;
    if (trace_count == MAX_RECORDS) {
        fail("trace log full", 0);
        return;
    }
    traces[trace_count].dispatch_id = d->dispatch_info.dispatch_id;
    traces[trace_count].replay_pass = d->replay_pass;
    trace_count++;
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t replay_pass, kreplay_counter_config_id_t* config,
                 void* data) {
    (void)info;
    (void)data;
    if (replay_pass == KREPLAY_REPLAY_PASS_NONE) replay_pass = 0;
    if (replay_pass < planned_passes) *config = configs[replay_pass];
}

static void on_counters(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* values, size_t count,
                        void* data) {
    size_t i;
    (void)data;
    for (i = 0; i < count; i++) {
        if (values[i].size < sizeof values[i]) fail("short counter record", (long long)values[i].size);
        if (values[i].dispatch_id != info.dispatch_id) fail("record of another dispatch", (long long)i);
        if (values[i].context_id.handle != counting_context.handle) fail("record of another context", 0);
        if (record_count == MAX_RECORDS) {
            fail("record log full", 0);
            return;
        }
        records[record_count].counter = values[i].counter_id.handle - 1;
        records[record_count].dispatch_id = values[i].dispatch_id;
        records[record_count].replay_pass = values[i].replay_pass;
        records[record_count].value = values[i].value;
        record_count++;
    }
}

static int tool_initialize(kreplay_client_finalize_t finalize, void* tool_data) {
    kreplay_context_id_t replay, tracing;
    (void)finalize;
    (void)tool_data;
    if (kreplay_create_context(&replay) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_create_context(&tracing) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_create_context(&counting_context) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_configure_callback_tracing_service(replay, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) != KREPLAY_STATUS_SUCCESS)
        return -1;
    if (kreplay_configure_callback_tracing_service(tracing, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL) != KREPLAY_STATUS_SUCCESS)
        return -1;
    if (kreplay_configure_dispatch_counting_service(counting_context, pick, on_counters, NULL) !=
        KREPLAY_STATUS_SUCCESS)
        return -1;
    if (kreplay_configure_dispatch_counting_service(tracing, pick, on_counters, NULL) !=
        KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED)
        fail("a second counting service was accepted", 0);
    if (kreplay_start_context(replay) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_start_context(tracing) != KREPLAY_STATUS_SUCCESS) return -1;
    if (kreplay_start_context(counting_context) != KREPLAY_STATUS_SUCCESS) return -1;
    return 0;
}

static void tool_finalize(void* tool_data) { (void)tool_data; }

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result;
    (void)runtime_version;
    (void)priority;
    if (version / 10000 != KREPLAY_VERSION_MAJOR) return NULL;
    client_id->name = "c-counting-tool";
    result.size = sizeof result;
    result.initialize = tool_initialize;
    result.finalize = tool_finalize;
    result.tool_data = NULL;
    return &result;
}

/* Looks `names` up on `agent`, plans them and builds one configuration per pass. Returns the
 * pass count, or minus a kreplay status. `pass_of` receives each name's pass. */
long long counting_tool_prepare(uint64_t agent, const char* const* names, size_t count, uint32_t* pass_of) {
    kreplay_agent_id_t id;
    kreplay_status_t status;
    uint64_t pass, passes = 0;
    size_t i;
    id.handle = agent;
    if (count > MAX_COUNTERS) return -KREPLAY_STATUS_ERROR_INVALID_ARGUMENT;
    wanted_names = names;
    wanted_count = count;
    found = 0;
    status = kreplay_iterate_agent_counters(id, find_counters, NULL);
    if (status != KREPLAY_STATUS_SUCCESS) return -status;
    if (found != count) return -KREPLAY_STATUS_ERROR_INVALID_ARGUMENT;
    status = kreplay_plan_counter_passes(id, wanted_ids, count, pass_of, &passes);
    if (status != KREPLAY_STATUS_SUCCESS) return -status;
    if (passes > MAX_PASSES) return -KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES;
    for (pass = 0; pass < passes; pass++) {
        kreplay_counter_id_t group[MAX_COUNTERS];
        size_t n = 0;
        for (i = 0; i < count; i++)
            if (pass_of[i] == pass) group[n++] = wanted_ids[i];
        status = kreplay_create_counter_config(id, group, n, &configs[pass]);
        if (status != KREPLAY_STATUS_SUCCESS) return -status;
    }
    planned_passes = passes;
    return (long long)passes;
}

/* The status of a configuration of all `names` at once (found in the catalogue first). */
int counting_tool_create_one(uint64_t agent, const char* const* names, size_t count) {
    kreplay_agent_id_t id;
    kreplay_counter_config_id_t config;
    kreplay_status_t status;
    id.handle = agent;
    wanted_names = names;
    wanted_count = count;
    found = 0;
    status = kreplay_iterate_agent_counters(id, find_counters, NULL);
    if (status != KREPLAY_STATUS_SUCCESS) return status;
    if (found != count) return KREPLAY_STATUS_ERROR_INVALID_ARGUMENT;
    return kreplay_create_counter_config(id, wanted_ids, count, &config);
}

void counting_tool_mask_pass(uint64_t pass) { mask_pass = pass; }

size_t counting_tool_records(counting_record_t* out, size_t max) {
    size_t n = record_count < max ? record_count : max;
    memcpy(out, records, n * sizeof *out);
    return record_count;
}

size_t counting_tool_traces(counting_trace_t* out, size_t max) {
    size_t n = trace_count < max ? trace_count : max;
    memcpy(out, traces, n * sizeof *out);
    return trace_count;
}

void counting_tool_clear(void) {
    record_count = 0;
    trace_count = 0;
}

const char* counting_tool_failure(int* count) {
    *count = failures;
    return first_failure;
}
