/*
 * A profiler whose replays of dispatches on two agents overlap: the application submits from one
 * thread per agent, and the first PASS ENTER on each agent waits (bounded) until the other agent's
 * replay has reached its PASS ENTER too, so both pass loops run at the same time. Each dispatch
 * gets its own pass count (2 + id % 3) and its own user_data; a dispatch tracing context takes
 * part only in pass k = id % N of each dispatch (masked off at PASS ENTER 0 unless k is 0,
 * unmasked at PASS ENTER k, masked again at PASS ENTER k + 1). The tool checks that
 *   - both replays really overlapped (neither waited in vain for the other),
 *   - every replayed dispatch ran its own N passes and its user_data came back in every callback,
 *   - the tracing context got exactly one ENQUEUE ENTER, one ENQUEUE EXIT (same user_data) and
 *     one COMPLETE per replayed dispatch, all in pass k of that dispatch, nothing from other passes.
 * PROBE_MODE=count: a dispatch counting context is masked like the tracing context; its callbacks
 * and records must come in pass k of each dispatch only, with that dispatch's id and agent.
 * PROBE_MODE=same_agent: as mask, for two application threads on one agent (their replays take
 * turns; nothing waits for the other).
 * PROBE_MODE=stop_other: PASS ENTER of every replayed pass additionally stops and restarts (through
 * kreplay_stop_context / kreplay_start_context) a second, never-masked tracing context whose records
 * are only counted: the other agent's replay may or may not see it, but nothing may break.
 */
#include "kreplay.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DISPATCH 256
#define MAGIC 0x5eed000000000000ull

static const char* mode;
static kreplay_context_id_t replay_ctx, trace_ctx, other_ctx, count_ctx;
/* PROBE_MODE=count: a dispatch counting context masked like the tracing context */
static struct {
    uint64_t agent;
    kreplay_counter_config_id_t config;
} configs[2];
static atomic_int count_records[MAX_DISPATCH], count_wrong[MAX_DISPATCH];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static uint64_t waiting_agent; /* the agent whose first PASS ENTER waits for the other's */
static int met;                /* both agents' replays reached PASS ENTER together */
static int agents_seen;
static uint64_t first_agents[2];
static char report[4096];

static atomic_int enter_n[MAX_DISPATCH], exit_n[MAX_DISPATCH], complete_n[MAX_DISPATCH], wrong_pass[MAX_DISPATCH];
static atomic_int passes_seen[MAX_DISPATCH], passes_run[MAX_DISPATCH], replayed[MAX_DISPATCH];
static atomic_int bad_user_data, unpaired, toggles_failed, other_records, replays;

static void problem(const char* fmt, long long a, long long b) {
    size_t len;
    pthread_mutex_lock(&lock);
    len = strlen(report);
    if (len + 200 < sizeof report) {
        snprintf(report + len, sizeof report - len, fmt, a, b);
        strcat(report, "; ");
    }
    pthread_mutex_unlock(&lock);
}

static uint64_t passes_of(uint64_t id) { return 2 + id % 3; }
static uint64_t traced_pass(uint64_t id) { return id % passes_of(id); }

