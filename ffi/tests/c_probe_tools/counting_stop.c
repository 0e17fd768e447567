/*
 * A counter profiler whose counting context is stopped, or which is finalized, while one of its
 * dispatches is being counted. The dispatch counting callback (asked at dispatch time) picks a
 * configuration for every dispatch; on the first one it first has the context go away:
 *   stop_other_thread   another tool thread calls kreplay_stop_context on the counting context,
 *                       and the callback waits until that call has returned;
 *   finalize_here       the callback calls the client finalize function it was given.
 * After the stop returned, or after the tool's finalize ran, the tool must receive nothing more:
 * neither that dispatch's counter records nor anything of later dispatches (kreplay.h: starting
 * or stopping a context takes effect for the next record kreplay delivers; a finalized tool is
 * called no more). Every callback that arrives too late is reported.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* mode;
static kreplay_context_id_t count_ctx;
static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static kreplay_counter_config_id_t config;
static atomic_int prepared;
static atomic_int gone;          /* the stop returned, or the tool's finalize ran */
static atomic_int picks_after;   /* dispatch callbacks after that */
static atomic_int records_after; /* counter record callbacks after that */
static atomic_int picks, records;
static char report[1024];

static kreplay_status_t first_counter(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                                      void* ud) {
    (void)ud;
    if (n > 0 && kreplay_create_counter_config(agent, &c[0].id, 1, &config) != KREPLAY_STATUS_SUCCESS)
        config.handle = 0;
    return KREPLAY_STATUS_SUCCESS;
}

static void* stopper(void* arg) {
    (void)arg;
    if (kreplay_stop_context(count_ctx) == KREPLAY_STATUS_SUCCESS) atomic_store(&gone, 1);
    return NULL;
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* out, void* data) {
    int one = 1;
    (void)pass;
    (void)data;
    if (atomic_load(&gone)) atomic_fetch_add(&picks_after, 1);
    atomic_fetch_add(&picks, 1);
    if (!atomic_load(&prepared)) {
        kreplay_iterate_agent_counters(info.agent_id, first_counter, NULL);
        atomic_store(&prepared, 1);
    }
    if (config.handle == 0) return;
    if (atomic_compare_exchange_strong(&prepared, &one, 2)) {
        if (strcmp(mode, "stop_other_thread") == 0) {
            pthread_t t;
            if (pthread_create(&t, NULL, stopper, NULL) == 0) pthread_join(t, NULL);
        } else if (strcmp(mode, "finalize_here") == 0) {
            finalize_self(self_id);
        }
    }
    *out = config;
}

static void records_cb(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n,
                       void* data) {
    (void)info;
    (void)r;
    (void)n;
    (void)data;
    if (atomic_load(&gone)) atomic_fetch_add(&records_after, 1);
    atomic_fetch_add(&records, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)tool_data;
    finalize_self = fin;
    if (kreplay_create_context(&count_ctx)) return 1;
    if (kreplay_configure_dispatch_counting_service(count_ctx, pick, records_cb, NULL)) return 1;
    return kreplay_start_context(count_ctx) != KREPLAY_STATUS_SUCCESS;
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    atomic_store(&gone, 1);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    mode = getenv("PROBE_MODE") ? getenv("PROBE_MODE") : "stop_other_thread";
    client_id->name = "probe-counting-stop";
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    if (config.handle == 0)
        snprintf(report, sizeof report, "no counter configuration could be created (%d picks)", atomic_load(&picks));
    else if (!atomic_load(&gone))
        snprintf(report, sizeof report, "the context was never stopped (%d picks)", atomic_load(&picks));
    else if (atomic_load(&picks_after) || atomic_load(&records_after))
        snprintf(report, sizeof report,
                 "%s: %d dispatch counting callback(s) and %d counter record callback(s) arrived after the "
                 "stop returned / the finalize ran (of %d and %d)",
                 mode, atomic_load(&picks_after), atomic_load(&records_after), atomic_load(&picks),
                 atomic_load(&records));
    return report;
}
