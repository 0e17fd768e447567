/*
 * A profiler whose PASS ENTER takes a while on one agent (it programs a slow counter block):
 * 1.5 s at pass 0 of the first dispatch on the agent named by probe_slow_agent. Dispatches on
 * other agents are replayed too (2 passes) without delay. kreplay.h: while a replay callback
 * runs, *the agent being replayed* does no other work; docs/abi.md §3 rule 1: other agents are
 * never blocked. The harness measures a dispatch on another agent made meanwhile.
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <time.h>

static atomic_ullong slow_agent;
static atomic_int sleeping, slept;

void probe_slow_agent(uint64_t agent) { atomic_store(&slow_agent, agent); }
int probe_sleeping(void) { return atomic_load(&sleeping); }

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = two;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && p->dispatch_info.agent_id.handle == atomic_load(&slow_agent) &&
        !atomic_exchange(&slept, 1)) {
        struct timespec ts = {1, 500000000L};
        atomic_store(&sleeping, 1);
        nanosleep(&ts, NULL);
        atomic_store(&sleeping, 0);
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)record;
    (void)user;
    (void)data;
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx, trace;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&ctx) || kreplay_create_context(&trace)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(trace, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    return kreplay_start_context(ctx) || kreplay_start_context(trace);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-slow-callback";
    return &result;
}

const char* probe_report(void) { return slept ? "" : "the slow PASS ENTER never ran"; }
