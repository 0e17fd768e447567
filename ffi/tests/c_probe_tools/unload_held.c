/*
 * The runtime is shut down (OnUnload) while a COMPLETE is held behind a slow ENQUEUE EXIT: the
 * application saw its kernel complete (its signal fires when the kernel finished, docs/abi.md
 * §2) and unloads kreplay from another thread while the submitting thread is still in the tool's
 * ENQUEUE EXIT. ENQUEUE EXIT of the first application dispatch waits until the application's
 * signal reached 0, then until the child says OnUnload begins (`probe_unload_begins`), then up
 * to 1 s for its own context to stop (OnUnload stopping it). That dispatch must still get its
 * COMPLETE, once, before the tool's finalize; no record may come after the finalize.
 *
 * PROBE_MODE=stop or PROBE_MODE=finalize: the tool instead stops its context (kreplay_stop_context)
 * or finalizes itself (its client finalize) in that ENQUEUE EXIT, once the application's signal
 * reached 0: the COMPLETE held back and the dispatch's counters (the same context counts) must
 * then not come at all (kreplay.h: a stop takes effect for the next record kreplay delivers; a
 * finalized tool is called no more).
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*app_wait_fn)(uint32_t grid, uint32_t timeout_ms);

static app_wait_fn app_wait;
static kreplay_context_id_t ctx;
static atomic_int unloading, finalized, after_finalize;
static atomic_ullong held_id; /* the dispatch whose ENQUEUE EXIT lingered */
static atomic_int held_completes, exits, stopped_in_exit, signal_seen;
static const char* mode = "unload";
static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static kreplay_counter_config_id_t config;
static atomic_int gone, after_gone, counted_held;

void probe_set_app_wait(app_wait_fn f) { app_wait = f; }

void probe_unload_begins(void) { atomic_store(&unloading, 1); }

static void nap_ms(int ms) {
    struct timespec t = {0, (long)ms * 1000000L};
    nanosleep(&t, NULL);
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (atomic_load(&finalized)) atomic_fetch_add(&after_finalize, 1);
    if (atomic_load(&gone)) atomic_fetch_add(&after_gone, 1);
    if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE) {
        if (atomic_load(&held_id) == p->dispatch_info.dispatch_id) atomic_fetch_add(&held_completes, 1);
        return;
    }
    if (record.operation != KREPLAY_KERNEL_DISPATCH_ENQUEUE || record.phase != KREPLAY_CALLBACK_PHASE_EXIT) return;
    if (atomic_fetch_add(&exits, 1) != 0 || !app_wait) return;
    atomic_store(&held_id, p->dispatch_info.dispatch_id);
    if (app_wait(p->dispatch_info.grid_size.x, 5000) == 0) atomic_store(&signal_seen, 1);
    if (strcmp(mode, "stop") == 0) {
        if (kreplay_stop_context(ctx) == KREPLAY_STATUS_SUCCESS) atomic_store(&gone, 1);
        return;
    }
    if (strcmp(mode, "finalize") == 0) {
        finalize_self(self_id);
        atomic_store(&gone, 1);
        return;
    }
    {
        int i, active = 1;
        for (i = 0; i < 5000 && !atomic_load(&unloading); i++) nap_ms(1);
        for (i = 0; i < 1000; i++) {
            if (kreplay_context_is_active(ctx, &active) != KREPLAY_STATUS_SUCCESS || !active) {
                atomic_store(&stopped_in_exit, 1);
                break;
            }
            nap_ms(1);
        }
    }
}

static kreplay_status_t first_counter(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                                      void* ud) {
    (void)ud;
    if (n > 0 && kreplay_create_counter_config(agent, &c[0].id, 1, &config) != KREPLAY_STATUS_SUCCESS)
        config.handle = 0;
    return KREPLAY_STATUS_SUCCESS;
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* out, void* data) {
    (void)pass;
    (void)data;
    if (config.handle == 0) kreplay_iterate_agent_counters(info.agent_id, first_counter, NULL);
    *out = config;
}

static void counted(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n, void* data) {
    (void)r;
    (void)n;
    (void)data;
    if (atomic_load(&finalized)) atomic_fetch_add(&after_finalize, 1);
    if (atomic_load(&gone)) atomic_fetch_add(&after_gone, 1);
    if (atomic_load(&held_id) == info.dispatch_id) atomic_fetch_add(&counted_held, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)tool_data;
    finalize_self = fin;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    if (kreplay_configure_dispatch_counting_service(ctx, pick, counted, NULL)) return 1;
    return kreplay_start_context(ctx);
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    atomic_store(&finalized, 1);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, tool_fini,
                                                     NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-unload-held";
    if (getenv("PROBE_MODE")) mode = getenv("PROBE_MODE");
    self_id = *client_id;
    return &result;
}

const char* probe_report(void) {
    static char report[512];
    report[0] = 0;
    if (strcmp(mode, "unload") != 0) {
        if (!atomic_load(&signal_seen) || !atomic_load(&gone))
            snprintf(report, sizeof report, "%s: scenario not reached: signal reached 0 %d, stopped/finalized %d",
                     mode, atomic_load(&signal_seen), atomic_load(&gone));
        else if (atomic_load(&after_gone) || atomic_load(&held_completes) || atomic_load(&counted_held))
            snprintf(report, sizeof report,
                     "%s in ENQUEUE EXIT: %d record(s) or counter callback(s) came after it (the held dispatch: "
                     "%d COMPLETE, %d counter callback(s))",
                     mode, atomic_load(&after_gone), atomic_load(&held_completes), atomic_load(&counted_held));
        return report;
    }
    if (!atomic_load(&signal_seen) || !atomic_load(&unloading) || !atomic_load(&finalized))
        snprintf(report, sizeof report,
                 "scenario not reached: signal reached 0 in ENQUEUE EXIT %d, OnUnload began %d, finalized %d",
                 atomic_load(&signal_seen), atomic_load(&unloading), atomic_load(&finalized));
    else if (atomic_load(&held_completes) != 1 || atomic_load(&after_finalize))
        snprintf(report, sizeof report,
                 "dispatch %llu, complete before OnUnload, got %d COMPLETE record(s) (context stopped while its "
                 "ENQUEUE EXIT ran: %d); %d record(s) after finalize",
                 (unsigned long long)atomic_load(&held_id), atomic_load(&held_completes),
                 atomic_load(&stopped_in_exit), atomic_load(&after_finalize));
    return report;
}
