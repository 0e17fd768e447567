/*
 * A careless tool calling the whole C interface at random, with random arguments, from
 * everywhere it can: every callback kreplay makes (each KERNEL_REPLAY operation and phase, the
 * pass-count and continue callbacks, KERNEL_DISPATCH ENQUEUE and COMPLETE, the dispatch
 * counting callbacks), a thread of its own running beside the replays, a thread spawned
 * during PASS ENTER, and its finalize. Choices come from a seeded splitmix64 stream
 * (PROBE_SEED, default below); whatever the interleaving, each call's expected status follows
 * from its own arguments and the documented rules (kreplay.h, docs/abi.md), and that exact
 * status is asserted, as are the values written through out-pointers. Misaligned pointers and
 * counts no array can have are among the arguments.
 *
 * Contexts: the replay, dispatch tracing and counting contexts (started, with services);
 * `on` (started, never stopped by a random call), `off` (never started), `churn` (started and
 * stopped at random); garbage handles kreplay never returned.
 */
#include "kreplay.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS_PER_CALLBACK 8
#define MAX_CONFIGS 64
#define BACKGROUND_MAX_CALLS 200000

static uint64_t seed = 0x5eed0a61c0ffeeULL;
static atomic_ullong draws;

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t draw(void) { return mix(seed ^ mix(atomic_fetch_add(&draws, 1))); }
static uint64_t below(uint64_t n) { return draw() % n; }

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[8192];
static int problems;

static void problem(const char* where, const char* fmt, long long a, long long b) {
    size_t len;
    pthread_mutex_lock(&lock);
    problems++;
    len = strlen(report);
    if (problems <= 20 && len + 300 <= sizeof report) {
        snprintf(report + len, sizeof report - len, "[%s] ", where);
        len = strlen(report);
        snprintf(report + len, sizeof report - len, fmt, a, b);
        strcat(report, "; ");
    }
    pthread_mutex_unlock(&lock);
}

/* Where a random call runs: what the rules expect depends on it. */
enum where {
    IN_CALLBACK,   /* a callback, not PASS ENTER, or PASS ENTER on another thread */
    IN_PASS_ENTER, /* PASS ENTER, on the thread it is delivered on */
    BACKGROUND,    /* the tool's own thread: its finalize may begin at any moment */
    IN_FINALIZE    /* the tool's finalize: its contexts are stopped for good */
};
static const char* where_name[] = {"callback", "PASS ENTER", "background", "finalize"};

static kreplay_context_id_t replay_ctx, trace_ctx, count_ctx, on_ctx[2], off_ctx[2], churn_ctx[2];
static atomic_ullong agent_handle;
static atomic_ullong counter_count;
static atomic_ullong configs[MAX_CONFIGS];
static atomic_uint config_count;
static _Atomic(kreplay_context_toggle_cb_t) saved_start, saved_stop;
static atomic_ullong calls, toggles_ok, toggles_refused, counters_ok;
static atomic_int stop_background, background_started;
static pthread_t background;

static void expect(enum where w, const char* what, kreplay_status_t got, kreplay_status_t want) {
    atomic_fetch_add(&calls, 1);
    if (got != want) {
        char fmt[200];
        snprintf(fmt, sizeof fmt, "%s returned %%lld, expected %%lld", what);
        problem(where_name[w], fmt, got, want);
    }
}

/* Either status is right (what the call meets depends on timing the tool does not control). */
static void expect2(enum where w, const char* what, kreplay_status_t got, kreplay_status_t a,
                    kreplay_status_t b) {
    if (got == b) {
        atomic_fetch_add(&calls, 1);
        return;
    }
    expect(w, what, got, a);
}

/* Whether the tool's finalize may have begun: on its own thread, and in a callback of a
 * dispatch that completes on kreplay's thread while the runtime shuts down (the application's
 * completion does not wait for that callback). PASS ENTER runs on the application's thread,
 * before shutdown. */
static int may_be_finalizing(enum where w) { return w == BACKGROUND || w == IN_CALLBACK; }

