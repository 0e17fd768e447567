/*
 * The replay owner's context stopped by another thread in the middle of a replay's pass loop,
 * and started again by another thread between two later dispatches. Dispatch 1 asks for 4 passes;
 * at PASS ENTER of its pass 1 a tool thread stops the owner's context (the callback waits until
 * kreplay_stop_context returned). Then:
 *   - nothing of the owner (record, pass-count or continue callback) may arrive until a tool
 *     thread has started the context again (in the tracing context's ENQUEUE ENTER of dispatch 2);
 *   - dispatch 1 ends after pass 1, as if its continue callback had said stop: its tracing
 *     context (never stopped) sees passes 0 and 1 only, kreplay counts 2 passes for it;
 *   - dispatch 3, with the owner started again, is replayed in 4 passes as usual;
 *   - the application's results equal single runs (the harness checks them).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DISPATCH 16

static kreplay_context_id_t replay_ctx, trace_ctx;
static atomic_int stopped;       /* the stop returned; cleared once the start returned */
static atomic_int owner_after;   /* owner callbacks while stopped */
static atomic_int did_stop, did_restart;
static atomic_int traced_pass_mask[MAX_DISPATCH];
static atomic_int replayed_passes[MAX_DISPATCH];
static char report[1024];

static void problem(const char* fmt, long long a, long long b) {
    size_t len = strlen(report);
    if (len + 200 > sizeof report) return;
    snprintf(report + len, sizeof report - len, fmt, a, b);
    strcat(report, "; ");
}

static void* stopper(void* arg) {
    (void)arg;
    if (kreplay_stop_context(replay_ctx) == KREPLAY_STATUS_SUCCESS) atomic_store(&stopped, 1);
    return NULL;
}

static void* starter(void* arg) {
    (void)arg;
    atomic_store(&stopped, 0);
    kreplay_start_context(replay_ctx);
    return NULL;
}

static void run_on_thread(void* (*f)(void*)) {
    pthread_t t;
    if (pthread_create(&t, NULL, f, NULL) == 0) pthread_join(t, NULL);
}

static void owner_called(void) {
    if (atomic_load(&stopped)) atomic_fetch_add(&owner_after, 1);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    owner_called();
    return 4;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t pass, uint64_t total, kreplay_user_data_t user) {
    (void)info;
    (void)pass;
    (void)total;
    (void)user;
    owner_called();
    return 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    int expected = 0;
    uint64_t id;
    (void)user;
    (void)data;
    owner_called();
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG && record.operation != KREPLAY_KERNEL_REPLAY_PASS) return;
    id = p->dispatch_info.dispatch_id;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = pass_count;
        p->replay_continue = keep_going;
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && id < MAX_DISPATCH) {
        atomic_store(&replayed_passes[id], (int)p->passes_run);
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
               p->current_pass == 1 && atomic_compare_exchange_strong(&did_stop, &expected, 1)) {
        run_on_thread(stopper);
    }
}

static void on_trace(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    int expected = 0;
    (void)user;
    (void)data;
    if (id >= MAX_DISPATCH) return;
    if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE && p->replay_pass != KREPLAY_REPLAY_PASS_NONE &&
        p->replay_pass < 16)
        atomic_fetch_or(&traced_pass_mask[id], 1 << p->replay_pass);
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        id == 2 && atomic_load(&did_stop) && atomic_compare_exchange_strong(&did_restart, &expected, 1))
        run_on_thread(starter);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    const uint32_t ops[] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE, KREPLAY_KERNEL_DISPATCH_COMPLETE};
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) ||
        kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, ops, 2,
                                                   on_trace, NULL))
        return 1;
    return kreplay_start_context(replay_ctx) || kreplay_start_context(trace_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-owner-stop";
    return &result;
}

const char* probe_report(void) {
    kreplay_counters_t c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    if (!atomic_load(&did_stop) || !atomic_load(&did_restart))
        problem("stop %lld, restart %lld: the scenario did not run", atomic_load(&did_stop), atomic_load(&did_restart));
    if (atomic_load(&owner_after))
        problem("%lld owner callback(s) after kreplay_stop_context returned on another thread%.0lld",
                atomic_load(&owner_after), 0);
    if (atomic_load(&traced_pass_mask[1]) != 0x3)
        problem("dispatch 1: its tracing context saw passes (bit mask) %lld, want passes 0 and 1 (%lld)",
                atomic_load(&traced_pass_mask[1]), 3);
    if (atomic_load(&replayed_passes[3]) != 4)
        problem("dispatch 3 ran %lld passes after the owner was started again, want %lld",
                atomic_load(&replayed_passes[3]), 4);
    if (kreplay_get_counters(&c) != KREPLAY_STATUS_SUCCESS || c.replays != 2 || c.passes != 6)
        problem("kreplay counted %lld replays and %lld passes, want 2 (dispatches 1 and 3) and 6 (2 + 4)",
                (long long)c.replays, (long long)c.passes);
    return report;
}
