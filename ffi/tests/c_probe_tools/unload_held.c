/*
 * The runtime is shut down (OnUnload) while a COMPLETE is held behind a slow ENQUEUE EXIT: the
 * application saw its kernel complete (its signal fires when the kernel finished, docs/abi.md
 * §2) and unloads kreplay from another thread while the submitting thread is still in the tool's
 * ENQUEUE EXIT. ENQUEUE EXIT of the first application dispatch waits until the application's
 * signal reached 0, then until the child says OnUnload begins (`probe_unload_begins`), then up
 * to 1 s for its own context to stop (OnUnload stopping it). That dispatch must still get its
 * COMPLETE, once, before the tool's finalize; no record may come after the finalize.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int (*app_wait_fn)(uint32_t grid, uint32_t timeout_ms);

static app_wait_fn app_wait;
static kreplay_context_id_t ctx;
static atomic_int unloading, finalized, after_finalize;
static atomic_ullong held_id; /* the dispatch whose ENQUEUE EXIT lingered */
static atomic_int held_completes, exits, stopped_in_exit, signal_seen;

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
    if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE) {
        if (atomic_load(&held_id) == p->dispatch_info.dispatch_id) atomic_fetch_add(&held_completes, 1);
        return;
    }
    if (record.operation != KREPLAY_KERNEL_DISPATCH_ENQUEUE || record.phase != KREPLAY_CALLBACK_PHASE_EXIT) return;
    if (atomic_fetch_add(&exits, 1) != 0 || !app_wait) return;
    atomic_store(&held_id, p->dispatch_info.dispatch_id);
    if (app_wait(p->dispatch_info.grid_size.x, 5000) == 0) atomic_store(&signal_seen, 1);
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

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
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
    return &result;
}

const char* probe_report(void) {
    static char report[512];
    report[0] = 0;
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
