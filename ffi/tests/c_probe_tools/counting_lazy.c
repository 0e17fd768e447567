/*
 * A counter profiler written the way rocprofiler-style tools usually are: it learns an agent's
 * counters lazily, the first time it sees a dispatch on that agent (inside CONFIG ENTER), plans
 * every counter into passes with kreplay_plan_counter_passes, creates one configuration per pass,
 * answers that pass count, and checks the counter records it gets. PROBE_MODE selects a check:
 *   iterate_status  kreplay_iterate_agent_counters must return what its callback returned
 *                   (kreplay.h: "Its return value is returned by kreplay_iterate_agent_counters").
 *   before_load     counter functions called in initialize (before the runtime is up) return
 *                   KREPLAY_STATUS_ERROR_NOT_INITIALIZED, as kreplay.h says, and nothing else.
 *   lazy_plan       the whole lazy workflow: every counter of the catalogue is recorded exactly
 *                   once per dispatch, in the pass the plan put it in.
 *   unstarted       the slip behind "no counter record ever comes": the counting context is
 *                   configured but never started (the test reads kreplay's warning on stderr).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COUNTERS 64
#define MAX_PASSES 16
#define MAX_DISPATCH 64

static const char* mode;
static kreplay_context_id_t replay_ctx, count_ctx;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[2048];
static int prepared;
static uint64_t agent_handle;
static size_t ncounters;
static kreplay_counter_id_t ids[MAX_COUNTERS];
static char names[MAX_COUNTERS][64];
static uint32_t pass_of[MAX_COUNTERS];
static uint64_t npasses;
static kreplay_counter_config_id_t configs[MAX_PASSES];
/* seen[d][c]: how many records of counter c for dispatch d; pass_seen: the pass it came in */
static int seen[MAX_DISPATCH][MAX_COUNTERS];
static uint64_t pass_seen[MAX_DISPATCH][MAX_COUNTERS];
static int replayed_dispatches;

static void problem(const char* fmt, long long a, long long b) {
    size_t len = strlen(report);
    if (len + 200 > sizeof report) return;
    snprintf(report + len, sizeof report - len, fmt, a, b);
    strcat(report, "; ");
}

static kreplay_status_t collect(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n, void* ud) {
    size_t i;
    (void)agent;
    (void)ud;
    for (i = 0; i < n && i < MAX_COUNTERS; i++) {
        ids[i] = c[i].id;
        snprintf(names[i], sizeof names[i], "%s", c[i].name);
    }
    ncounters = n < MAX_COUNTERS ? n : MAX_COUNTERS;
    return KREPLAY_STATUS_SUCCESS;
}

static kreplay_status_t refuse(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n, void* ud) {
    (void)agent;
    (void)c;
    (void)n;
    (void)ud;
    return KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES;
}

static void prepare(uint64_t agent) {
    kreplay_agent_id_t a = {agent};
    kreplay_status_t s;
    uint64_t p;
    if (prepared) return;
    prepared = 1;
    agent_handle = agent;
    if (strcmp(mode, "iterate_status") == 0) {
        s = kreplay_iterate_agent_counters(a, refuse, NULL);
        if (s != KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES)
            problem("kreplay_iterate_agent_counters returned %lld although its callback returned %lld "
                    "(KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES)",
                    s, KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES);
        return;
    }
    s = kreplay_iterate_agent_counters(a, collect, NULL);
    if (s != KREPLAY_STATUS_SUCCESS || ncounters == 0) {
        problem("iterate_agent_counters inside CONFIG ENTER: status %lld, %lld counters", s, (long long)ncounters);
        return;
    }
    s = kreplay_plan_counter_passes(a, ids, ncounters, pass_of, &npasses);
    if (s != KREPLAY_STATUS_SUCCESS || npasses == 0 || npasses > MAX_PASSES) {
        problem("plan_counter_passes inside CONFIG ENTER: status %lld, %lld passes", s, (long long)npasses);
        npasses = 0;
        return;
    }
    for (p = 0; p < npasses; p++) {
        kreplay_counter_id_t group[MAX_COUNTERS];
        size_t g = 0, i;
        for (i = 0; i < ncounters; i++)
            if (pass_of[i] == p) group[g++] = ids[i];
        s = kreplay_create_counter_config(a, group, g, &configs[p]);
        if (s != KREPLAY_STATUS_SUCCESS) problem("create_counter_config for pass %lld: status %lld", (long long)p, s);
    }
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return npasses > 1 ? npasses : 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG) return;
    pthread_mutex_lock(&lock);
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        prepare(p->dispatch_info.agent_id.handle);
        p->replay_pass_count = pass_count;
    } else if (p->outcome == KREPLAY_REPLAY_OUTCOME_REPLAYED) {
        replayed_dispatches++;
    }
    pthread_mutex_unlock(&lock);
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* config, void* data) {
    (void)info;
    (void)data;
    if (pass != KREPLAY_REPLAY_PASS_NONE && pass < npasses) *config = configs[pass];
}

