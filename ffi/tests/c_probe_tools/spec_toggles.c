/*
 * SPEC §2 "Localized context control" from a C tool, in a real replay:
 *  - replay_start_context / replay_stop_context work during PASS ENTER only: called (through the
 *    pointers saved at PASS ENTER) from every other record of the owner, from its pass-count and
 *    continue callbacks and from dispatch records of a pass, they return CONTEXT_ERROR and change
 *    nothing (tracer T, never masked, gets every pass's records);
 *  - they mask only contexts started when the replay began: handle 0, a handle never created, a
 *    context never started (N) and one the tool starts globally inside PASS ENTER (L) are
 *    CONTEXT_NOT_STARTED; they never change global state (N stays stopped and gets nothing);
 *  - a mask holds for the following passes and is reset when the dispatch's replay ends: tracer M
 *    is masked off at PASS ENTER 0 of odd dispatches and gets nothing from any of their passes,
 *    and every pass of even dispatches, which never mask it;
 *  - the owner masking its own context keeps receiving its replay records, while the dispatch
 *    tracing service on that same context gets none of the masked passes;
 *  - a toggle called from another thread of the tool while PASS ENTER runs is refused
 *    (CONTEXT_ERROR, nothing changes): the toggles belong to the thread PASS ENTER is on.
 * Every dispatch: 3 passes with a continue callback that always says go on.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MAXD 64
enum { T, M, N, L, TRACERS, O = TRACERS }; /* O: the owner's own dispatch tracing service */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[4096];
static size_t problems;
static kreplay_context_id_t owner, tracer[TRACERS];
static kreplay_context_toggle_cb_t saved_start, saved_stop;
static uint64_t current_dispatch;
static uint64_t records[TRACERS + 1][MAXD][3]; /* per tracer (and O), dispatch, pass: records received */
static uint64_t owner_records[MAXD];
static uint64_t misplaced_calls;

static void problem(const char* what, uint64_t id, uint64_t value) {
    size_t used = strlen(report);
    problems++;
    if (used + 200 < sizeof report)
        snprintf(report + used, sizeof report - used, "dispatch %llu: %s (%llu); ", (unsigned long long)id, what,
                 (unsigned long long)value);
}

/* A toggle outside PASS ENTER: must be refused. */
static void misplaced_toggles(const char* where) {
    kreplay_status_t a, b;
    if (!saved_stop) return;
    misplaced_calls++;
    a = saved_stop(tracer[T]);
    b = saved_start(tracer[M]);
    if (a != KREPLAY_STATUS_ERROR_CONTEXT_ERROR || b != KREPLAY_STATUS_ERROR_CONTEXT_ERROR) {
        char what[160];
        snprintf(what, sizeof what, "a toggle in %s was not refused with CONTEXT_ERROR (status stop*100+start)", where);
        problem(what, current_dispatch, (uint64_t)a * 100u + (uint64_t)b);
    }
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    pthread_mutex_lock(&lock);
    misplaced_toggles("replay_pass_count");
    pthread_mutex_unlock(&lock);
    return 3;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t current, uint64_t total, kreplay_user_data_t user) {
    (void)info;
    (void)current;
    (void)total;
    (void)user;
    pthread_mutex_lock(&lock);
    misplaced_toggles("replay_continue");
    pthread_mutex_unlock(&lock);
    return 1;
}

static const char* name_of(kreplay_callback_tracing_record_t record) {
    static const char* names[5][3] = {{"?", "?", "?"},
                                      {"?", "CONFIG ENTER", "CONFIG EXIT"},
                                      {"?", "PASS ENTER", "PASS EXIT"},
                                      {"?", "SNAPSHOT ENTER", "SNAPSHOT EXIT"},
                                      {"?", "RESTORE ENTER", "RESTORE EXIT"}};
    return record.operation < 5 && record.phase < 3 ? names[record.operation][record.phase] : "?";
}

/* A helper thread of the tool, started and joined inside PASS ENTER: the toggles belong to the
 * thread PASS ENTER is delivered on. */
static void* toggle_from_helper(void* arg) {
    kreplay_status_t* status = arg;
    *status = saved_stop(tracer[T]);
    return NULL;
}

