/*
 * Calls the exported functions of libkreplay through kreplay.h, so that the header's prototypes,
 * the exported symbols and the by-value argument passing are checked together. Built and run by
 * tests/header.rs against the libkreplay.so of the same build; prints "abi smoke: ok" on success.
 */
#include <stdio.h>
#include <string.h>

#include "kreplay.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static void on_record(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user_data,
                      void* callback_data) {
    (void)record;
    (void)user_data;
    (void)callback_data;
}

static kreplay_tool_configure_result_t* configure(uint32_t version, const char* runtime_version,
                                                  uint32_t priority,
                                                  kreplay_client_id_t* client_id) {
    (void)version;
    (void)runtime_version;
    (void)priority;
    (void)client_id;
    return NULL;
}

int main(void) {
    uint32_t major = 99, minor = 99, patch = 99;
    kreplay_context_id_t a, b, unknown;
    int flag = -1;
    uint32_t dispatch_ops[1];
    uint32_t bad_ops[1];
    static const char* const reasons[] = {"none",
                                          "untracked_memory",
                                          "footprint_budget",
                                          "snapshot_failed",
                                          "queue_drain_stuck",
                                          "agent_drain_stuck",
                                          "pass_drain_stuck",
                                          "reentrant_dispatch",
                                          "invalid_pass_count",
                                          "batch_or_graph"};
    uint32_t reason;

    CHECK(kreplay_get_version(&major, &minor, &patch) == KREPLAY_STATUS_SUCCESS);
    CHECK(major == KREPLAY_VERSION_MAJOR && minor == KREPLAY_VERSION_MINOR &&
          patch == KREPLAY_VERSION_PATCH);
    CHECK(kreplay_get_version(NULL, NULL, NULL) == KREPLAY_STATUS_SUCCESS);

    /* Contexts. */
    CHECK(kreplay_create_context(NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_create_context(&a) == KREPLAY_STATUS_SUCCESS);
    CHECK(kreplay_create_context(&b) == KREPLAY_STATUS_SUCCESS);
    CHECK(a.handle != 0 && b.handle != 0 && a.handle != b.handle);
    CHECK(kreplay_context_is_active(a, &flag) == KREPLAY_STATUS_SUCCESS && flag == 0);
    CHECK(kreplay_start_context(a) == KREPLAY_STATUS_SUCCESS);
    CHECK(kreplay_context_is_active(a, &flag) == KREPLAY_STATUS_SUCCESS && flag == 1);
    CHECK(kreplay_context_is_active(b, &flag) == KREPLAY_STATUS_SUCCESS && flag == 0);
    CHECK(kreplay_stop_context(a) == KREPLAY_STATUS_SUCCESS);
    CHECK(kreplay_context_is_active(a, &flag) == KREPLAY_STATUS_SUCCESS && flag == 0);
    CHECK(kreplay_context_is_active(a, NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    unknown.handle = 0;
    CHECK(kreplay_start_context(unknown) == KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);
    unknown.handle = b.handle + 1000;
    CHECK(kreplay_stop_context(unknown) == KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);
    CHECK(kreplay_context_is_active(unknown, &flag) == KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);

    /* Callback tracing services. */
    CHECK(kreplay_configure_callback_tracing_service(a, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY,
                                                     NULL, 0, on_record,
                                                     NULL) == KREPLAY_STATUS_SUCCESS);
    CHECK(kreplay_configure_callback_tracing_service(
              a, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_record, NULL) ==
          KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED);
    CHECK(kreplay_configure_callback_tracing_service(
              b, KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_record, NULL) ==
          KREPLAY_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED);
    dispatch_ops[0] = KREPLAY_KERNEL_DISPATCH_COMPLETE;
    CHECK(kreplay_configure_callback_tracing_service(b, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH,
                                                     dispatch_ops, 1, on_record,
                                                     &flag) == KREPLAY_STATUS_SUCCESS);
    CHECK(kreplay_configure_callback_tracing_service(a, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH,
                                                     NULL, 2, on_record,
                                                     NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    bad_ops[0] = KREPLAY_KERNEL_DISPATCH_LAST;
    CHECK(kreplay_configure_callback_tracing_service(a, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH,
                                                     bad_ops, 1, on_record,
                                                     NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_configure_callback_tracing_service(a, KREPLAY_CALLBACK_TRACING_NONE, NULL, 0,
                                                     on_record,
                                                     NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_configure_callback_tracing_service(a, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH,
                                                     NULL, 0, NULL,
                                                     NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_configure_callback_tracing_service(
              unknown, KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH, NULL, 0, on_record, NULL) ==
          KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND);

    /* Strings. */
    CHECK(strcmp(kreplay_get_status_name(KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND),
                 "KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND") == 0);
    CHECK(strcmp(kreplay_get_status_name(12345), "KREPLAY_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(kreplay_get_status_string(KREPLAY_STATUS_SUCCESS), "success") == 0);
    CHECK(kreplay_get_status_string(-7) != NULL);
    for (reason = 0; reason < KREPLAY_REPLAY_DECLINE_LAST; ++reason) {
        CHECK(strcmp(kreplay_get_decline_reason_string(reason), reasons[reason]) == 0);
    }
    CHECK(strcmp(kreplay_get_decline_reason_string(KREPLAY_REPLAY_DECLINE_LAST), "unknown") == 0);
    CHECK(strcmp(kreplay_get_callback_tracing_kind_name(KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY),
                 "KERNEL_REPLAY") == 0);
    CHECK(kreplay_get_callback_tracing_kind_name(KREPLAY_CALLBACK_TRACING_LAST) == NULL);
    CHECK(strcmp(kreplay_get_callback_tracing_operation_name(
                     KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, KREPLAY_KERNEL_REPLAY_RESTORE),
                 "RESTORE") == 0);
    CHECK(kreplay_get_callback_tracing_operation_name(KREPLAY_CALLBACK_TRACING_KERNEL_DISPATCH,
                                                      KREPLAY_KERNEL_DISPATCH_LAST) == NULL);

    /* Lifecycle: nothing initialized the tools in this process. */
    CHECK(kreplay_is_initialized(&flag) == KREPLAY_STATUS_SUCCESS && flag == 0);
    CHECK(kreplay_is_finalized(&flag) == KREPLAY_STATUS_SUCCESS && flag == 0);
    CHECK(kreplay_is_initialized(NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_force_configure(NULL) == KREPLAY_STATUS_ERROR_INVALID_ARGUMENT);
    CHECK(kreplay_force_configure(configure) == KREPLAY_STATUS_SUCCESS);

    puts("abi smoke: ok");
    return 0;
}
