/*
 * A careless C tool at the edges of the C interface: out-pointers and arrays at addresses that
 * are not aligned for their type (a field of a packed struct, a pointer into a byte buffer), and
 * element counts no array can have. kreplay.h: "Functions never abort the process: a failure is
 * returned as a status". Every call must return a status (the one an aligned call returns, for
 * misaligned but valid memory; KREPLAY_STATUS_ERROR_INVALID_ARGUMENT for a count no array can
 * have) and write exactly what an aligned call writes. PROBE_MODE selects the calls:
 *   misaligned   every out-pointer and input array of the interface at an odd address, in
 *                initialize and (the counter functions, which need the runtime) in CONFIG ENTER;
 *                the replay runs 2 passes.
 *   huge_counts  operation and counter lists with counts above what memory can hold (SIZE_MAX,
 *                SIZE_MAX / 2, the first count past the largest array); the replay runs 2 passes.
 *   no_config    kernel replay configured without its CONFIG operation (PASS, SNAPSHOT and
 *                RESTORE only): kreplay can never ask this tool for a pass count, so nothing is
 *                ever replayed; the test reads kreplay's warning saying so.
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* mode;
static kreplay_context_id_t replay_ctx;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[4096];
static int counters_checked;

/* Bytes for misaligned objects: an object placed at `odd(n)` starts one byte past a 16-byte
 * boundary, so it is misaligned for every type wider than a byte. */
static unsigned char raw[4096] __attribute__((aligned(16)));
static void* odd(size_t offset) { return raw + offset * 64 + 1; }

static void problem(const char* fmt, long long a, long long b) {
    size_t len;
    pthread_mutex_lock(&lock);
    len = strlen(report);
    if (len + 240 <= sizeof report) {
        snprintf(report + len, sizeof report - len, fmt, a, b);
        strcat(report, "; ");
    }
    pthread_mutex_unlock(&lock);
}

static void expect(const char* what, kreplay_status_t got, kreplay_status_t want) {
    if (got != want) {
        char fmt[200];
        snprintf(fmt, sizeof fmt, "%s returned %%lld, expected %%lld", what);
        problem(fmt, got, want);
    }
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t ud) {
    (void)info;
    (void)ud;
    return 2;
}

/* kreplay_get_counters, kreplay_context_is_active, kreplay_is_initialized,
 * kreplay_is_finalized and kreplay_get_version, each through a misaligned pointer, compared
 * with the same call through an aligned one. */
static void misaligned_informational(void) {
    kreplay_counters_t aligned;
    int flag = -1, got;
    uint32_t major = 99, minor = 99, patch = 99, v[3];
    memset(&aligned, 0, sizeof aligned);
    aligned.size = sizeof aligned;
    expect("kreplay_get_counters(aligned)", kreplay_get_counters(&aligned), KREPLAY_STATUS_SUCCESS);
    {
        kreplay_counters_t* c = (kreplay_counters_t*)odd(10);
        uint64_t size = sizeof(kreplay_counters_t), back;
        memcpy((unsigned char*)c, &size, sizeof size);
        expect("kreplay_get_counters(misaligned)", kreplay_get_counters(c), KREPLAY_STATUS_SUCCESS);
        memcpy(&back, (unsigned char*)c, sizeof back);
        if (back != sizeof(kreplay_counters_t))
            problem("kreplay_get_counters(misaligned) set size %lld, expected %lld", (long long)back,
                    (long long)sizeof(kreplay_counters_t));
    }

    expect("kreplay_context_is_active(aligned)", kreplay_context_is_active(replay_ctx, &flag),
           KREPLAY_STATUS_SUCCESS);
    memset(odd(20), 0x5a, sizeof(int));
    expect("kreplay_context_is_active(misaligned)",
           kreplay_context_is_active(replay_ctx, (int*)odd(20)), KREPLAY_STATUS_SUCCESS);
    memcpy(&got, odd(20), sizeof got);
    if (got != flag) problem("kreplay_context_is_active(misaligned) wrote %lld, aligned %lld", got, flag);

    expect("kreplay_is_initialized(aligned)", kreplay_is_initialized(&flag), KREPLAY_STATUS_SUCCESS);
    memset(odd(21), 0x5a, sizeof(int));
    expect("kreplay_is_initialized(misaligned)", kreplay_is_initialized((int*)odd(21)),
           KREPLAY_STATUS_SUCCESS);
    memcpy(&got, odd(21), sizeof got);
    if (got != flag) problem("kreplay_is_initialized(misaligned) wrote %lld, aligned %lld", got, flag);

    expect("kreplay_is_finalized(aligned)", kreplay_is_finalized(&flag), KREPLAY_STATUS_SUCCESS);
    memset(odd(22), 0x5a, sizeof(int));
    expect("kreplay_is_finalized(misaligned)", kreplay_is_finalized((int*)odd(22)),
           KREPLAY_STATUS_SUCCESS);
    memcpy(&got, odd(22), sizeof got);
    if (got != flag) problem("kreplay_is_finalized(misaligned) wrote %lld, aligned %lld", got, flag);

    expect("kreplay_get_version(aligned)", kreplay_get_version(&major, &minor, &patch),
           KREPLAY_STATUS_SUCCESS);
    expect("kreplay_get_version(misaligned)",
           kreplay_get_version((uint32_t*)odd(23), (uint32_t*)odd(24), (uint32_t*)odd(25)),
           KREPLAY_STATUS_SUCCESS);
    memcpy(&v[0], odd(23), 4);
    memcpy(&v[1], odd(24), 4);
    memcpy(&v[2], odd(25), 4);
    if (v[0] != major || v[1] != minor || v[2] != patch)
        problem("kreplay_get_version(misaligned) wrote another version (major %lld, aligned %lld)",
                v[0], major);
}

