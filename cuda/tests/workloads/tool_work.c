/*
 * tool_work: a kreplay tool that issues device work from inside a replay window on CUDA.
 *
 * It replays every launch in 4 passes and, at every PASS EXIT, sets a small buffer of its own
 * with cuMemsetD32 and then again with cuMemsetD2D32 (looked up in the libcuda the process has
 * loaded, so this builds with a plain C compiler; the CUDA runtime loads libcuda privately, so
 * the lookup opens it by name). The buffer is allocated at the first PASS EXIT, inside kreplay's
 * callback, so kreplay does not track it: the memsets run once and nothing restores over them.
 * At CONFIG EXIT, after the replay, it reads the buffer back; at finalization it prints, to
 * TOOL_WORK_OUTPUT or stdout, how many memset pairs it made and how many read-backs found the
 * last value.
 *
 * When the application exports a buffer of its own (tool_target.cu: tool_work_target and
 * tool_work_words), the tool also writes into memory the replay's snapshot holds, once: at PASS
 * EXIT of pass 1 of the first replayed launch it sets the buffer's first quarter to TOOL_VALUE
 * with cuMemsetD32 and its second quarter with cuMemsetD2D32 (rows of 1024 words). kreplay must
 * keep that work across the restores that follow (docs/abi.md §3 rule 10), so the application
 * ends with TOOL_VALUE plus its launches in both quarters (tool_target.cu prints the counts).
 *
 * Build: cc -std=c11 -fPIC -shared -I ffi/include cuda/tests/workloads/tool_work.c \
 *          -L BIN -lkreplay -ldl -o libtool_work.so
 */
/* RTLD_DEFAULT */
#define _GNU_SOURCE
#include "kreplay.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef unsigned long long devptr_t;
typedef int (*mem_alloc_fn)(devptr_t*, size_t);
typedef int (*memset_d32_fn)(devptr_t, unsigned int, size_t);
typedef int (*memset_d2d32_fn)(devptr_t, size_t, unsigned int, size_t, size_t);
typedef int (*memcpy_dtoh_fn)(void*, devptr_t, size_t);

static atomic_uint_fast64_t memsets;
static atomic_uint_fast64_t failures;
static atomic_uint_fast64_t kept;
static atomic_uint_fast64_t lost;
static devptr_t buffer;
static unsigned int last_value;
static atomic_int app_work_done;

#define TOOL_VALUE 0x00ABCDEFu
#define ROW_WORDS 1024

/* `name` in the process's libcuda (already loaded by the application's CUDA runtime). */
static void* driver_entry(const char* name) {
    static void* libcuda;
    if (libcuda == NULL) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (libcuda == NULL) libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    return libcuda != NULL ? dlsym(libcuda, name) : NULL;
}

static uint64_t pass_count(kreplay_kernel_dispatch_info_t dispatch, kreplay_user_data_t user_data) {
    (void)dispatch;
    (void)user_data;
    return 4;
}

static void on_replay(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user_data,
                      void* callback_data) {
    (void)user_data;
    (void)callback_data;
    if (record.operation == KREPLAY_KERNEL_REPLAY_CONFIG) {
        if (record.phase == KREPLAY_CALLBACK_PHASE_ENTER) {
            kreplay_callback_tracing_kernel_replay_data_t* data = record.payload;
            data->replay_pass_count = pass_count;
        } else if (buffer != 0) {
            unsigned int words[4] = {0, 0, 0, 0};
            memcpy_dtoh_fn copy = (memcpy_dtoh_fn)driver_entry("cuMemcpyDtoH_v2");
            int same = copy != NULL && copy(words, buffer, sizeof words) == 0 &&
                       words[0] == last_value && words[3] == last_value;
            atomic_fetch_add(same ? &kept : &lost, 1);
        }
        return;
    }
    if (record.operation != KREPLAY_KERNEL_REPLAY_PASS ||
        record.phase != KREPLAY_CALLBACK_PHASE_EXIT) {
        return;
    }
    mem_alloc_fn alloc = (mem_alloc_fn)driver_entry("cuMemAlloc_v2");
    memset_d32_fn set = (memset_d32_fn)driver_entry("cuMemsetD32_v2");
    memset_d2d32_fn set_2d = (memset_d2d32_fn)driver_entry("cuMemsetD2D32_v2");
    if (alloc == NULL || set == NULL || set_2d == NULL) {
        atomic_fetch_add(&failures, 1);
        return;
    }
    if (buffer == 0 && alloc(&buffer, 16) != 0) {
        atomic_fetch_add(&failures, 1);
        return;
    }
    kreplay_callback_tracing_kernel_replay_data_t* data = record.payload;
    const unsigned long long* target = dlsym(RTLD_DEFAULT, "tool_work_target");
    const unsigned long long* words = dlsym(RTLD_DEFAULT, "tool_work_words");
    if (data->current_pass == 1 && target != NULL && words != NULL && *target != 0 &&
        *words >= 4 * ROW_WORDS && !atomic_exchange(&app_work_done, 1)) {
        /* Into the application's buffer: the first quarter in one call, the second in rows. */
        size_t quarter = (size_t)(*words / 4);
        devptr_t second = *target + quarter * sizeof(unsigned int);
        if (set(*target, TOOL_VALUE, quarter) != 0 ||
            set_2d(second, ROW_WORDS * sizeof(unsigned int), TOOL_VALUE, ROW_WORDS,
                   quarter / ROW_WORDS) != 0) {
            atomic_fetch_add(&failures, 1);
        }
    }
    unsigned int value = (unsigned int)atomic_fetch_add(&memsets, 1) + 1;
    /* The same 16 bytes twice: one row of 4 words, pitch 16 bytes. */
    if (set(buffer, value, 4) != 0 || set_2d(buffer, 16, value, 4, 1) != 0) {
        atomic_fetch_add(&failures, 1);
        return;
    }
    last_value = value;
}

static int initialize(kreplay_client_finalize_t finalize, void* tool_data) {
    kreplay_context_id_t replay;
    (void)finalize;
    (void)tool_data;
    if (kreplay_create_context(&replay) != KREPLAY_STATUS_SUCCESS) return 1;
    if (kreplay_configure_callback_tracing_service(replay, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                   NULL, 0, on_replay,
                                                   NULL) != KREPLAY_STATUS_SUCCESS) {
        return 1;
    }
    return kreplay_start_context(replay) != KREPLAY_STATUS_SUCCESS;
}

static void finalize(void* tool_data) {
    const char* path = getenv("TOOL_WORK_OUTPUT");
    FILE* out = path != NULL ? fopen(path, "w") : stdout;
    (void)tool_data;
    if (out == NULL) return;
    fprintf(out,
            "tool_work: %" PRIu64 " memset pairs, %" PRIu64 " failures; read back after the replay: %"
            PRIu64 " kept, %" PRIu64 " lost\n",
            (uint64_t)atomic_load(&memsets), (uint64_t)atomic_load(&failures),
            (uint64_t)atomic_load(&kept), (uint64_t)atomic_load(&lost));
    if (out != stdout) fclose(out);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority,
                                                   kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {
        sizeof(kreplay_tool_configure_result_t), initialize, finalize, NULL};
    (void)runtime_version;
    (void)priority;
    if (version / 10000 != KREPLAY_VERSION_MAJOR) return NULL;
    client_id->name = "tool_work";
    return &result;
}