static void records_cb(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n, void* data) {
    size_t i, c;
    (void)data;
    pthread_mutex_lock(&lock);
    for (i = 0; i < n; i++) {
        uint64_t d = r[i].dispatch_id;
        if (d != info.dispatch_id) problem("counter record of dispatch %lld delivered with dispatch %lld", (long long)d, (long long)info.dispatch_id);
        if (d >= MAX_DISPATCH) continue;
        for (c = 0; c < ncounters; c++) {
            if (ids[c].handle != r[i].counter_id.handle) continue;
            seen[d][c]++;
            pass_seen[d][c] = r[i].replay_pass;
            if (strcmp(names[c], "SQ_WORK_ITEMS") == 0 && r[i].value != (double)info.grid_size.x)
                problem("SQ_WORK_ITEMS %lld, grid %lld", (long long)r[i].value, (long long)info.grid_size.x);
        }
    }
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (strcmp(mode, "before_load") == 0) {
        /* A tool planning its passes up front: too early, and told so. */
        kreplay_agent_id_t a = {1};
        kreplay_counter_id_t one = {1};
        kreplay_counter_config_id_t cfg;
        uint64_t n = 0;
        kreplay_status_t s1 = kreplay_plan_counter_passes(a, &one, 1, NULL, &n);
        kreplay_status_t s2 = kreplay_create_counter_config(a, &one, 1, &cfg);
        if (s1 != KREPLAY_STATUS_ERROR_NOT_INITIALIZED || s2 != KREPLAY_STATUS_ERROR_NOT_INITIALIZED)
            problem("in initialize, kreplay_plan_counter_passes returned %lld and kreplay_create_counter_config "
                    "returned %lld: kreplay.h says both return KREPLAY_STATUS_ERROR_NOT_INITIALIZED before "
                    "kreplay is loaded into a runtime",
                    (long long)s1, (long long)s2);
    }
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&count_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_dispatch_counting_service(count_ctx, pick, records_cb, NULL)) return 1;
    if (strcmp(mode, "unstarted") == 0) return kreplay_start_context(replay_ctx);
    return kreplay_start_context(replay_ctx) || kreplay_start_context(count_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    mode = getenv("PROBE_MODE") ? getenv("PROBE_MODE") : "lazy_plan";
    client_id->name = "probe-counting-lazy";
    return &result;
}

const char* probe_report(void) {
    size_t d, c;
    if (strcmp(mode, "lazy_plan") == 0) {
        if (replayed_dispatches == 0) problem("no dispatch was replayed (%lld passes planned)%lld", (long long)npasses, 0);
        for (d = 1; d <= (size_t)replayed_dispatches && d < MAX_DISPATCH; d++)
            for (c = 0; c < ncounters; c++) {
                if (seen[d][c] != 1) {
                    problem("dispatch %lld: %lld record(s) of one counter, want 1", (long long)d, seen[d][c]);
                    strcat(report, names[c]);
                    strcat(report, "; ");
                } else if (pass_seen[d][c] != pass_of[c]) {
                    problem("counter recorded in pass %lld, planned for pass %lld", (long long)pass_seen[d][c],
                            (long long)pass_of[c]);
                }
            }
    }
    return report;
}
