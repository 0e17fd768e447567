/*
 * kreplay.h: the PASS ENTER toggles "only mask the current dispatch". At PASS ENTER 0 of the
 * first application dispatch (2 passes) the tool masks its dispatch tracer T off, then submits a
 * dispatch of its own on the same agent from that callback and waits for it (it runs once,
 * re-entrant). T must get no record of the replayed dispatch's passes (masked, sticky), and the
 * tool's own dispatch (declined as reentrant_dispatch at its CONFIG EXIT: it runs once), which is
 * another dispatch, must reach T whole: ENQUEUE ENTER, ENQUEUE EXIT
 * and COMPLETE, never a COMPLETE without its ENQUEUE; T's dispatch counting service is asked
 * about it (and about none of the masked passes).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int (*submit_fn)(uint64_t agent, uint32_t timeout_ms);
static submit_fn submit;
static uint64_t own_kernel;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kreplay_context_id_t tracer;
static uint64_t first_dispatch;
static int submitted, submit_failed;
static int own_enter, own_exit, own_complete; /* T's records of the tool's own dispatch */
static int masked_pass_records;               /* T's records of the masked replay's passes */
static int other_records;
static int own_config_enter, own_config_exit_ok, own_passes; /* replay records of the tool's dispatch */
static int own_counting_asks;                  /* T's counting service asked about the tool's dispatch */
static int masked_counting_asks;               /* ... about the masked replay's passes */

void probe_set_submit(submit_fn f, uint64_t kernel) {
    submit = f;
    own_kernel = kernel;
}

static uint64_t two(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 2;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation > KREPLAY_KERNEL_REPLAY_PASS) return;
    if (p->dispatch_info.kernel_id == own_kernel) {
        /* SPEC §3.1: it runs once, unreplayed, and the tool learns why. The tool asks for 2
         * passes all the same. */
        pthread_mutex_lock(&lock);
        if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            p->replay_pass_count = two;
            own_config_enter++;
        } else if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) {
            if (p->outcome == KREPLAY_REPLAY_OUTCOME_DECLINED && p->status == KREPLAY_STATUS_ERROR_REPLAY_DECLINED &&
                p->decline_reason == KREPLAY_REPLAY_DECLINE_REENTRANT_DISPATCH &&
                record.decline_reason == KREPLAY_REPLAY_DECLINE_REENTRANT_DISPATCH && p->passes_run == 1)
                own_config_exit_ok++;
        } else {
            own_passes++;
        }
        pthread_mutex_unlock(&lock);
        return;
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = two;
        pthread_mutex_lock(&lock);
        if (!first_dispatch) first_dispatch = p->dispatch_info.dispatch_id;
        pthread_mutex_unlock(&lock);
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER &&
        p->current_pass == 0 && p->dispatch_info.dispatch_id == first_dispatch && submit && !submitted) {
        submitted = 1;
        if (p->replay_stop_context(tracer) != KREPLAY_STATUS_SUCCESS || submit(p->dispatch_info.agent_id.handle, 3000) != 0)
            submit_failed = 1;
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    (void)user;
    (void)data;
    pthread_mutex_lock(&lock);
    if (p->dispatch_info.kernel_id == own_kernel) {
        if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE) own_complete++;
        else if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) own_enter++;
        else own_exit++;
    } else if (p->dispatch_info.dispatch_id == first_dispatch && p->replay_pass != KREPLAY_REPLAY_PASS_NONE) {
        masked_pass_records++;
    } else {
        other_records++;
    }
    pthread_mutex_unlock(&lock);
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t replay_pass, kreplay_counter_config_id_t* config,
                 void* data) {
    (void)config; /* counts nothing */
    (void)data;
    pthread_mutex_lock(&lock);
    if (info.kernel_id == own_kernel) own_counting_asks++;
    else if (info.dispatch_id == first_dispatch && replay_pass != KREPLAY_REPLAY_PASS_NONE) masked_counting_asks++;
    pthread_mutex_unlock(&lock);
}

static void counted(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* records, size_t count,
                    void* data) {
    (void)info;
    (void)records;
    (void)count;
    (void)data;
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t owner;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&owner) || kreplay_create_context(&tracer)) return 1;
    if (kreplay_configure_callback_tracing_service(owner, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(tracer, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, on_dispatch,
                                                   NULL))
        return 1;
    if (kreplay_configure_dispatch_counting_service(tracer, pick, counted, NULL)) return 1;
    return kreplay_start_context(owner) || kreplay_start_context(tracer);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "spec-reentrant-mask";
    return &result;
}

const char* probe_report(void) {
    static char report[512];
    pthread_mutex_lock(&lock);
    if (!submitted || submit_failed)
        snprintf(report, sizeof report, "the tool's own dispatch was not submitted or did not complete (%d, %d)", submitted,
                 submit_failed);
    else if (own_config_enter != 1 || own_config_exit_ok != 1 || own_passes)
        snprintf(report, sizeof report,
                 "the tool's own dispatch got CONFIG ENTER %d, CONFIG EXIT declined as reentrant_dispatch %d, PASS "
                 "records %d (want 1, 1, 0)",
                 own_config_enter, own_config_exit_ok, own_passes);
    else if (masked_pass_records)
        snprintf(report, sizeof report, "T, masked off at PASS ENTER 0, got %d record(s) of the replay's passes",
                 masked_pass_records);
    else if (own_enter != 1 || own_exit != 1 || own_complete != 1)
        snprintf(report, sizeof report,
                 "the tool's own dispatch, submitted in PASS ENTER after T was masked for the replayed dispatch, "
                 "reached T as ENQUEUE ENTER %d, ENQUEUE EXIT %d, COMPLETE %d (want 1, 1, 1)",
                 own_enter, own_exit, own_complete);
    else if (masked_counting_asks || own_counting_asks != 1)
        snprintf(report, sizeof report,
                 "T's counting service was asked %d time(s) about the masked replay's passes (want 0) and %d time(s) "
                 "about the tool's own dispatch (want 1)",
                 masked_counting_asks, own_counting_asks);
    else if (other_records == 0)
        snprintf(report, sizeof report, "T got no record of the later dispatches");
    pthread_mutex_unlock(&lock);
    return report;
}
