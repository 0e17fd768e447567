/*
 * The order and thread of a dispatch's records as a tool sees them under contention
 * (docs/abi.md §2 and kreplay.h "Threads"): every record of every dispatch is logged, and at the
 * end each dispatch's log is held against the documented flow:
 *   not replayed (replay_pass NONE): ENQUEUE ENTER, ENQUEUE EXIT, then COMPLETE (and the
 *     counters, when counting), each once; COMPLETE on a thread of kreplay's own, never the one
 *     that ran ENQUEUE;
 *   replayed: for every pass PASS ENTER, ENQUEUE ENTER, ENQUEUE EXIT, COMPLETE (and the pass's
 *     counters after ENQUEUE EXIT), PASS EXIT, all on the submitting thread.
 * The tool is slow where the environment says:
 *   PROBE_EXIT_WAIT=signal  ENQUEUE EXIT of a dispatch run once waits (at most 2 s) until the
 *                           application's completion signal of that dispatch reached 0 (through
 *                           the child's `probe_set_app_wait` hook; the dispatch is named by its
 *                           grid size), so its kernel surely finished before ENQUEUE EXIT returned;
 *   PROBE_EXIT_WAIT=complete  ENQUEUE EXIT waits (at most 300 ms) for that dispatch's COMPLETE,
 *                           which must not come while it waits;
 *   PROBE_EXIT_WAIT=cancel  ENQUEUE EXIT of the first dispatch waits for its signal as for
 *                           "signal", then (at most 5 s) until the child cancelled the
 *                           submitting thread (`probe_cancel_sent`), then reaches a cancellation
 *                           point (usleep), as a tool's printf would;
 *   PROBE_SLOW_MS=n         every callback sleeps n ms.
 * PROBE_REPLAY: absent, no KERNEL_REPLAY service; "opt" the tool owns it and opts out of the
 * application's dispatches (they run once); a number N, the application's dispatches are
 * replayed in N passes. PROBE_SUBMIT=1: from the COMPLETE callback of the first two application
 * dispatches run once, the tool submits a dispatch of its own (through the child's
 * `probe_set_submit` hook) and waits for it (5 s); it asks 3 passes for it, which must be run
 * (kreplay.h: only a callback's dispatch on the agent being replayed is declined
 * reentrant_dispatch; a COMPLETE callback is no replay callback). PROBE_COUNT=1 also counts one
 * counter of every dispatch.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_IDS 4096
#define LOG_LEN 96

typedef int (*submit_fn)(uint64_t agent, uint32_t timeout_ms);
typedef int (*app_wait_fn)(uint32_t grid, uint32_t timeout_ms);

static submit_fn submit;
static app_wait_fn app_wait;
static uint64_t own_kernel;

static kreplay_context_id_t trace_ctx, replay_ctx, count_ctx;
static kreplay_counter_config_id_t config;
static atomic_int config_tried;
static const char* exit_wait;
static int slow_ms;
static int replay_passes = -1; /* -1: no service; 0: opt out; N: N passes */
static int submit_in_complete;
static int counting;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
/* Per dispatch id: its records in order, one letter each (E enqueue enter, X enqueue exit,
 * C complete, N counters, P pass enter, Q pass exit, F config exit), each followed by the pass
 * digit ('-' for none). */
static char logs[MAX_IDS][LOG_LEN];
static int log_used[MAX_IDS];
static uint64_t enqueue_tid[MAX_IDS];
static int is_own[MAX_IDS];
static atomic_int wrong_thread, overflow, in_exit[MAX_IDS], complete_during_exit;
static atomic_int forced_early, exit_wait_failed;
static atomic_int own_submitted, own_in_time, own_timeouts, own_errors, own_not_replayed;
static char own_problem[256];

void probe_set_submit(submit_fn f, uint64_t kernel) {
    submit = f;
    own_kernel = kernel;
}

void probe_set_app_wait(app_wait_fn f) { app_wait = f; }

