/*
 * A tool whose finalize runs long. life_finalize_async() makes a thread of the tool call the
 * client finalize function; the tool's finalize then waits (bounded, 30 s) until the
 * application calls life_release(). life_in_fini() says whether the finalize is running now.
 */
#include "kreplay.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static kreplay_client_id_t self_id;
static kreplay_client_finalize_t finalize_self;
static atomic_int in_fini, released;
static pthread_t finisher;

int life_in_fini(void) { return atomic_load(&in_fini); }
void life_release(void) { atomic_store(&released, 1); }
const char* probe_report(void) { return ""; }

static void* finish(void* arg) {
    (void)arg;
    finalize_self(self_id);
    return NULL;
}

int life_finalize_async(void) { return pthread_create(&finisher, NULL, finish, NULL); }
void life_join(void) { pthread_join(finisher, NULL); }

static int tool_init(kreplay_client_finalize_t fin, void* tool_data) {
    kreplay_context_id_t ctx;
    (void)tool_data;
    finalize_self = fin;
    return kreplay_create_context(&ctx) != KREPLAY_STATUS_SUCCESS;
}

static void tool_fini(void* tool_data) {
    time_t until = time(NULL) + 30;
    (void)tool_data;
    atomic_store(&in_fini, 1);
    while (!atomic_load(&released) && time(NULL) < until) sched_yield();
    atomic_store(&in_fini, 0);
}

kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* runtime_version,
                                                   uint32_t priority, kreplay_client_id_t* client_id) {
    static kreplay_tool_configure_result_t result = {sizeof(kreplay_tool_configure_result_t), tool_init,
                                                     tool_fini, NULL};
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "life_slow_fini";
    self_id = *client_id;
    return &result;
}
