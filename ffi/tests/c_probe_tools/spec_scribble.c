/*
 * A careless tool that writes over every payload field it is not meant to set, in every record it
 * receives, after checking what the record carried. kreplay.h: "dispatch_info: always set",
 * "the same dispatch_id is used for every pass", sizes, pass indices and "every field that does
 * not apply set to zero" are kreplay's to fill in; a tool sets only replay_pass_count and
 * replay_continue (CONFIG ENTER) and may override replay_continue (PASS EXIT). What one record's
 * callback (or one service's) scribbled must not show in the next record, in another service's
 * record, or in the arguments of the pass-count and continue callbacks.
 *
 * Odd dispatches: 3 passes, no continue callback. Even dispatches: 0 passes (indefinite) with a
 * continue callback that stops after pass 1. Two dispatch-tracing contexts (A and B) check and
 * scribble too.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[4096];
static size_t problems;
static kreplay_context_id_t replay_ctx, tracer_a, tracer_b;

/* The dispatch being replayed, as CONFIG ENTER showed it. */
static kreplay_kernel_dispatch_info_t ref;
static int in_replay;
static uint64_t current_pass; /* the pass between PASS ENTER and PASS EXIT */
static int in_pass;
static uint64_t dispatch_records[2]; /* per tracer, of replayed passes */
static uint64_t config_thread;       /* the thread CONFIG ENTER came on: the submitting one */

static uint64_t this_thread(void) { return (uint64_t)syscall(SYS_gettid); }

static void problem(const char* what, uint64_t id, uint64_t value) {
    size_t used = strlen(report);
    problems++;
    if (used + 160 < sizeof report)
        snprintf(report + used, sizeof report - used, "dispatch %llu: %s (%llu); ", (unsigned long long)id, what,
                 (unsigned long long)value);
}

static int info_ok(const kreplay_kernel_dispatch_info_t* info) {
    return memcmp(info, &ref, sizeof ref) == 0;
}

