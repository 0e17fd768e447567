/*
 * A tool that answers each dispatch's CONFIG ENTER from a script (PROBE_PLAN, comma-separated, one
 * answer per dispatch in order) and logs every record, pass-count and continue call, so the test
 * can hold the flow against the pass-count table and callback flow of docs/abi.md §2:
 *   opt      replay_pass_count left NULL
 *   p1       1 pass
 *   z        0 without continue (invalid)
 *   nN       N passes, no continue
 *   nNsK     N passes, continue returns 0 once current_pass >= K
 *   indK     0 (indefinite) + continue returning 0 once current_pass >= K
 *   clrK     0 + continue returning 1; replay_continue cleared at PASS EXIT of pass K
 *   setN     N passes, no continue at CONFIG ENTER; a continue returning 0 set at PASS EXIT 0
 *   setNkK   the same, set at PASS EXIT K
 *   inf      0 + continue always 1 (ends at KREPLAY_MAX_PASSES)
 *   big      KREPLAY_MAX_PASSES + 1 passes (PROBE_MAX must hold KREPLAY_MAX_PASSES)
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_EVENTS 4096

typedef struct probe_event_t {
    uint64_t dispatch_id;
    uint32_t kind; /* 1 dispatch, 2 replay, 100 continue call, 101 pass_count call */
    uint32_t operation;
    uint32_t phase;
    uint32_t outcome;
    uint64_t current_pass; /* dispatch records: replay_pass */
    uint64_t total_passes;
    uint32_t end_reason;
    int32_t status;
    uint32_t payload_decline;
    uint32_t record_decline;
    uint64_t passes_run;
    uint64_t correlation_id;
    uint64_t size;
    uint32_t user_ok;
    uint32_t ctx_ok;
    uint32_t tid_ok;
    uint32_t toggles_set;
    /* memory records */
    uint64_t bytes_planned;
    uint64_t bytes_moved;
    uint64_t chunks_restored;
    uint64_t regions;
    uint32_t tier;
    uint32_t strategy;
    uint64_t source_bytes; /* agent + referenced + module variables + adopted */
} probe_event_t;

static probe_event_t events[MAX_EVENTS];
static size_t nevents;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kreplay_context_id_t replay_ctx, trace_ctx;
static char plan[64][16];
static size_t nplan;
static uint64_t max_passes = 1024;
static uint64_t app_tid;

#define MAGIC 0xa5a5000000000000ull

static const char* answer_of(uint64_t dispatch_id) {
    return dispatch_id >= 1 && dispatch_id <= nplan ? plan[dispatch_id - 1] : "opt";
}

