/*
 * SPEC §5 KREPLAY_SNAPSHOT_STORE and KREPLAY_RESTORE as a C tool sees them: every dispatch is
 * replayed in 4 passes, and every SNAPSHOT EXIT must name the tier SPEC_TIER (a
 * kreplay_snapshot_tier_t value) and every RESTORE EXIT the strategy SPEC_STRATEGY, the restore
 * succeeding. `unverified`: never set unless SPEC_UNVERIFIED is 1; then set on some restores
 * but never on the one before the last of the 4 passes (docs/abi.md: the replay cannot end with a
 * pass that started from an unverified restore).
 */
#include "kreplay.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char report[1024];
static int snapshots, restores, unverified_restores;
static uint32_t want_tier, want_strategy, want_unverified;
static int referenced_scope; /* SPEC_SCOPE=referenced: KREPLAY_SNAPSHOT_SCOPE=referenced is set */

static uint64_t four(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    return 4;
}

static void problem(const char* what, uint64_t a, uint64_t b) {
    size_t used = strlen(report);
    if (used + 200 < sizeof report)
        snprintf(report + used, sizeof report - used, "%s (%llu, want %llu); ", what, (unsigned long long)a,
                 (unsigned long long)b);
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    kreplay_callback_tracing_kernel_replay_memory_data_t* m = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = four;
    if (record.phase != KREPLAY_CALLBACK_PHASE_EXIT) return;
    pthread_mutex_lock(&lock);
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && p->outcome != KREPLAY_REPLAY_OUTCOME_REPLAYED)
        problem("CONFIG EXIT outcome", p->outcome, KREPLAY_REPLAY_OUTCOME_REPLAYED);
    if (record.operation == KREPLAY_KERNEL_REPLAY_SNAPSHOT) {
        snapshots++;
        if (m->tier != want_tier) problem("SNAPSHOT EXIT tier", m->tier, want_tier);
        /* The application's buffers are its agent's coarse-grained memory, each one reached by
         * the dispatch's argument: agent memory, or (scope referenced) referenced memory only. */
        if (referenced_scope && (m->agent_regions != 0 || m->referenced_regions == 0))
            problem("SNAPSHOT EXIT under the referenced scope: agent regions", m->agent_regions, 0);
        if (!referenced_scope && m->agent_regions == 0) problem("SNAPSHOT EXIT agent regions", 0, 1);
    }
    if (record.operation == KREPLAY_KERNEL_REPLAY_RESTORE) {
        restores++;
        if (m->tier != want_tier) problem("RESTORE EXIT tier", m->tier, want_tier);
        if (m->strategy != want_strategy) problem("RESTORE EXIT strategy", m->strategy, want_strategy);
        if (m->unverified) unverified_restores++;
        if (m->unverified && (!want_unverified || m->current_pass == 2))
            problem("RESTORE EXIT unverified after pass", m->current_pass, 0);
        if (m->status != KREPLAY_STATUS_SUCCESS) problem("RESTORE EXIT status", (uint64_t)m->status, 0);
    }
    pthread_mutex_unlock(&lock);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t owner;
    (void)fin;
    (void)tool_data;
    if (kreplay_create_context(&owner)) return 1;
    if (kreplay_configure_callback_tracing_service(owner, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL))
        return 1;
    return kreplay_start_context(owner);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init, NULL, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    want_tier = (uint32_t)atoi(getenv("SPEC_TIER") ? getenv("SPEC_TIER") : "0");
    want_strategy = (uint32_t)atoi(getenv("SPEC_STRATEGY") ? getenv("SPEC_STRATEGY") : "0");
    want_unverified = (uint32_t)atoi(getenv("SPEC_UNVERIFIED") ? getenv("SPEC_UNVERIFIED") : "0");
    referenced_scope = getenv("SPEC_SCOPE") && strcmp(getenv("SPEC_SCOPE"), "referenced") == 0;
    client_id->name = "spec-tiers";
    return &result;
}

const char* probe_report(void) {
    pthread_mutex_lock(&lock);
    if (want_unverified && unverified_restores == 0) problem("unverified restores", 0, 1);
    if (snapshots == 0 || restores != snapshots * 3) problem("restores per snapshot * 1000 + snapshots", (uint64_t)restores * 1000u + (uint64_t)snapshots, 3);
    pthread_mutex_unlock(&lock);
    return report;
}