static void pass_enter(kreplay_callback_tracing_kernel_replay_data_t* p) {
    uint64_t id = p->dispatch_info.dispatch_id, pass = p->current_pass;
    kreplay_context_id_t zero = {0}, unknown = {UINT64_MAX >> 1};
    kreplay_context_id_t strangers[4];
    kreplay_status_t s;
    int i, active = -1;
    saved_start = p->replay_start_context;
    saved_stop = p->replay_stop_context;
    if (!saved_start || !saved_stop) {
        problem("PASS ENTER without toggles", id, pass);
        return;
    }
    if (id == 1 && pass == 0 && kreplay_start_context(tracer[L]) != KREPLAY_STATUS_SUCCESS)
        problem("L cannot be started", id, pass);
    strangers[0] = zero;
    strangers[1] = unknown;
    strangers[2] = tracer[N];
    strangers[3] = tracer[L];
    for (i = 0; i < 4; i++) {
        if ((s = saved_stop(strangers[i])) != KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED)
            problem("replay_stop_context of a context not started when the replay began (index*100+status)", id,
                    (uint64_t)i * 100u + (uint64_t)s);
        if ((s = saved_start(strangers[i])) != KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED)
            problem("replay_start_context of a context not started when the replay began (index*100+status)", id,
                    (uint64_t)i * 100u + (uint64_t)s);
    }
    if (kreplay_context_is_active(tracer[N], &active) != KREPLAY_STATUS_SUCCESS || active != 0)
        problem("toggling N changed its global state", id, (uint64_t)active);
    if (id == 2 && pass == 0) {
        pthread_t helper;
        kreplay_status_t helper_status = KREPLAY_STATUS_SUCCESS;
        if (pthread_create(&helper, NULL, toggle_from_helper, &helper_status) == 0) {
            pthread_join(helper, NULL);
            if (helper_status != KREPLAY_STATUS_ERROR_CONTEXT_ERROR)
                problem("a toggle from another thread during PASS ENTER was not refused with CONTEXT_ERROR", id,
                        (uint64_t)helper_status);
        }
    }
    if (id % 2 == 1 && pass == 0) {
        /* Twice: idempotent. */
        if (saved_stop(tracer[M]) != KREPLAY_STATUS_SUCCESS || saved_stop(tracer[M]) != KREPLAY_STATUS_SUCCESS)
            problem("masking M off failed", id, pass);
        if (kreplay_context_is_active(tracer[M], &active) != KREPLAY_STATUS_SUCCESS || active != 1)
            problem("masking M off changed its global state", id, (uint64_t)active);
        /* The owner masks itself off: it keeps receiving its records. */
        if (saved_stop(owner) != KREPLAY_STATUS_SUCCESS) problem("the owner cannot mask itself", id, pass);
    }
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
    uint64_t id;
    (void)user;
    (void)data;
    pthread_mutex_lock(&lock);
    id = record.operation <= KREPLAY_KERNEL_REPLAY_PASS ? p->dispatch_info.dispatch_id : m->dispatch_info.dispatch_id;
    if (id >= MAXD) goto out;
    current_dispatch = id;
    owner_records[id]++;
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        pass_enter(p);
        goto out;
    }
    misplaced_toggles(name_of(record));
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        p->replay_pass_count = pass_count;
        p->replay_continue = keep_going;
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_EXIT && p->current_pass < 3) {
        uint64_t pass = p->current_pass;
        uint64_t want_m = id % 2 == 1 ? 0 : 3;
        uint64_t want_l = id == 1 ? 3 : 0;
        if (records[T][id][pass] != 3) problem("T (never masked) did not get its 3 records of a pass", id, records[T][id][pass]);
        if (records[M][id][pass] != want_m)
            problem(id % 2 ? "M, masked off at PASS ENTER 0, got records of this pass"
                           : "M, not masked in this dispatch, did not get its 3 records of a pass (mask not reset?)",
                    id, records[M][id][pass]);
        if (records[N][id][pass] != 0) problem("N (never started) got records", id, records[N][id][pass]);
        if (records[O][id][pass] != want_m)
            problem(id % 2 ? "the owner's dispatch service, its context masked off at PASS ENTER 0, got records of this pass"
                           : "the owner's dispatch service, not masked in this dispatch, did not get its 3 records of a pass",
                    id, records[O][id][pass]);
        if (records[L][id][pass] != want_l)
            problem("L, started globally at PASS ENTER 0 of dispatch 1 (not maskable), got other than 3 records of a pass", id,
                    records[L][id][pass]);
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        int active = -1;
        /* PASS ENTER x3, PASS EXIT x3, SNAPSHOT x2, RESTORE x4, CONFIG x2. */
        if (owner_records[id] != 14) problem("the owner did not get all 14 records of its replay", id, owner_records[id]);
        if (p->outcome != KREPLAY_REPLAY_OUTCOME_REPLAYED || p->passes_run != 3)
            problem("CONFIG EXIT outcome*100+passes_run", id, p->outcome * 100u + p->passes_run);
        if (id == 1 && kreplay_stop_context(tracer[L]) != KREPLAY_STATUS_SUCCESS) problem("L cannot be stopped", id, 0);
        if (kreplay_context_is_active(owner, &active) != KREPLAY_STATUS_SUCCESS || active != 1)
            problem("the owner's mask changed its global state", id, (uint64_t)active);
    }
out:
    pthread_mutex_unlock(&lock);
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    int which = (int)(uintptr_t)data;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)user;
    pthread_mutex_lock(&lock);
    if (id < MAXD && p->replay_pass < 3) records[which][id][p->replay_pass]++;
    else if (id < MAXD) problem("a dispatch record outside the replay's passes (tracer)", id, (uint64_t)which);
    if (which == T) misplaced_toggles("a KERNEL_DISPATCH record of a pass");
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    int i;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&owner)) return 1;
    if (kreplay_configure_callback_tracing_service(owner, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(owner, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, on_dispatch,
                                                   (void*)(uintptr_t)O))
        return 1;
    for (i = 0; i < TRACERS; i++) {
        if (kreplay_create_context(&tracer[i])) return 1;
        if (kreplay_configure_callback_tracing_service(tracer[i], KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                       on_dispatch, (void*)(uintptr_t)i))
            return 1;
    }
    return kreplay_start_context(owner) || kreplay_start_context(tracer[T]) || kreplay_start_context(tracer[M]);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    client_id->name = "spec-toggles";
    return &result;
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    if (!problems && (owner_records[1] == 0 || owner_records[4] == 0 || misplaced_calls < 40))
        problem("too few dispatches or misplaced toggle calls were seen", 0, misplaced_calls);
    pthread_mutex_unlock(&lock);
    return report;
}