static probe_event_t* push(uint64_t id, uint32_t kind) {
    probe_event_t* e;
    if (nevents == MAX_EVENTS) return NULL;
    e = &events[nevents++];
    memset(e, 0, sizeof *e);
    e->dispatch_id = id;
    e->kind = kind;
    return e;
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    const char* a = answer_of(info.dispatch_id);
    probe_event_t* e;
    pthread_mutex_lock(&lock);
    e = push(info.dispatch_id, 101);
    if (e) e->user_ok = user.value == (MAGIC | info.dispatch_id);
    pthread_mutex_unlock(&lock);
    if (strcmp(a, "p1") == 0) return 1;
    if (strcmp(a, "z") == 0 || strncmp(a, "ind", 3) == 0 || strncmp(a, "clr", 3) == 0 || strcmp(a, "inf") == 0)
        return 0;
    if (strcmp(a, "big") == 0) return max_passes + 1;
    if (a[0] == 'n') return strtoull(a + 1, NULL, 10);
    if (strncmp(a, "set", 3) == 0) return strtoull(a + 3, NULL, 10);
    return 1;
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t current, uint64_t total, kreplay_user_data_t user) {
    const char* a = answer_of(info.dispatch_id);
    const char* s;
    probe_event_t* e;
    pthread_mutex_lock(&lock);
    e = push(info.dispatch_id, 100);
    if (e) {
        e->current_pass = current;
        e->total_passes = total;
        e->user_ok = user.value == (MAGIC | info.dispatch_id);
    }
    pthread_mutex_unlock(&lock);
    if (strncmp(a, "ind", 3) == 0) return current < strtoull(a + 3, NULL, 10);
    if (a[0] == 'n' && (s = strchr(a, 's')) != NULL) return current < strtoull(s + 1, NULL, 10);
    if (strncmp(a, "set", 3) == 0) return 0;
    return 1;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    probe_event_t* e;
    uint64_t id;
    (void)data;
    pthread_mutex_lock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG || record.operation == KREPLAY_KERNEL_REPLAY_PASS) {
        kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
        const char* a;
        id = p->dispatch_info.dispatch_id;
        a = answer_of(id);
        e = push(id, 2);
        if (!e) goto out;
        e->size = p->size;
        e->current_pass = p->current_pass;
        e->total_passes = p->total_passes;
        e->outcome = p->outcome;
        e->end_reason = p->end_reason;
        e->status = p->status;
        e->payload_decline = p->decline_reason;
        e->passes_run = p->passes_run;
        e->toggles_set = (p->replay_start_context != NULL) + (p->replay_stop_context != NULL);
        if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            user->value = MAGIC | id;
            if (strcmp(a, "opt") != 0) p->replay_pass_count = pass_count;
            if (strchr(a, 's') && a[0] == 'n') p->replay_continue = keep_going;
            if (strncmp(a, "ind", 3) == 0 || strncmp(a, "clr", 3) == 0 || strcmp(a, "inf") == 0)
                p->replay_continue = keep_going;
        }
        if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
            if (strncmp(a, "clr", 3) == 0 && p->current_pass == strtoull(a + 3, NULL, 10)) p->replay_continue = NULL;
            if (strncmp(a, "set", 3) == 0) {
                const char* k = strchr(a, 'k');
                if (p->current_pass == (k ? strtoull(k + 1, NULL, 10) : 0)) p->replay_continue = keep_going;
            }
        }
    } else {
        kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        id = m->dispatch_info.dispatch_id;
        e = push(id, 2);
        if (!e) goto out;
        e->size = m->size;
        e->current_pass = m->current_pass;
        e->status = m->status;
        e->payload_decline = m->decline_reason;
        e->outcome = m->unverified; /* memory records: whether the restore was unverified */
        e->bytes_planned = m->bytes_planned;
        e->bytes_moved = m->bytes_moved;
        e->chunks_restored = m->chunks_restored;
        e->regions = m->regions;
        e->tier = m->tier;
        e->strategy = m->strategy;
        e->source_bytes = m->agent_bytes + m->referenced_bytes + m->module_variable_bytes + m->adopted_bytes;
    }
    e->operation = record.operation;
    e->phase = record.phase;
    e->record_decline = record.decline_reason;
    e->correlation_id = record.correlation_id;
    e->user_ok = user->value == (MAGIC | id);
    e->ctx_ok = record.context_id.handle == replay_ctx.handle;
    e->tid_ok = record.thread_id == app_tid;
out:
    pthread_mutex_unlock(&lock);
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    probe_event_t* e;
    (void)user;
    (void)data;
    pthread_mutex_lock(&lock);
    e = push(p->dispatch_info.dispatch_id, 1);
    if (e) {
        e->operation = record.operation;
        e->phase = record.phase;
        e->current_pass = p->replay_pass;
        e->size = p->size;
        e->correlation_id = record.correlation_id;
        e->ctx_ok = record.context_id.handle == trace_ctx.handle;
        e->user_ok = 1;
    }
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    return kreplay_start_context(replay_ctx) || kreplay_start_context(trace_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    const char* p = getenv("PROBE_PLAN");
    (void)version;
    (void)rt;
    (void)priority;
    if (getenv("PROBE_MAX")) max_passes = strtoull(getenv("PROBE_MAX"), NULL, 10);
    while (p && *p && nplan < 64) {
        size_t n = strcspn(p, ",");
        if (n >= sizeof plan[0]) n = sizeof plan[0] - 1;
        memcpy(plan[nplan], p, n);
        plan[nplan][n] = 0;
        nplan++;
        p += n;
        if (*p == ',') p++;
    }
    client_id->name = "probe-contract";
    return &result;
}

/* Called by the harness on the application thread before it dispatches. */
void probe_set_app_thread(void) { app_tid = (uint64_t)syscall(SYS_gettid); }
size_t probe_event_count(void) { return nevents; }
const probe_event_t* probe_events(void) { return events; }
const char* probe_report(void) { return ""; }