/* The counter functions (the runtime is up in CONFIG ENTER), misaligned. */
static kreplay_counter_id_t first_ids[8];
static size_t first_count;

static kreplay_status_t collect(kreplay_agent_id_t agent, const kreplay_counter_info_t* c, size_t n,
                                void* ud) {
    size_t i;
    (void)agent;
    (void)ud;
    first_count = n < 8 ? n : 8;
    for (i = 0; i < first_count; i++) first_ids[i] = c[i].id;
    return KREPLAY_STATUS_SUCCESS;
}

static void misaligned_counters(kreplay_agent_id_t agent) {
    uint64_t passes = 0, odd_passes = 0;
    uint32_t pass_of[8], odd_pass_of[8];
    kreplay_counter_config_id_t config = {0}, odd_config = {0};
    kreplay_counter_id_t* odd_ids = (kreplay_counter_id_t*)odd(30);
    size_t i;
    expect("kreplay_iterate_agent_counters", kreplay_iterate_agent_counters(agent, collect, NULL),
           KREPLAY_STATUS_SUCCESS);
    if (first_count == 0) {
        problem("the agent has no counters (%lld): nothing to check%lld", 0, 0);
        return;
    }
    memcpy(odd_ids, first_ids, first_count * sizeof first_ids[0]);

    expect("kreplay_plan_counter_passes(aligned)",
           kreplay_plan_counter_passes(agent, first_ids, first_count, pass_of, &passes),
           KREPLAY_STATUS_SUCCESS);
    expect("kreplay_plan_counter_passes(misaligned)",
           kreplay_plan_counter_passes(agent, odd_ids, first_count, (uint32_t*)odd(40),
                                       (uint64_t*)odd(39)),
           KREPLAY_STATUS_SUCCESS);
    memcpy(&odd_passes, odd(39), sizeof odd_passes);
    memcpy(odd_pass_of, odd(40), first_count * sizeof odd_pass_of[0]);
    if (odd_passes != passes)
        problem("kreplay_plan_counter_passes(misaligned) planned %lld passes, aligned %lld",
                (long long)odd_passes, (long long)passes);
    for (i = 0; i < first_count; i++)
        if (odd_pass_of[i] != pass_of[i])
            problem("kreplay_plan_counter_passes(misaligned) put counter %lld in pass %lld",
                    (long long)i, odd_pass_of[i]);

    expect("kreplay_create_counter_config(aligned)",
           kreplay_create_counter_config(agent, first_ids, 1, &config), KREPLAY_STATUS_SUCCESS);
    expect("kreplay_create_counter_config(misaligned)",
           kreplay_create_counter_config(agent, odd_ids, 1,
                                         (kreplay_counter_config_id_t*)odd(41)),
           KREPLAY_STATUS_SUCCESS);
    memcpy(&odd_config, odd(41), sizeof odd_config);
    if (odd_config.handle == 0 || odd_config.handle == config.handle)
        problem("kreplay_create_counter_config(misaligned) wrote handle %lld (aligned: %lld)",
                (long long)odd_config.handle, (long long)config.handle);
}