static atomic_int cancel_sent, cancel_exits;

void probe_cancel_sent(void) { atomic_store(&cancel_sent, 1); }

static void nap(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    if (ms > 0) nanosleep(&t, NULL);
}

static void note(uint64_t id, char what, uint64_t pass) {
    int at;
    if (id >= MAX_IDS) {
        atomic_fetch_add(&overflow, 1);
        return;
    }
    pthread_mutex_lock(&log_lock);
    at = log_used[id];
    if (at + 2 < LOG_LEN) {
        logs[id][at] = what;
        logs[id][at + 1] = pass == KREPLAY_REPLAY_PASS_NONE ? '-' : (char)('0' + (pass % 10));
        log_used[id] = at + 2;
    } else {
        atomic_fetch_add(&overflow, 1);
    }
    pthread_mutex_unlock(&log_lock);
}

static uint64_t passes(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)user;
    if (info.kernel_id == own_kernel) return 3;
    return (uint64_t)replay_passes;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    int own = p->dispatch_info.kernel_id == own_kernel;
    (void)user;
    (void)data;
    nap(slow_ms);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        if (id < MAX_IDS) is_own[id] = own;
        if (own || replay_passes > 0) p->replay_pass_count = passes;
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        note(id, 'F', KREPLAY_REPLAY_PASS_NONE);
        if (own && (p->outcome != KREPLAY_REPLAY_OUTCOME_REPLAYED || p->passes_run != 3)) {
            atomic_fetch_add(&own_not_replayed, 1);
            snprintf(own_problem, sizeof own_problem, "outcome %u, decline '%s', %llu pass(es) run", p->outcome,
                     kreplay_get_decline_reason_string(record.decline_reason), (unsigned long long)p->passes_run);
        }
    } else if (record.operation == KREPLAY_KERNEL_REPLAY_PASS) {
        note(id, record.phase == KREPLAY_CALLBACK_PHASE_ENTER ? 'P' : 'Q', p->current_pass);
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    uint64_t pass = p->replay_pass;
    int own = p->dispatch_info.kernel_id == own_kernel;
    (void)user;
    (void)data;
    nap(slow_ms);
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE) {
        note(id, record.phase == KREPLAY_CALLBACK_PHASE_ENTER ? 'E' : 'X', pass);
        if (id < MAX_IDS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) enqueue_tid[id] = record.thread_id;
        if (id < MAX_IDS && record.phase == KREPLAY_CALLBACK_PHASE_EXIT && record.thread_id != enqueue_tid[id])
            atomic_fetch_add(&wrong_thread, 1);
        if (record.phase == KREPLAY_CALLBACK_PHASE_EXIT && pass == KREPLAY_REPLAY_PASS_NONE && !own && exit_wait &&
            id < MAX_IDS) {
            atomic_store(&in_exit[id], 1);
            if ((strcmp(exit_wait, "signal") == 0 || strcmp(exit_wait, "cancel") == 0) && app_wait) {
                if (app_wait(p->dispatch_info.grid_size.x, 2000) == 0)
                    atomic_fetch_add(&forced_early, 1);
                else
                    atomic_fetch_add(&exit_wait_failed, 1);
                if (strcmp(exit_wait, "cancel") == 0 && atomic_fetch_add(&cancel_exits, 1) == 0) {
                    int i;
                    for (i = 0; i < 5000 && !atomic_load(&cancel_sent); i++) nap(1);
                    usleep(1);
                }
            } else if (strcmp(exit_wait, "complete") == 0) {
                int i;
                for (i = 0; i < 300; i++) nap(1);
            }
            atomic_store(&in_exit[id], 0);
        }
        return;
    }
    if (record.operation != KREPLAY_KERNEL_DISPATCH_COMPLETE) return;
    if (id < MAX_IDS && atomic_load(&in_exit[id])) atomic_fetch_add(&complete_during_exit, 1);
    note(id, 'C', pass);
    if (id < MAX_IDS) {
        int on_enqueue_thread = record.thread_id == enqueue_tid[id];
        /* Run once: a thread of kreplay's own; a pass: the submitting thread. */
        if ((pass == KREPLAY_REPLAY_PASS_NONE) == on_enqueue_thread) atomic_fetch_add(&wrong_thread, 1);
    }
    if (own || pass != KREPLAY_REPLAY_PASS_NONE || !submit_in_complete || !submit) return;
    if (atomic_fetch_add(&own_submitted, 1) >= 2) return;
    {
        int rc = submit(p->dispatch_info.agent_id.handle, 5000);
        if (rc == 0)
            atomic_fetch_add(&own_in_time, 1);
        else if (rc == 1)
            atomic_fetch_add(&own_timeouts, 1);
        else
            atomic_fetch_add(&own_errors, 1);
    }
}

