/*
 * Contexts started by another thread between the ENTER and the EXIT of an operation. Three
 * contexts: `late` (dispatch tracing, ENQUEUE, configured first, not started), `owner` (kernel
 * replay, not started) and `trigger` (dispatch tracing, ENQUEUE, started). In trigger's ENQUEUE
 * ENTER of the first dispatch a tool thread starts `late` and `owner` (the callback waits until
 * both calls returned). `late` got no ENQUEUE ENTER for that dispatch (it was stopped when
 * kreplay delivered it), and `owner` no CONFIG ENTER: neither may then receive the EXIT of an
 * operation whose ENTER it never saw (an EXIT always pairs with an ENTER of the same operation).
 * Later dispatches must reach both normally.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DISPATCH 16

static kreplay_context_id_t late_ctx, owner_ctx, trigger_ctx;
static atomic_int started_them;
static atomic_int late_enter[MAX_DISPATCH], late_exit[MAX_DISPATCH], late_exit_unpaired;
static atomic_int owner_enter[MAX_DISPATCH], owner_other[MAX_DISPATCH], owner_unpaired;
static char report[1024];

static void problem(const char* fmt, long long a, long long b) {
    size_t len = strlen(report);
    if (len + 200 > sizeof report) return;
    snprintf(report + len, sizeof report - len, fmt, a, b);
    strcat(report, "; ");
}

static void* starter(void* arg) {
    (void)arg;
    kreplay_start_context(late_ctx);
    kreplay_start_context(owner_ctx);
    return NULL;
}

static void on_late(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)data;
    if (id >= MAX_DISPATCH || record.operation != KREPLAY_KERNEL_DISPATCH_ENQUEUE) return;
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        atomic_fetch_add(&late_enter[id], 1);
        user->value = 0x1a7e0000u + record.correlation_id;
    } else {
        atomic_fetch_add(&late_exit[id], 1);
        if (user->value != 0x1a7e0000u + record.correlation_id) atomic_fetch_add(&late_exit_unpaired, 1);
    }
}

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_owner(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    uint64_t id;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT || record.operation == KREPLAY_KERNEL_REPLAY_RESTORE) {
        id = ((kreplay_callback_tracing_kernel_replay_memory_data_t*)record.payload)->dispatch_info.dispatch_id;
    } else {
        id = p->dispatch_info.dispatch_id;
    }
    if (id >= MAX_DISPATCH) return;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        atomic_fetch_add(&owner_enter[id], 1);
        user->value = 0x0e0e0000u + id;
        p->replay_pass_count = two;
        return;
    }
    atomic_fetch_add(&owner_other[id], 1);
    if (user->value != 0x0e0e0000u + id) atomic_fetch_add(&owner_unpaired, 1);
}

static void on_trigger(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    int expected = 0;
    pthread_t t;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_DISPATCH_ENQUEUE || record.phase != KREPLAY_CALLBACK_PHASE_ENTER) return;
    if (!atomic_compare_exchange_strong(&started_them, &expected, 1)) return;
    if (pthread_create(&t, NULL, starter, NULL) == 0) pthread_join(t, NULL);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    const uint32_t enqueue[] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE};
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&late_ctx) || kreplay_create_context(&owner_ctx) ||
        kreplay_create_context(&trigger_ctx))
        return 1;
    if (kreplay_configure_callback_tracing_service(late_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, enqueue, 1,
                                                   on_late, NULL) ||
        kreplay_configure_callback_tracing_service(owner_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_owner, NULL) ||
        kreplay_configure_callback_tracing_service(trigger_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, enqueue, 1,
                                                   on_trigger, NULL))
        return 1;
    return kreplay_start_context(trigger_ctx) != KREPLAY_STATUS_SUCCESS;
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-start-between";
    return &result;
}

const char* probe_report(void) {
    int id, later_ok = 0;
    if (!atomic_load(&started_them)) problem("the contexts were never started%.0lld%.0lld", 0, 0);
    if (atomic_load(&late_exit_unpaired))
        problem("%lld ENQUEUE EXIT(s) reached a context that had not received their ENTER%.0lld",
                atomic_load(&late_exit_unpaired), 0);
    if (atomic_load(&owner_unpaired))
        problem("%lld KERNEL_REPLAY record(s) reached the owner for a dispatch whose CONFIG ENTER it never "
                "received%.0lld",
                atomic_load(&owner_unpaired), 0);
    for (id = 2; id < MAX_DISPATCH; id++)
        if (atomic_load(&late_enter[id]) >= 1 && atomic_load(&late_exit[id]) >= 1 && atomic_load(&owner_enter[id]) == 1 &&
            atomic_load(&owner_other[id]) > 0)
            later_ok++;
    if (later_ok == 0) problem("no later dispatch reached both started contexts%.0lld%.0lld", 0, 0);
    return report;
}
