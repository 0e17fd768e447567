/*
 * Owns kernel replay and asks 2 passes of every dispatch. At PASS ENTER of pass 0 of the first
 * dispatch it holds the replay (bounded, 30 s) until the application calls life_release();
 * life_held() says whether it holds it now. For scenarios that act while a tool callback runs
 * on another thread (a fork, say).
 */
#include "kreplay.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static kreplay_context_id_t replay_ctx;
static atomic_int held, released, did_hold;

int life_held(void) { return atomic_load(&held); }
void life_release(void) { atomic_store(&released, 1); }
const char* probe_report(void) { return ""; }

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    int expected = 0;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = two;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && atomic_compare_exchange_strong(&did_hold, &expected, 1)) {
        time_t until = time(NULL) + 30;
        atomic_store(&held, 1);
        while (!atomic_load(&released) && time(NULL) < until) sched_yield();
        atomic_store(&held, 0);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    return kreplay_start_context(replay_ctx) != KREPLAY_STATUS_SUCCESS;
}

static void tool_fini(void* tool_data) { (void)tool_data; }

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority, kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "life_hold";
    return &result;
}