static kreplay_context_id_t garbage(void) {
    static const uint64_t fixed[] = {0, UINT64_MAX, 0xdeadbeefULL | (1ULL << 63)};
    kreplay_context_id_t c;
    c.handle = below(2) ? fixed[below(3)] : (draw() | (1ULL << 63));
    return c;
}

/* Byte buffers of this thread for misaligned objects: odd(n) is one byte past a 16-byte
 * boundary. */
static _Thread_local unsigned char raw[64 * 32] __attribute__((aligned(16)));
static void* odd(size_t n) { return raw + n * 64 + 1; }

static const kreplay_status_t returnable[] = {KREPLAY_STATUS_SUCCESS, KREPLAY_STATUS_ERROR,
                                              KREPLAY_STATUS_ERROR_OUT_OF_RESOURCES, 12345, -7};
static _Thread_local kreplay_status_t iterate_answer;
static _Thread_local size_t iterated;

static kreplay_status_t on_counters(kreplay_agent_id_t agent, const kreplay_counter_info_t* c,
                                    size_t n, void* ud) {
    size_t i;
    (void)agent;
    (void)ud;
    iterated = n;
    for (i = 0; i < n; i++)
        if (c[i].id.handle != i + 1 || c[i].name == NULL || c[i].size != sizeof(kreplay_counter_info_t))
            problem("iterate", "counter %lld has handle %lld", (long long)i, (long long)c[i].id.handle);
    return iterate_answer;
}

static void random_call(enum where w);