/* The first PASS ENTER on each of two agents waits for the other's: at most 30 s. */
static void meet(uint64_t agent) {
    struct timespec until;
    int i, first = 0;
    pthread_mutex_lock(&lock);
    for (i = 0; i < agents_seen; i++)
        if (first_agents[i] == agent) {
            pthread_mutex_unlock(&lock);
            return;
        }
    if (agents_seen < 2) {
        first_agents[agents_seen++] = agent;
        first = 1;
    }
    if (!first) {
        pthread_mutex_unlock(&lock);
        return;
    }
    if (agents_seen == 1) {
        waiting_agent = agent;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30;
        while (!met)
            if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT) break;
        if (!met) {
            pthread_mutex_unlock(&lock);
            problem("the replay on agent %lld waited 30 s in PASS ENTER for a replay on another agent to "
                    "start its passes: replays on different agents did not run at the same time%.0lld",
                    (long long)agent, 0);
            return;
        }
    } else {
        met = 1;
        pthread_cond_broadcast(&cond);
    }
    pthread_mutex_unlock(&lock);
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    if (user.value != (MAGIC | info.dispatch_id)) atomic_fetch_add(&bad_user_data, 1);
    return passes_of(info.dispatch_id);
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    uint64_t id;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT || record.operation == KREPLAY_KERNEL_REPLAY_RESTORE) {
        const kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
        if (user->value != (MAGIC | m->dispatch_info.dispatch_id)) atomic_fetch_add(&bad_user_data, 1);
        return;
    }
    id = p->dispatch_info.dispatch_id;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        user->value = MAGIC | id;
        p->replay_pass_count = pass_count;
        return;
    }
    if (user->value != (MAGIC | id)) atomic_fetch_add(&bad_user_data, 1);
    if (id >= MAX_DISPATCH) return;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) {
        if (p->outcome == KREPLAY_REPLAY_OUTCOME_REPLAYED) {
            atomic_store(&replayed[id], 1);
            atomic_store(&passes_run[id], (int)p->passes_run);
            atomic_fetch_add(&replays, 1);
        } else {
            problem("dispatch %lld was not replayed (outcome %lld)", (long long)id, (long long)p->outcome);
        }
        return;
    }
    if (record.operation != KREPLAY_KERNEL_REPLAY_PASS || record.phase != KREPLAY_CALLBACK_PHASE_ENTER) return;
    atomic_fetch_add(&passes_seen[id], 1);
    if (p->total_passes != passes_of(id))
        problem("dispatch %lld: total_passes %lld", (long long)id, (long long)p->total_passes);
    {
        uint64_t k = traced_pass(id), cur = p->current_pass;
        kreplay_status_t s = KREPLAY_STATUS_SUCCESS;
        int counting = strcmp(mode, "count") == 0;
        if (cur == 0 && k != 0) s = p->replay_stop_context(trace_ctx) | (counting ? p->replay_stop_context(count_ctx) : 0);
        if (cur == k && k != 0) s = p->replay_start_context(trace_ctx) | (counting ? p->replay_start_context(count_ctx) : 0);
        if (cur == k + 1) s = p->replay_stop_context(trace_ctx) | (counting ? p->replay_stop_context(count_ctx) : 0);
        if (s != KREPLAY_STATUS_SUCCESS) atomic_fetch_add(&toggles_failed, 1);
    }
    if (strcmp(mode, "stop_other") == 0) {
        if (kreplay_stop_context(other_ctx) != KREPLAY_STATUS_SUCCESS ||
            kreplay_start_context(other_ctx) != KREPLAY_STATUS_SUCCESS)
            atomic_fetch_add(&toggles_failed, 1);
    }
    if (p->current_pass == 0 && strcmp(mode, "same_agent") != 0) meet(p->dispatch_info.agent_id.handle);
}

static void on_trace(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    uint64_t id = p->dispatch_info.dispatch_id;
    (void)data;
    if (id >= MAX_DISPATCH) return;
    if (p->replay_pass == KREPLAY_REPLAY_PASS_NONE) return; /* checked at the end: all are replayed */
    if (p->replay_pass != traced_pass(id)) {
        atomic_fetch_add(&wrong_pass[id], 1);
        return;
    }
    if (record.operation == KREPLAY_KERNEL_DISPATCH_ENQUEUE) {
        if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            atomic_fetch_add(&enter_n[id], 1);
            user->value = MAGIC | record.correlation_id;
        } else {
            atomic_fetch_add(&exit_n[id], 1);
            if (user->value != (MAGIC | record.correlation_id)) atomic_fetch_add(&unpaired, 1);
        }
    } else if (record.operation == KREPLAY_KERNEL_DISPATCH_COMPLETE) {
        atomic_fetch_add(&complete_n[id], 1);
    }
}

static void on_other(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)record;
    (void)user;
    (void)data;
    atomic_fetch_add(&other_records, 1);
}

static kreplay_status_t first_counter(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                                      void* ud) {
    kreplay_counter_config_id_t* out = ud;
    if (n > 0) kreplay_create_counter_config(agent, &c[0].id, 1, out);
    return KREPLAY_STATUS_SUCCESS;
}