static int all_zero(const void* p, size_t n) {
    const unsigned char* b = p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void scribble_info(kreplay_kernel_dispatch_info_t* info) { memset(info, 0xa5, sizeof *info); }

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)user;
    pthread_mutex_lock(&lock);
    if (!info_ok(&info)) problem("replay_pass_count got another dispatch_info than CONFIG ENTER", info.dispatch_id, info.size);
    if (this_thread() != config_thread) problem("replay_pass_count not on the submitting thread", ref.dispatch_id, 0);
    pthread_mutex_unlock(&lock);
    return ref.dispatch_id % 2 ? 3 : 0;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t current, uint64_t total,
                      kreplay_user_data_t user) {
    (void)user;
    pthread_mutex_lock(&lock);
    if (!info_ok(&info)) problem("replay_continue got another dispatch_info than CONFIG ENTER", info.dispatch_id, info.size);
    if (total != 0) problem("replay_continue of an indefinite replay got total_passes", ref.dispatch_id, total);
    if (this_thread() != config_thread) problem("replay_continue not on the submitting thread", ref.dispatch_id, 0);
    pthread_mutex_unlock(&lock);
    return current < 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)user;
    (void)data;
    pthread_mutex_lock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG || record.operation == KREPLAY_KERNEL_REPLAY_PASS) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        int config_enter = record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER;
        int config_exit = record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_EXIT;
        int pass = record.operation == KREPLAY_KERNEL_REPLAY_PASS;
        if (config_enter) {
            ref = p->dispatch_info;
            in_replay = 1;
            config_thread = this_thread();
            if (ref.size != sizeof ref) problem("CONFIG ENTER dispatch_info.size", ref.dispatch_id, ref.size);
            if (!all_zero(ref.reserved_padding, sizeof ref.reserved_padding))
                problem("CONFIG ENTER dispatch_info.reserved_padding is not zero", ref.dispatch_id, 0);
            if (!all_zero(&p->current_pass, sizeof *p - offsetof(kreplay_callback_tracing_kernel_replay_data_t, current_pass)))
                problem("CONFIG ENTER carries non-zero fields after dispatch_info", ref.dispatch_id, 0);
        } else if (!info_ok(&p->dispatch_info)) {
            problem("a later replay record carries another dispatch_info than CONFIG ENTER", ref.dispatch_id,
                    p->dispatch_info.dispatch_id);
        }
        if (p->size != sizeof *p) problem("replay payload size", ref.dispatch_id, p->size);
        if (pass && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            current_pass = p->current_pass;
            in_pass = 1;
            if (p->total_passes != (ref.dispatch_id % 2 ? 3u : 0u))
                problem("PASS ENTER total_passes", ref.dispatch_id, p->total_passes);
        }
        if (pass && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
            if (p->current_pass != current_pass) problem("PASS EXIT current_pass differs from its ENTER", ref.dispatch_id, p->current_pass);
            if (p->total_passes != (ref.dispatch_id % 2 ? 3u : 0u))
                problem("PASS EXIT total_passes", ref.dispatch_id, p->total_passes);
            in_pass = 0;
        }
        if (pass && (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) != (p->replay_start_context != NULL && p->replay_stop_context != NULL))
            problem("context toggles set outside PASS ENTER, or missing there", ref.dispatch_id, p->current_pass);
        if (!config_exit && !all_zero(&p->outcome, sizeof *p - offsetof(kreplay_callback_tracing_kernel_replay_data_t, outcome)))
            problem("CONFIG EXIT fields are not zero on another record", ref.dispatch_id, record.operation * 10 + record.phase);
        if (config_exit) {
            uint64_t want = ref.dispatch_id % 2 ? 3 : 2;
            if (p->outcome != KREPLAY_REPLAY_OUTCOME_REPLAYED || p->passes_run != want || p->current_pass != want ||
                p->status != KREPLAY_STATUS_SUCCESS || p->decline_reason != 0 || p->bytes_lost != 0 ||
                p->end_reason != (ref.dispatch_id % 2 ? KREPLAY_REPLAY_END_LAST_PASS : KREPLAY_REPLAY_END_CONTINUE_STOPPED))
                problem("CONFIG EXIT (outcome * 100 + passes_run)", ref.dispatch_id, p->outcome * 100u + p->passes_run);
            if (p->total_passes != 0) problem("CONFIG EXIT total_passes (a PASS field) is not zero", ref.dispatch_id, p->total_passes);
            if (p->replay_start_context || p->replay_stop_context)
                problem("CONFIG EXIT carries context toggles", ref.dispatch_id, 0);
            in_replay = 0;
        }
        /* Scribble over everything the tool does not own. */
        {
            kreplay_pass_count_cb_t keep_count = p->replay_pass_count;
            kreplay_continue_cb_t keep_continue = p->replay_continue;
            memset(p, 0x5a, sizeof *p);
            scribble_info(&p->dispatch_info);
            p->replay_pass_count = keep_count;
            p->replay_continue = keep_continue;
            p->replay_start_context = NULL;
            p->replay_stop_context = NULL;
            if (config_enter) {
                p->replay_pass_count = pass_count;
                p->replay_continue = ref.dispatch_id % 2 ? NULL : keep_going;
            }
        }
    } else {
        kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        if (m->size != sizeof *m) problem("memory payload size", ref.dispatch_id, m->size);
        if (!info_ok(&m->dispatch_info))
            problem("a SNAPSHOT/RESTORE record carries another dispatch_info than CONFIG ENTER", ref.dispatch_id,
                    m->dispatch_info.dispatch_id);
        if (record.operation == KREPLAY_KERNEL_REPLAY_RESTORE && m->current_pass != current_pass)
            problem("RESTORE current_pass is not the pass just run", ref.dispatch_id, m->current_pass);
        memset(m, 0x5a, sizeof *m);
    }
    pthread_mutex_unlock(&lock);
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    int which = (int)(uintptr_t)data;
    (void)user;
    pthread_mutex_lock(&lock);
    /* An EXIT may show what this same service wrote at its ENTER: only ENTER and COMPLETE are
     * checked, and scribbled over. */
    if (record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        pthread_mutex_unlock(&lock);
        return;
    }
    if (p->size != sizeof *p) problem("dispatch payload size", ref.dispatch_id, p->size);
    if (in_replay) {
        dispatch_records[which]++;
        if (!info_ok(&p->dispatch_info))
            problem(which ? "tracer B: dispatch record carries another dispatch_info than CONFIG ENTER"
                          : "tracer A: dispatch record carries another dispatch_info than CONFIG ENTER",
                    ref.dispatch_id, p->dispatch_info.dispatch_id);
        if (this_thread() != config_thread)
            problem("a dispatch record of a replayed pass not on the submitting thread (replay_pass)", ref.dispatch_id,
                    p->replay_pass);
        if (p->replay_pass != current_pass)
            problem(which ? "tracer B: replay_pass is not the current pass" : "tracer A: replay_pass is not the current pass",
                    ref.dispatch_id, p->replay_pass);
    }
    memset(p, 0x5a, sizeof *p);
    scribble_info(&p->dispatch_info);
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&tracer_a) || kreplay_create_context(&tracer_b))
        return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(tracer_a, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, (void*)(uintptr_t)0))
        return 1;
    if (kreplay_configure_callback_tracing_service(tracer_b, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, (void*)(uintptr_t)1))
        return 1;
    return kreplay_start_context(replay_ctx) || kreplay_start_context(tracer_a) || kreplay_start_context(tracer_b);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "spec-scribble";
    return &result;
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    if (!problems && (dispatch_records[0] == 0 || dispatch_records[0] != dispatch_records[1]))
        problem("tracers A and B saw different numbers of replayed dispatch records (B)", 0, dispatch_records[1]);
    pthread_mutex_unlock(&lock);
    return report;
}