/* Counts no array can have, with a pointer to one valid element. */
static void huge_counter_counts(kreplay_agent_id_t agent) {
    static const size_t counts[] = {SIZE_MAX, SIZE_MAX / 2,
                                    SIZE_MAX / 2 / sizeof(kreplay_counter_id_t) + 1};
    kreplay_counter_id_t one[1];
    kreplay_counter_config_id_t config = {0};
    uint64_t passes = 77;
    size_t i;
    expect("kreplay_iterate_agent_counters", kreplay_iterate_agent_counters(agent, collect, NULL),
           KREPLAY_STATUS_SUCCESS);
    if (first_count == 0) {
        problem("the agent has no counters (%lld): nothing to check%lld", 0, 0);
        return;
    }
    one[0] = first_ids[0];
    for (i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        expect("kreplay_plan_counter_passes(huge count)",
               kreplay_plan_counter_passes(agent, one, counts[i], NULL, &passes),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        expect("kreplay_create_counter_config(huge count)",
               kreplay_create_counter_config(agent, one, counts[i], &config),
               KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    }
    if (passes != 77) problem("a refused plan wrote a pass count (%lld)%lld", (long long)passes, 0);
    if (config.handle != 0)
        problem("a refused configuration wrote a handle (%lld)%lld", (long long)config.handle, 0);
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* ud, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)ud;
    (void)data;
    if (record.operation != KREPLAY_KERNEL_REPLAY_CONFIG || record.phase != KREPLAY_CALLBACK_PHASE_ENTER)
        return;
    p->replay_pass_count = pass_count;
    pthread_mutex_lock(&lock);
    if (counters_checked) {
        pthread_mutex_unlock(&lock);
        return;
    }
    counters_checked = 1;
    pthread_mutex_unlock(&lock);
    if (strcmp(mode, "misaligned") == 0) {
        misaligned_informational();
        misaligned_counters(p->dispatch_info.agent_id);
    } else {
        huge_counter_counts(p->dispatch_info.agent_id);
    }
}

static int initialize(kreplay_client_finalize_t fini, void* tool_data) {
    uint32_t ops[4] = {KREPLAY_KERNEL_REPLAY_CONFIG, KREPLAY_KERNEL_REPLAY_PASS,
                       KREPLAY_KERNEL_REPLAY_SNAPSHOT, KREPLAY_KERNEL_REPLAY_RESTORE};
    (void)fini;
    (void)tool_data;
    if (strcmp(mode, "no_config") == 0) {
        expect("kreplay_create_context", kreplay_create_context(&replay_ctx), KREPLAY_STATUS_SUCCESS);
        expect("kreplay_configure_callback_tracing_service(no CONFIG)",
               kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                          ops + 1, 3, on_replay, NULL),
               KREPLAY_STATUS_SUCCESS);
        counters_checked = 1; /* no CONFIG ENTER comes in this mode */
    } else if (strcmp(mode, "misaligned") == 0) {
        kreplay_context_id_t* odd_ctx = (kreplay_context_id_t*)odd(0);
        uint32_t* odd_ops = (uint32_t*)odd(1);
        expect("kreplay_create_context(misaligned)", kreplay_create_context(odd_ctx),
               KREPLAY_STATUS_SUCCESS);
        memcpy(&replay_ctx, odd_ctx, sizeof replay_ctx);
        if (replay_ctx.handle == 0) problem("kreplay_create_context(misaligned) wrote handle 0%lld%lld", 0, 0);
        memcpy(odd_ops, ops, sizeof ops);
        expect("kreplay_configure_callback_tracing_service(misaligned operations)",
               kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                          odd_ops, 4, on_replay, NULL),
               KREPLAY_STATUS_SUCCESS);
        misaligned_informational();
    } else {
        static const size_t counts[] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 2 / sizeof(uint32_t) + 1};
        size_t i;
        expect("kreplay_create_context", kreplay_create_context(&replay_ctx), KREPLAY_STATUS_SUCCESS);
        for (i = 0; i < sizeof counts / sizeof counts[0]; i++)
            expect("kreplay_configure_callback_tracing_service(huge count)",
                   kreplay_configure_callback_tracing_service(replay_ctx,
                                                              KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                              ops, counts[i], on_replay, NULL),
                   KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
        /* Nothing was configured by the refused calls: the same kind configures now. */
        expect("kreplay_configure_callback_tracing_service",
               kreplay_configure_callback_tracing_service(replay_ctx, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                          ops, 4, on_replay, NULL),
               KREPLAY_STATUS_SUCCESS);
    }
    expect("kreplay_start_context", kreplay_start_context(replay_ctx), KREPLAY_STATUS_SUCCESS);
    return 0;
}

static void finalize(void* tool_data) { (void)tool_data; }

static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), initialize,
                                                 finalize, NULL};

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority, kreplay_client_id_t* client_id) {
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "boundary";
    mode = getenv("PROBE_MODE");
    if (mode == NULL) mode = "misaligned";
    return &result;
}

const char* probe_report(void) {
    if (!counters_checked) problem("CONFIG ENTER never came (%lld)%lld", 0, 0);
    return report;
}
