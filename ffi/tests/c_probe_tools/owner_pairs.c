/*
 * The replay owner's context stopped and started again by other threads inside one replay: in
 * the owner's SNAPSHOT ENTER of the first replayed dispatch a tool thread stops it, and in the
 * ENQUEUE ENTER of that dispatch's pass 0 (a dispatch tracing context of the tool) another tool
 * thread starts it again (each callback waits until the call returned). The owner missed
 * SNAPSHOT EXIT and PASS ENTER of pass 0; it must not then receive an EXIT whose ENTER it
 * missed (PASS EXIT of pass 0): every EXIT pairs with an ENTER of the same operation and pass.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kreplay_context_id_t owner_ctx, trace_ctx;
static atomic_int did_stop, did_start, stopped_now;
static atomic_int unpaired, after_stop, records_after_restart;
/* open[operation]: pass + 1 of the ENTER delivered and not yet closed (0: none) */
static uint64_t open_enter[8];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[512];

static void* stopper(void* arg) {
    (void)arg;
    if (kreplay_stop_context(owner_ctx) == KREPLAY_STATUS_SUCCESS) atomic_store(&stopped_now, 1);
    return NULL;
}

static void* starter(void* arg) {
    (void)arg;
    atomic_store(&stopped_now, 0);
    kreplay_start_context(owner_ctx);
    return NULL;
}

static void run_on_thread(void* (*f)(void*)) {
    pthread_t t;
    if (pthread_create(&t, NULL, f, NULL) == 0) pthread_join(t, NULL);
}

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 3;
}

static void on_owner(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    uint64_t pass;
    int expected = 0;
    (void)user;
    (void)data;
    if (atomic_load(&stopped_now)) atomic_fetch_add(&after_stop, 1);
    if (atomic_load(&did_start)) atomic_fetch_add(&records_after_restart, 1);
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT || record.operation == KREPLAY_KERNEL_REPLAY_RESTORE)
        pass = ((kreplay_callback_tracing_kernel_replay_memory_data_t*)record.payload)->current_pass;
    else
        pass = ((kreplay_callback_tracing_kernel_replay_data_t*)record.payload)->current_pass;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) pass = 0;
    if (record.operation >= 8) return;
    pthread_mutex_lock(&lock);
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        open_enter[record.operation] = pass + 1;
    } else if (record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        if (open_enter[record.operation] != pass + 1) atomic_fetch_add(&unpaired, 1);
        open_enter[record.operation] = 0;
    }
    pthread_mutex_unlock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        ((kreplay_callback_tracing_kernel_replay_data_t*)record.payload)->replay_pass_count = three;
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        atomic_compare_exchange_strong(&did_stop, &expected, 1))
        run_on_thread(stopper);
}

static void on_trace(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    int expected = 0;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->replay_pass == 0 && atomic_load(&did_stop) && atomic_compare_exchange_strong(&did_start, &expected, 1))
        run_on_thread(starter);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    const uint32_t enqueue[] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE};
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&owner_ctx) || kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(owner_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_owner, NULL) ||
        kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, enqueue, 1,
                                                   on_trace, NULL))
        return 1;
    return kreplay_start_context(owner_ctx) || kreplay_start_context(trace_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-owner-pairs";
    return &result;
}

const char* probe_report(void) {
    if (!atomic_load(&did_stop) || !atomic_load(&did_start))
        snprintf(report, sizeof report, "the scenario did not run (stop %d, start %d)", atomic_load(&did_stop),
                 atomic_load(&did_start));
    else if (atomic_load(&unpaired) || atomic_load(&after_stop) || !atomic_load(&records_after_restart))
        snprintf(report, sizeof report,
                 "%d KERNEL_REPLAY EXIT record(s) reached the owner without their ENTER; %d record(s) while "
                 "stopped; %d after it was started again (want some)",
                 atomic_load(&unpaired), atomic_load(&after_stop), atomic_load(&records_after_restart));
    return report;
}