static kreplay_status_t first_counter(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                                      void* ud) {
    (void)ud;
    if (n > 0 && kreplay_create_counter_config(agent, &c[0].id, 1, &config) != KREPLAY_STATUS_SUCCESS)
        config.handle = 0;
    return KREPLAY_STATUS_SUCCESS;
}

static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* out, void* data) {
    (void)pass;
    (void)data;
    pthread_mutex_lock(&config_lock);
    if (!atomic_load(&config_tried)) {
        kreplay_iterate_agent_counters(info.agent_id, first_counter, NULL);
        atomic_store(&config_tried, 1);
    }
    pthread_mutex_unlock(&config_lock);
    *out = config;
}

static void counted(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n, void* data) {
    (void)data;
    nap(slow_ms);
    if (n == 0) return;
    note(info.dispatch_id, 'N', r[0].replay_pass);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&trace_ctx)) return 1;
    if (kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    if (replay_passes >= 0) {
        if (kreplay_create_context(&replay_ctx)) return 1;
        if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                       on_replay, NULL))
            return 1;
        if (kreplay_start_context(replay_ctx)) return 1;
    }
    if (counting) {
        if (kreplay_create_context(&count_ctx)) return 1;
        if (kreplay_configure_dispatch_counting_service(count_ctx, pick, counted, NULL)) return 1;
        if (kreplay_start_context(count_ctx)) return 1;
    }
    return kreplay_start_context(trace_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    const char* r = getenv("PROBE_REPLAY");
    (void)version;
    (void)rt;
    (void)priority;
    exit_wait = getenv("PROBE_EXIT_WAIT");
    slow_ms = getenv("PROBE_SLOW_MS") ? atoi(getenv("PROBE_SLOW_MS")) : 0;
    if (r) replay_passes = strcmp(r, "opt") == 0 ? 0 : atoi(r);
    submit_in_complete = getenv("PROBE_SUBMIT") != NULL;
    counting = getenv("PROBE_COUNT") != NULL;
    client_id->name = "probe-enqueue-gate";
    return &result;
}

/* Whether `log` (pairs of letter and pass) is the documented flow of a dispatch. */
static int flow_ok(const char* log, int used, int replayed_passes, char* why, size_t n) {
    int i = 0, pass;
    /* CONFIG EXIT, when a replay service is configured, comes first for a dispatch run once and
     * last for a replayed one; it is checked apart. */
    char stripped[LOG_LEN];
    int s = 0;
    for (i = 0; i < used; i += 2)
        if (log[i] != 'F') {
            stripped[s++] = log[i];
            stripped[s++] = log[i + 1];
        }
    stripped[s] = 0;
    if (replayed_passes == 0) {
        /* E- X- then C- and, when counting, N- in either order. */
        int want = counting ? 8 : 6;
        if (s != want || strncmp(stripped, "E-X-", 4) != 0) goto bad;
        if (counting ? !((strcmp(stripped + 4, "C-N-") == 0) || (strcmp(stripped + 4, "N-C-") == 0))
                     : strcmp(stripped + 4, "C-") != 0)
            goto bad;
        return 1;
    }
    i = 0;
    for (pass = 0; pass < replayed_passes; pass++) {
        char d = (char)('0' + pass % 10);
        char want[16];
        if (counting)
            snprintf(want, sizeof want, "P%cE%cX%cN%cC%cQ%c", d, d, d, d, d, d);
        else
            snprintf(want, sizeof want, "P%cE%cX%cC%cQ%c", d, d, d, d, d);
        if (strncmp(stripped + i, want, strlen(want)) != 0) goto bad;
        i += (int)strlen(want);
    }
    if (i != s) goto bad;
    return 1;
bad:
    snprintf(why, n, "%s", stripped);
    return 0;
}

