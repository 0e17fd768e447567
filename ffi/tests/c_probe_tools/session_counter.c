/*
 * A profiler that replays every dispatch in 2 passes and counts, per initialization, the
 * dispatches it replayed. probe_report says whether each initialize it got was followed by
 * replays and a finalize (PROBE_SESSIONS: how many runtime sessions the application runs).
 */
#include "kreplay.h"

#include <stdatomic.h>
#include <stdio.h>

static atomic_int inits, finals, replayed_since_init;
static char report[256];
static int reports;

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG) return;
    if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = two;
    else if (p->outcome == KREPLAY_REPLAY_OUTCOME_REPLAYED)
        atomic_fetch_add(&replayed_since_init, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)fin;
    (void)tool_data;
    atomic_fetch_add(&inits, 1);
    atomic_store(&replayed_since_init, 0);
    if (kreplay_create_context(&ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay,
                                                   NULL))
        return 1;
    return kreplay_start_context(ctx);
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    atomic_fetch_add(&finals, 1);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, tool_fini,
                                                     NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "probe-session-counter";
    return &result;
}

/* Called after each session's OnUnload. */
const char* probe_report(void) {
    reports++;
    report[0] = 0;
    if (atomic_load(&inits) != reports || atomic_load(&finals) != reports || atomic_load(&replayed_since_init) == 0)
        snprintf(report, sizeof report,
                 "after %d runtime session(s) the tool was initialized %d time(s), finalized %d time(s), and "
                 "replayed %d dispatch(es) since its last initialize",
                 reports, atomic_load(&inits), atomic_load(&finals), atomic_load(&replayed_since_init));
    return report;
}
