/*
 * Two tools from one source, told apart by their priority (the test loads two copies of this
 * library): the host (priority 0) owns kernel replay on a context of its own; the intruder
 * (priority 1) configures services on a context that is not its own (the host's: context
 * handles are small numbers, easy to guess) and then fails its initialize. docs/abi.md: a tool
 * whose initialize returns non-zero "is failed: its contexts are stopped and its services
 * removed". No callback of the intruder may run afterwards, and the host's services must work
 * as before. PROBE_MODE=decline: the intruder configures the same services from its
 * kreplay_configure and returns NULL there (a tool that stays inactive: "its contexts are
 * stopped and its services removed" too) instead. PROBE_MODE=finalize: the intruder succeeds,
 * and finalizes itself (its kreplay_client_finalize_t) from the first of its callbacks that
 * runs: kreplay.h: "From a callback, nothing of the tool is called after it".
 * PROBE_MODE=other_id: the intruder calls its kreplay_client_finalize_t with every client id
 * but its own (the host's among them) and stays active: that finalizes no other tool.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t role; /* 0: host, 1: intruder */
static kreplay_context_id_t own;
static atomic_int intruder_calls, host_config_enters, intruder_services;
static kreplay_client_id_t me;
static kreplay_client_finalize_t finalize_me;
static int failed;
static atomic_int finalizing, finalized, calls_after_finalize;

/* A callback of the intruder: in PROBE_MODE=finalize the first one finalizes the tool. */
static void intruder_called(void) {
    atomic_fetch_add(&intruder_calls, 1);
    if (atomic_load(&finalized)) atomic_fetch_add(&calls_after_finalize, 1);
    if (finalize_me != NULL && !atomic_exchange(&finalizing, 1)) {
        finalize_me(me);
        atomic_store(&finalized, 1);
    }
}
static char report[1024];

static void problem(const char* fmt, long long a) {
    size_t len = strlen(report);
    if (len + 200 > sizeof report) return;
    snprintf(report + len, sizeof report - len, fmt, a);
    strcat(report, "; ");
}

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t ud) {
    (void)info;
    (void)ud;
    return 2;
}

static void host_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)ud;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        atomic_fetch_add(&host_config_enters, 1);
        p->replay_pass_count = two;
    }
}

static void intruder_record(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    (void)record;
    (void)ud;
    (void)data;
    intruder_called();
}

static void intruder_pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* config,
                          void* data) {
    (void)info;
    (void)pass;
    (void)config;
    (void)data;
    intruder_called();
}

static void intruder_counts(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n,
                            void* data) {
    (void)info;
    (void)r;
    (void)n;
    (void)data;
    intruder_called();
}

/* Services on every context but its own that it can reach. */
static void intrude(void) {
    uint64_t h;
    for (h = 1; h <= 16; h++) {
        kreplay_context_id_t c = {h};
        if (h == own.handle) continue;
        if (kreplay_configure_callback_tracing_service(c, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                       intruder_record, NULL) == KREPLAY_STATUS_SUCCESS)
            atomic_fetch_add(&intruder_services, 1);
        if (kreplay_configure_dispatch_counting_service(c, intruder_pick, intruder_counts, NULL) ==
            KREPLAY_STATUS_SUCCESS)
            atomic_fetch_add(&intruder_services, 1);
    }
}

static int initialize(kreplay_client_finalize_t fini, void* tool_data) {
    (void)fini;
    (void)tool_data;
    if (role == 0) {
        if (kreplay_configure_callback_tracing_service(own, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                       host_replay, NULL) != KREPLAY_STATUS_SUCCESS ||
            kreplay_start_context(own) != KREPLAY_STATUS_SUCCESS)
            problem("the host could not set up its context (%lld)", 0);
        return 0;
    }
    if (kreplay_create_context(&own) != KREPLAY_STATUS_SUCCESS) problem("no context for the intruder%lld", 0);
    if (getenv("PROBE_MODE") != NULL && strcmp(getenv("PROBE_MODE"), "other_id") == 0) {
        kreplay_client_id_t other = me;
        uint32_t h;
        for (h = 0; h <= 8; h++) {
            if (h == me.handle) continue;
            other.handle = h;
            fini(other);
        }
        atomic_fetch_add(&intruder_services, 1); /* nothing to configure in this mode */
        return 0;
    }
    intrude();
    if (getenv("PROBE_MODE") != NULL && strcmp(getenv("PROBE_MODE"), "finalize") == 0) {
        finalize_me = fini;
        return 0;
    }
    failed = 1;
    return 1; /* failed: nothing of it may be called from now on */
}

static void finalize(void* tool_data) {
    (void)tool_data;
    if (failed) problem("the failed intruder was finalized%lld", 0);
}

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), initialize, finalize, NULL};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    const char* mode = getenv("PROBE_MODE");
    (void)version;
    (void)runtime_version;
    role = priority;
    me = *client_id;
    client_id->name = role == 0 ? "host" : "intruder";
    /* The host makes its context here, so that it exists when the intruder's configure runs. */
    if (role == 0 && kreplay_create_context(&own) != KREPLAY_STATUS_SUCCESS) problem("no host context%lld", 0);
    if (role == 1 && mode != NULL && strcmp(mode, "decline") == 0) {
        if (kreplay_create_context(&own) != KREPLAY_STATUS_SUCCESS) problem("no context%lld", 0);
        intrude();
        return NULL;
    }
    return &result;
}

const char* probe_report(void) {
    if (role == 1) {
        if (atomic_load(&intruder_services) == 0) problem("the intruder configured nothing (%lld)", 0);
        if (finalize_me != NULL) {
            if (!atomic_load(&finalized)) problem("the intruder never finalized itself (%lld calls)", atomic_load(&intruder_calls));
            if (atomic_load(&calls_after_finalize) != 0)
                problem("a callback of the intruder ran %lld time(s) after it finalized itself",
                        atomic_load(&calls_after_finalize));
        } else if (atomic_load(&intruder_calls) != 0) {
            problem("a callback of the failed intruder ran %lld time(s)", atomic_load(&intruder_calls));
        }
    } else if (atomic_load(&host_config_enters) == 0) {
        problem("the host never saw CONFIG ENTER (%lld)", 0);
    }
    return report;
}
