/*
 * A tool that forks in every callback kreplay makes (tool initialize and finalize, every replay
 * record, every dispatch record), as a tool starting a helper program with fork and exec does.
 * kreplay's handlers around fork take its own locks: a fork from a thread inside one of
 * kreplay's callbacks must neither wait for good in the parent nor leave the child stuck. Each
 * child exits at once; the parent waits for it (bounded) and counts what it saw.
 */
#include "kreplay.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int forks, stuck, failed, replay_forks, dispatch_forks;

static void fork_once(void) {
    struct timespec ms = {0, 1000000};
    int status = 0, i;
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid < 0) {
        atomic_fetch_add(&failed, 1);
        return;
    }
    for (i = 0; i < 10000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            atomic_fetch_add(&forks, 1);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) atomic_fetch_add(&failed, 1);
            return;
        }
        nanosleep(&ms, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    atomic_fetch_add(&stuck, 1);
}

static uint64_t three(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user) {
    (void)info;
    (void)user;
    fork_once();
    return 3;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    kreplay_callback_tracing_kernel_replay_data_t* p = record.payload;
    (void)user;
    (void)data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG && record.phase == KREPLAY_CALLBACK_PHASE_ENTER)
        p->replay_pass_count = three;
    fork_once();
    atomic_fetch_add(&replay_forks, 1);
}

static void on_dispatch(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user, void* data) {
    (void)record;
    (void)user;
    (void)data;
    fork_once();
    atomic_fetch_add(&dispatch_forks, 1);
}

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t replay, trace;
    (void)fin;
    (void)tool_data;
    fork_once();
    if (kreplay_create_context(&replay) || kreplay_create_context(&trace)) return 1;
    if (kreplay_configure_callback_tracing_service(replay, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0,
                                                   on_replay, NULL))
        return 1;
    if (kreplay_configure_callback_tracing_service(trace, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0,
                                                   on_dispatch, NULL))
        return 1;
    return kreplay_start_context(replay) || kreplay_start_context(trace);
}

static void tool_fini(void* tool_data) {
    (void)tool_data;
    fork_once();
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt, uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)rt;
    (void)priority;
    fork_once();
    client_id->name = "probe-fork-in-callbacks";
    return &result;
}

const char* probe_report(void) {
    static char report[512];
    report[0] = 0;
    if (atomic_load(&stuck) || atomic_load(&failed))
        snprintf(report, sizeof report, "%d forked child(ren) stuck, %d failed, of %d; ", atomic_load(&stuck),
                 atomic_load(&failed), atomic_load(&forks));
    if (atomic_load(&replay_forks) == 0 || atomic_load(&dispatch_forks) == 0)
        snprintf(report + strlen(report), sizeof report - strlen(report),
                 "forks in replay records %d, in dispatch records %d: each should be some",
                 atomic_load(&replay_forks), atomic_load(&dispatch_forks));
    return report;
}