const char* probe_report(void) {
    static char report[4096];
    size_t used = 0;
    uint64_t id;
    int bad = 0, seen = 0;
    report[0] = 0;
    for (id = 0; id < MAX_IDS; id++) {
        char why[LOG_LEN + 1];
        int n = log_used[id];
        int app_passes;
        if (n == 0) continue;
        seen++;
        app_passes = is_own[id] ? 3 : (replay_passes > 1 ? replay_passes : 0);
        if (!flow_ok(logs[id], n, app_passes, why, sizeof why)) {
            if (bad++ < 6 && used < sizeof report - 200) {
                snprintf(report + used, sizeof report - used, "dispatch %llu%s: records %s; ", (unsigned long long)id,
                         is_own[id] ? " (the tool's own)" : "", why);
                used = strlen(report);
            }
        }
    }
    if (bad) {
        snprintf(report + used, sizeof report - used, "%d of %d dispatch(es) out of the documented order; ", bad,
                 seen);
        used = strlen(report);
    }
    if (seen == 0) {
        snprintf(report + used, sizeof report - used, "no dispatch records at all; ");
        used = strlen(report);
    }
    if (atomic_load(&wrong_thread)) {
        snprintf(report + used, sizeof report - used,
                 "%d record(s) on the wrong thread (ENQUEUE EXIT not on ENTER's thread, a pass's COMPLETE not on "
                 "the submitting thread, or a COMPLETE of a dispatch run once on it); ",
                 atomic_load(&wrong_thread));
        used = strlen(report);
    }
    if (atomic_load(&complete_during_exit)) {
        snprintf(report + used, sizeof report - used, "%d COMPLETE(s) while their ENQUEUE EXIT ran; ",
                 atomic_load(&complete_during_exit));
        used = strlen(report);
    }
    if (atomic_load(&overflow)) {
        snprintf(report + used, sizeof report - used, "log overflow (%d); ", atomic_load(&overflow));
        used = strlen(report);
    }
    if (exit_wait && strcmp(exit_wait, "cancel") == 0 && !atomic_load(&cancel_sent)) {
        snprintf(report + used, sizeof report - used, "the submitting thread was never cancelled; ");
        used = strlen(report);
    }
    if (exit_wait && strcmp(exit_wait, "complete") != 0 &&
        (atomic_load(&exit_wait_failed) || !atomic_load(&forced_early))) {
        snprintf(report + used, sizeof report - used,
                 "ENQUEUE EXIT waited for the application's signal: reached 0 %d time(s), not within 2 s %d "
                 "time(s); ",
                 atomic_load(&forced_early), atomic_load(&exit_wait_failed));
        used = strlen(report);
    }
    if (submit_in_complete &&
        (atomic_load(&own_in_time) != 2 || atomic_load(&own_not_replayed) || atomic_load(&own_errors))) {
        snprintf(report + used, sizeof report - used,
                 "of the tool's dispatches submitted from COMPLETE: %d completed in time, %d timed out, %d could not "
                 "be submitted, %d not replayed in 3 passes (%s); ",
                 atomic_load(&own_in_time), atomic_load(&own_timeouts), atomic_load(&own_errors),
                 atomic_load(&own_not_replayed), own_problem);
        used = strlen(report);
    }
    return report;
}