/* The counter functions (need the agent and its catalogue). */
static void counter_call(enum where w) {
    kreplay_agent_id_t agent = {atomic_load(&agent_handle)};
    kreplay_agent_id_t bad = {agent.handle ^ (1ULL << 62)};
    uint64_t n = atomic_load(&counter_count);
    kreplay_counter_id_t ids[4];
    kreplay_counter_config_id_t config = {0};
    uint64_t passes = 99;
    uint32_t pass_of[4];
    kreplay_status_t s;
    size_t count = 1 + below(4), i;
    if (agent.handle == 0 || n == 0) return;
    for (i = 0; i < 4; i++) ids[i].handle = 1 + below(n);
    switch (below(12)) {
    case 0:
        expect(w, "iterate_agent_counters(NULL callback)", kreplay_iterate_agent_counters(agent, NULL, NULL),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 1:
        expect(w, "iterate_agent_counters(unknown agent)",
               kreplay_iterate_agent_counters(bad, on_counters, NULL), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 2:
        iterate_answer = returnable[below(5)];
        iterated = 0;
        expect(w, "iterate_agent_counters", kreplay_iterate_agent_counters(agent, on_counters, NULL),
               iterate_answer);
        if (iterated != n) problem(where_name[w], "iterate gave %lld counters, first time %lld", (long long)iterated, (long long)n);
        break;
    case 3:
        expect(w, "create_counter_config(NULL out)", kreplay_create_counter_config(agent, ids, count, NULL),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 4:
        s = below(2) ? kreplay_create_counter_config(agent, ids, 0, &config)
                     : kreplay_create_counter_config(agent, NULL, count, &config);
        expect(w, "create_counter_config(no counters)", s, KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 5:
        ids[below(count)].handle = below(2) ? 0 : n + 1 + below(1000);
        expect(w, "create_counter_config(unknown counter)", kreplay_create_counter_config(agent, ids, count, &config),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 6:
        expect(w, "create_counter_config(unknown agent)", kreplay_create_counter_config(bad, ids, count, &config),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 7: {
        static const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 16 + 1};
        size_t h = huge[below(3)];
        s = below(2) ? kreplay_create_counter_config(agent, ids, h, &config)
                     : kreplay_plan_counter_passes(agent, ids, h, NULL, &passes);
        expect(w, "a counter function with a count no array can have", s, KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    }
    case 8: {
        /* A valid configuration, through aligned or misaligned pointers. */
        kreplay_counter_config_id_t* out = below(2) ? &config : (kreplay_counter_config_id_t*)odd(0);
        kreplay_counter_id_t* in = ids;
        if (below(2)) {
            in = (kreplay_counter_id_t*)odd(2);
            memcpy((unsigned char*)in, ids, sizeof ids);
        }
        s = kreplay_create_counter_config(agent, in, 1, out);
        /* Once the runtime has shut down (hsa_shut_down runs before the tool's finalize), its
         * agent is unknown: a clear INVALID_ARGUMENT. */
        if (may_be_finalizing(w))
            expect2(w, "create_counter_config(one known counter)", s, KREPLAY_STATUS_SUCCESS,
                    KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        else
            expect(w, "create_counter_config(one known counter)", s, KREPLAY_STATUS_SUCCESS);
        memcpy(&config, (unsigned char*)out, sizeof config);
        if (s == KREPLAY_STATUS_SUCCESS) {
            unsigned k = atomic_fetch_add(&config_count, 1);
            if (config.handle == 0) problem(where_name[w], "a configuration with handle %lld%lld", 0, 0);
            if (k < MAX_CONFIGS) atomic_store(&configs[k], config.handle);
            atomic_fetch_add(&counters_ok, 1);
        }
        break;
    }
    case 9:
        expect(w, "plan_counter_passes(NULL pass count)", kreplay_plan_counter_passes(agent, ids, count, pass_of, NULL),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    case 10:
        ids[below(count)].handle = below(2) ? 0 : n + 1 + below(1000);
        expect(w, "plan_counter_passes(unknown counter)",
               kreplay_plan_counter_passes(agent, ids, count, pass_of, &passes), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        break;
    default: {
        uint64_t* out = below(2) ? &passes : (uint64_t*)odd(4);
        uint32_t* where_of = below(3) == 0 ? NULL : (below(2) ? pass_of : (uint32_t*)odd(5));
        size_t c = below(5) == 0 ? 0 : count;
        s = kreplay_plan_counter_passes(agent, c ? ids : NULL, c, where_of, out);
        expect(w, "plan_counter_passes", s, KREPLAY_STATUS_SUCCESS);
        memcpy(&passes, (unsigned char*)out, sizeof passes);
        if (s == KREPLAY_STATUS_SUCCESS && ((c == 0) != (passes == 0) || passes > c))
            problem(where_name[w], "plan_counter_passes planned %lld passes for %lld counters", (long long)passes, (long long)c);
        if (s == KREPLAY_STATUS_SUCCESS) atomic_fetch_add(&counters_ok, 1);
        break;
    }
    }
}

static kreplay_tool_configure_result_t* other_configure(uint32_t v, const char* r, uint32_t p,
                                                        kreplay_client_id_t* c) {
    (void)v;
    (void)r;
    (void)p;
    (void)c;
    problem("force_configure", "a configure function registered after initialization ran%lld%lld", 0, 0);
    return NULL;
}

static void dummy_record(kreplay_callback_tracing_record_t r, kreplay_user_data_t* u, void* d) {
    (void)r;
    (void)u;
    (void)d;
    problem("configure", "a service configured after initialization got a record%lld%lld", 0, 0);
}

static void toggle_call(enum where w) {
    kreplay_context_toggle_cb_t start = atomic_load(&saved_start), stop = atomic_load(&saved_stop);
    kreplay_context_toggle_cb_t t = below(2) ? start : stop;
    kreplay_context_id_t c;
    int kind = (int)below(6);
    kreplay_status_t s;
    if (t == NULL) return;
    switch (kind) {
    case 0: c = on_ctx[below(2)]; break;
    case 1: c = off_ctx[below(2)]; break;
    case 2: c = churn_ctx[below(2)]; break;
    case 3: c = below(2) ? trace_ctx : count_ctx; break;
    default: c = garbage(); break;
    }
    s = t(c);
    if (w != IN_PASS_ENTER) {
        expect(w, "a PASS ENTER toggle called elsewhere", s, KREPLAY_STATUS_ERROR_CONTEXT_ERROR);
        atomic_fetch_add(&toggles_refused, 1);
        return;
    }
    if (kind == 0 || kind == 3) {
        expect(w, "a toggle of a context started when the replay began", s, KREPLAY_STATUS_SUCCESS);
        atomic_fetch_add(&toggles_ok, 1);
    } else if (kind == 2) {
        expect2(w, "a toggle of a churned context", s, KREPLAY_STATUS_SUCCESS, KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED);
    } else {
        expect(w, "a toggle of a context not started when the replay began", s,
               KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED);
    }
}

static void random_call(enum where w) {
    kreplay_status_t s;
    int v = -5;
    kreplay_context_id_t c;
    switch (below(16)) {
    case 0:
        if (below(8) == 0) {
            kreplay_context_id_t* out = below(2) ? &c : (kreplay_context_id_t*)odd(6);
            expect(w, "create_context", kreplay_create_context(out), KREPLAY_STATUS_SUCCESS);
            memcpy(&c, (unsigned char*)out, sizeof c);
            if (c.handle == 0) problem(where_name[w], "create_context wrote handle %lld%lld", 0, 0);
        } else {
            expect(w, "create_context(NULL)", kreplay_create_context(NULL), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        }
        break;
    case 1:
        if (below(2)) {
            s = kreplay_start_context(churn_ctx[below(2)]);
            if (w == IN_FINALIZE)
                expect(w, "start_context(own context, finalized)", s, KREPLAY_STATUS_ERROR_FINALIZED);
            else if (may_be_finalizing(w))
                expect2(w, "start_context(own context)", s, KREPLAY_STATUS_SUCCESS, KREPLAY_STATUS_ERROR_FINALIZED);
            else
                expect(w, "start_context(own context)", s, KREPLAY_STATUS_SUCCESS);
        } else {
            expect(w, "start_context(garbage)", kreplay_start_context(garbage()), KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);
        }
        break;
    case 2:
        if (below(2))
            expect(w, "stop_context(own context)", kreplay_stop_context(churn_ctx[below(2)]), KREPLAY_STATUS_SUCCESS);
        else
            expect(w, "stop_context(garbage)", kreplay_stop_context(garbage()), KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);
        break;
    case 3: {
        int* out = below(2) ? &v : (int*)odd(7);
        int pick = (int)below(4);
        kreplay_context_id_t which = pick == 0 ? on_ctx[below(2)] : pick == 1 ? off_ctx[below(2)] : pick == 2 ? garbage() : churn_ctx[0];
        if (below(4) == 0) {
            expect(w, "context_is_active(NULL)", kreplay_context_is_active(which, NULL), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
            break;
        }
        memset((unsigned char*)out, 0x5a, sizeof(int));
        s = kreplay_context_is_active(which, out);
        memcpy(&v, (unsigned char*)out, sizeof v);
        if (pick == 2) {
            expect(w, "context_is_active(garbage)", s, KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);
        } else {
            expect(w, "context_is_active", s, KREPLAY_STATUS_SUCCESS);
            if (pick == 0 && !may_be_finalizing(w) && v != (w == IN_FINALIZE ? 0 : 1))
                problem(where_name[w], "a started context reads as active = %lld (finalize: %lld)", v, w == IN_FINALIZE);
            if (pick == 1 && v != 0) problem(where_name[w], "a context never started reads as active = %lld%lld", v, 0);
            if (v != 0 && v != 1) problem(where_name[w], "context_is_active wrote %lld%lld", v, 0);
        }
        break;
    }
    case 4: {
        static const kreplay_callback_tracing_kind_t kinds[] = {0, 1, 2, 3, 77, UINT32_MAX};
        uint32_t ops[3] = {(uint32_t)below(6), (uint32_t)below(70), UINT32_MAX};
        size_t count = below(2) ? 0 : (below(2) ? 1 + below(3) : SIZE_MAX);
        s = kreplay_configure_callback_tracing_service(below(2) ? replay_ctx : garbage(), kinds[below(6)],
                                                       below(4) ? ops : NULL, count,
                                                       below(4) ? dummy_record : NULL, NULL);
        expect(w, "configure_callback_tracing_service after initialization", s, KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED);
        break;
    }
    case 5:
        s = kreplay_configure_dispatch_counting_service(below(2) ? count_ctx : garbage(), NULL, NULL, NULL);
        expect(w, "configure_dispatch_counting_service after initialization", s, KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED);
        break;
    case 6:
        if (below(2))
            expect(w, "force_configure(NULL)", kreplay_force_configure(NULL), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        else
            expect(w, "force_configure after initialization", kreplay_force_configure(other_configure),
                   KREPLAY_STATUS_ERROR_CONFIGURATION_LOCKED);
        break;
    case 7: {
        int* out = below(2) ? &v : (int*)odd(8);
        int init = below(2);
        if (below(4) == 0) {
            s = init ? kreplay_is_initialized(NULL) : kreplay_is_finalized(NULL);
            expect(w, "is_initialized/is_finalized(NULL)", s, KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
            break;
        }
        s = init ? kreplay_is_initialized(out) : kreplay_is_finalized(out);
        expect(w, "is_initialized/is_finalized", s, KREPLAY_STATUS_SUCCESS);
        memcpy(&v, (unsigned char*)out, sizeof v);
        /* Finalized only once every tool's finalize has returned: never while one runs. */
        if (v != init) problem(where_name[w], "is_initialized/is_finalized(%lld) wrote %lld", init, v);
        break;
    }
    case 8: {
        uint32_t* p[3];
        uint32_t got[3] = {7, 7, 7};
        int i;
        for (i = 0; i < 3; i++) p[i] = below(3) == 0 ? NULL : (below(2) ? &got[i] : (uint32_t*)odd(9 + i));
        expect(w, "get_version", kreplay_get_version(p[0], p[1], p[2]), KREPLAY_STATUS_SUCCESS);
        for (i = 0; i < 3; i++)
            if (p[i] != NULL) {
                static const uint32_t want[3] = {KREPLAY_VERSION_MAJOR, KREPLAY_VERSION_MINOR, KREPLAY_VERSION_PATCH};
                uint32_t x;
                memcpy(&x, (unsigned char*)p[i], sizeof x);
                if (x != want[i]) problem(where_name[w], "get_version wrote %lld for part %lld", x, i);
            }
        break;
    }
    case 9: {
        static const uint64_t sizes[] = {0, 1, 7, 8, 100, 240, 1000, UINT64_MAX};
        unsigned char* buf = below(2) ? raw + 16 : raw + 17; /* 1100 bytes from here are ours */
        uint64_t size = sizes[below(8)], back;
        size_t filled = size < 8 ? 0 : (size < 240 ? (size_t)size : 240), i;
        if (below(8) == 0) {
            expect(w, "get_counters(NULL)", kreplay_get_counters(NULL), KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
            break;
        }
        memset(buf, 0xa5, 1100);
        memcpy(buf, &size, sizeof size);
        s = kreplay_get_counters((kreplay_counters_t*)buf);
        expect(w, "get_counters", s, size < 8 ? KREPLAY_STATUS_ERROR_INVALID_ARGUMENT : KREPLAY_STATUS_SUCCESS);
        memcpy(&back, buf, sizeof back);
        if (size >= 8 && back != filled) problem(where_name[w], "get_counters set size %lld for %lld", (long long)back, (long long)size);
        for (i = filled < 8 ? 8 : filled; i < 1100 && i < size; i++)
            if (buf[i] != 0xa5) {
                problem(where_name[w], "get_counters wrote byte %lld of a %lld-byte buffer", (long long)i, (long long)size);
                break;
            }
        break;
    }
    case 10: {
        int32_t st = (int32_t)draw();
        const char* name = kreplay_get_status_name(st);
        atomic_fetch_add(&calls, 1);
        if (kreplay_get_status_string(st) == NULL || name == NULL)
            problem(where_name[w], "a status string is NULL for %lld%lld", st, 0);
        else if ((st < 0 || st >= KREPLAY_STATUS_LAST) && strcmp(name, "KREPLAY_STATUS_UNKNOWN") != 0)
            problem(where_name[w], "status %lld is named otherwise than unknown%lld", st, 0);
        if (kreplay_get_callback_tracing_kind_name(KREPLAY_CALLBACK_TRACING_LAST + (uint32_t)below(1000)) != NULL)
            problem(where_name[w], "an unknown kind has a name%lld%lld", 0, 0);
        if (kreplay_get_callback_tracing_operation_name((uint32_t)below(3), KREPLAY_KERNEL_REPLAY_LAST + (uint32_t)below(1000)) != NULL)
            problem(where_name[w], "an unknown operation has a name%lld%lld", 0, 0);
        if (strcmp(kreplay_get_decline_reason_string(KREPLAY_REPLAY_DECLINE_LAST + (uint32_t)below(1000)), "unknown") != 0)
            problem(where_name[w], "an unknown decline reason is not \"unknown\"%lld%lld", 0, 0);
        break;
    }
    case 11:
    case 12:
        if (w != IN_FINALIZE) counter_call(w);
        break;
    default:
        toggle_call(w);
        break;
    }
}

static void random_calls(enum where w) {
    int i;
    for (i = 0; i < CALLS_PER_CALLBACK; i++) random_call(w);
}

static void* background_main(void* arg) {
    unsigned long n = 0;
    (void)arg;
    while (!atomic_load(&stop_background) && n++ < BACKGROUND_MAX_CALLS) {
        random_call(BACKGROUND);
        sched_yield();
    }
    return NULL;
}

static void* pass_enter_helper(void* arg) {
    (void)arg;
    random_calls(IN_CALLBACK);
    return NULL;
}

static void note_agent(kreplay_agent_id_t agent) {
    unsigned long long none = 0;
    if (atomic_compare_exchange_strong(&agent_handle, &none, agent.handle)) {
        iterate_answer = KREPLAY_STATUS_SUCCESS;
        iterated = 0;
        expect(IN_CALLBACK, "iterate_agent_counters (first)", kreplay_iterate_agent_counters(agent, on_counters, NULL),
               KREPLAY_STATUS_SUCCESS);
        atomic_store(&counter_count, iterated);
    }
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t ud) {
    (void)info;
    (void)ud;
    random_calls(IN_CALLBACK);
    return 2 + below(3);
}

static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t pass, uint64_t total, kreplay_user_data_t ud) {
    (void)info;
    (void)pass;
    (void)total;
    (void)ud;
    random_calls(IN_CALLBACK);
    return below(3) != 0;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)ud;
    (void)data;
    note_agent(p->dispatch_info.agent_id);
    if (!atomic_exchange(&background_started, 1)) {
        if (pthread_create(&background, NULL, background_main, NULL) != 0)
            problem("initialize", "no background thread%lld%lld", 0, 0);
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        pthread_t helper;
        atomic_store(&saved_start, p->replay_start_context);
        atomic_store(&saved_stop, p->replay_stop_context);
        /* One toggle every seed makes: a context started when the replay began. */
        expect(IN_PASS_ENTER, "a toggle of a context started when the replay began",
               p->replay_start_context(on_ctx[0]), KREPLAY_STATUS_SUCCESS);
        atomic_fetch_add(&toggles_ok, 1);
        random_calls(IN_PASS_ENTER);
        if (pthread_create(&helper, NULL, pass_enter_helper, NULL) == 0) pthread_join(helper, NULL);
        return;
    }
    random_calls(IN_CALLBACK);
    if (record.operation == KREPLAY_KERNEL_REPLAY_PASS && record.phase == KREPLAY_CALLBACK_PHASE_EXIT) {
        /* And one refused every seed makes: PASS ENTER's toggle, kept, called at PASS EXIT. */
        kreplay_context_toggle_cb_t kept = atomic_load(&saved_stop);
        if (kept != NULL) {
            expect(IN_CALLBACK, "a PASS ENTER toggle called at PASS EXIT", kept(on_ctx[0]),
                   KREPLAY_STATUS_ERROR_CONTEXT_ERROR);
            atomic_fetch_add(&toggles_refused, 1);
        }
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
        switch (below(4)) {
        case 0: break; /* opt out */
        case 1: p->replay_pass_count = pass_count; break;
        default:
            p->replay_pass_count = pass_count;
            p->replay_continue = keep_going;
            break;
        }
    }
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_dispatch_data_t* p = record.payload;
    (void)ud;
    (void)data;
    note_agent(p->dispatch_info.agent_id);
    random_calls(IN_CALLBACK);
}

static void pick_config(kreplay_kernel_dispatch_info_t info, uint64_t pass, kreplay_counter_config_id_t* config,
                        void* data) {
    unsigned n = atomic_load(&config_count);
    (void)pass;
    (void)data;
    note_agent(info.agent_id);
    random_calls(IN_CALLBACK);
    if (n > MAX_CONFIGS) n = MAX_CONFIGS;
    switch (below(3)) {
    case 0: break;
    case 1: if (n > 0) config->handle = atomic_load(&configs[below(n)]); break;
    default: config->handle = draw() | (1ULL << 63); break; /* garbage: counts nothing */
    }
}

static void on_counts(kreplay_kernel_dispatch_info_t info, const kreplay_counter_record_t* r, size_t n, void* data) {
    (void)info;
    (void)r;
    (void)n;
    (void)data;
    random_calls(IN_CALLBACK);
}

static void must(const char* what, kreplay_status_t s) {
    if (s != KREPLAY_STATUS_SUCCESS) problem("initialize", what, s, 0);
}

static int initialize(kreplay_client_finalize_t fini, void* tool_data) {
    int i;
    (void)fini;
    (void)tool_data;
    must("create (%lld)%lld", kreplay_create_context(&replay_ctx));
    must("create (%lld)%lld", kreplay_create_context(&trace_ctx));
    must("create (%lld)%lld", kreplay_create_context(&count_ctx));
    for (i = 0; i < 2; i++) {
        must("create (%lld)%lld", kreplay_create_context(&on_ctx[i]));
        must("create (%lld)%lld", kreplay_create_context(&off_ctx[i]));
        must("create (%lld)%lld", kreplay_create_context(&churn_ctx[i]));
        must("start (%lld)%lld", kreplay_start_context(on_ctx[i]));
    }
    must("configure replay (%lld)%lld",
         kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL));
    must("configure dispatch (%lld)%lld",
         kreplay_configure_callback_tracing_service(trace_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, on_dispatch, NULL));
    must("configure counting (%lld)%lld", kreplay_configure_dispatch_counting_service(count_ctx, pick_config, on_counts, NULL));
    must("start (%lld)%lld", kreplay_start_context(replay_ctx));
    must("start (%lld)%lld", kreplay_start_context(trace_ctx));
    must("start (%lld)%lld", kreplay_start_context(count_ctx));
    return 0;
}

static void finalize(void* tool_data) {
    (void)tool_data;
    atomic_store(&stop_background, 1);
    if (atomic_load(&background_started)) pthread_join(background, NULL);
    random_calls(IN_FINALIZE);
    random_calls(IN_FINALIZE);
}

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), initialize, finalize, NULL};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    const char* s = getenv("PROBE_SEED");
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "random_calls";
    if (s != NULL) seed = strtoull(s, NULL, 0);
    return &result;
}

const char* probe_report(void) {
    if (atomic_load(&calls) < 1000) problem("report", "only %lld calls were made%lld", (long long)atomic_load(&calls), 0);
    if (atomic_load(&toggles_ok) == 0) problem("report", "no toggle succeeded in PASS ENTER%lld%lld", 0, 0);
    if (atomic_load(&toggles_refused) == 0) problem("report", "no toggle was refused outside PASS ENTER%lld%lld", 0, 0);
    if (atomic_load(&counters_ok) == 0) problem("report", "no counter call succeeded%lld%lld", 0, 0);
    if (problems > 20) problem("report", "%lld problems in all%lld", problems, 0);
    return report;
}