/* The configuration of `agent`, created the first time (under the lock). */
static kreplay_counter_config_id_t config_of(uint64_t agent) {
    kreplay_counter_config_id_t none = {0};
    int i;
    pthread_mutex_lock(&lock);
    for (i = 0; i < 2; i++) {
        if (configs[i].agent == agent) break;
        if (configs[i].agent == 0) {
            kreplay_agent_id_t a = {agent};
            configs[i].agent = agent;
            kreplay_iterate_agent_counters(a, first_counter, &configs[i].config);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return i < 2 ? configs[i].config : none;
}

static void pick(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* out, void* data) {
    (void)data;
    if (info.dispatch_id < MAX_DISPATCH && pass != traced_pass(info.dispatch_id))
        atomic_fetch_add(&count_wrong[info.dispatch_id], 1);
    *out = config_of(info.agent_id.handle);
}

static void records_cb(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n, void* data) {
    size_t i;
    (void)data;
    for (i = 0; i < n; i++) {
        uint64_t id = r[i].dispatch_id;
        if (id >= MAX_DISPATCH) continue;
        if (id != info.dispatch_id || r[i].replay_pass != traced_pass(id) ||
            r[i].agent_id.handle != info.agent_id.handle)
            atomic_fetch_add(&count_wrong[id], 1);
        else
            atomic_fetch_add(&count_records[id], 1);
    }
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    const uint32_t ops[] = {KREPLAY_KERNEL_DISPATCH_ENQUEUE, KREPLAY_KERNEL_DISPATCH_COMPLETE};
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&replay_ctx) || kreplay_create_context(&trace_ctx) ||
        kreplay_create_context(&other_ctx))
        return 1;
    if (kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL) ||
        kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, ops, 2,
                                                   on_trace, NULL) ||
        kreplay_configure_callback_tracing_service(other_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_other, NULL))
        return 1;
    if (strcmp(mode, "count") == 0 &&
        (kreplay_create_context(&count_ctx) ||
         kreplay_configure_dispatch_counting_service(count_ctx, pick, records_cb, NULL) ||
         kreplay_start_context(count_ctx)))
        return 1;
    return kreplay_start_context(replay_ctx) || kreplay_start_context(trace_ctx) || kreplay_start_context(other_ctx);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    mode = getenv("PROBE_MODE") ? getenv("PROBE_MODE") : "mask";
    client_id->name = "probe-overlap";
    return &result;
}

const char* probe_report(void) {
    int id;
    if (!met && strcmp(mode, "same_agent") != 0) problem("the replays on two agents never overlapped (%lld agents replayed)%.0lld", agents_seen, 0);
    if (atomic_load(&replays) == 0) problem("nothing was replayed%.0lld%.0lld", 0, 0);
    if (atomic_load(&bad_user_data)) problem("%lld callback(s) saw another dispatch's user_data%.0lld", atomic_load(&bad_user_data), 0);
    if (atomic_load(&unpaired)) problem("%lld ENQUEUE EXIT(s) without their ENTER's user_data%.0lld", atomic_load(&unpaired), 0);
    if (atomic_load(&toggles_failed)) problem("%lld context toggle(s) failed%.0lld", atomic_load(&toggles_failed), 0);
    for (id = 0; id < MAX_DISPATCH; id++) {
        if (!atomic_load(&replayed[id])) continue;
        if (atomic_load(&passes_run[id]) != (int)passes_of(id) || atomic_load(&passes_seen[id]) != (int)passes_of(id))
            problem("dispatch %lld: passes run/seen wrong (want %lld)", id, (long long)passes_of(id));
        if (atomic_load(&wrong_pass[id]))
            problem("dispatch %lld: %lld tracing record(s) of a pass its context was masked off in", id,
                    atomic_load(&wrong_pass[id]));
        if (strcmp(mode, "count") == 0 && (atomic_load(&count_wrong[id]) || atomic_load(&count_records[id]) != 1))
            problem("dispatch %lld: counting callbacks or records outside its counted pass %lld (or not exactly one record in it)", id,
                    atomic_load(&count_wrong[id]));
        if (atomic_load(&enter_n[id]) != 1 || atomic_load(&exit_n[id]) != 1 || atomic_load(&complete_n[id]) != 1)
            problem("dispatch %lld: tracing records in its traced pass: ENTER/EXIT/COMPLETE = %lld (x100/x10/x1), want 111", id,
                    atomic_load(&enter_n[id]) * 100 + atomic_load(&exit_n[id]) * 10 + atomic_load(&complete_n[id]));
    }
    return report;
}
