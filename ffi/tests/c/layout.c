/*
 * Compile-time checks of kreplay.h against the layouts it documents (the sizes
 * docs/abi.md §2 states, the offsets in the header's comments). Compiled, not run, by
 * tests/header.rs as C99 and as C11.
 */
#include <stddef.h>
#include <stdint.h>

#include "kreplay.h"

/* A field's offset and size. */
#define KREPLAY_CHECK_FIELD(type, field, offset, size)                                             \
    _Static_assert(offsetof(type, field) == (offset), #type "." #field " offset");                 \
    _Static_assert(sizeof(((type*)0)->field) == (size), #type "." #field " size")
#define KREPLAY_CHECK_SIZE(type, expected) _Static_assert(sizeof(type) == (expected), #type " size")

/* Enumerations travel as fixed-width integers. */
KREPLAY_CHECK_SIZE(kreplay_status_t, 4);
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_kind_t, 4);
KREPLAY_CHECK_SIZE(kreplay_tracing_operation_t, 4);
KREPLAY_CHECK_SIZE(kreplay_kernel_replay_operation_t, 4);
KREPLAY_CHECK_SIZE(kreplay_kernel_dispatch_operation_t, 4);
KREPLAY_CHECK_SIZE(kreplay_callback_phase_t, 4);
KREPLAY_CHECK_SIZE(kreplay_replay_decline_reason_t, 4);
KREPLAY_CHECK_SIZE(kreplay_snapshot_tier_t, 4);
KREPLAY_CHECK_SIZE(kreplay_restore_strategy_t, 4);
KREPLAY_CHECK_SIZE(kreplay_replay_outcome_t, 4);
KREPLAY_CHECK_SIZE(kreplay_replay_end_t, 4);
_Static_assert((kreplay_status_t)-1 < 0, "kreplay_status_t is signed");

/* Basic types. */
KREPLAY_CHECK_SIZE(kreplay_context_id_t, 8);
KREPLAY_CHECK_FIELD(kreplay_context_id_t, handle, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_agent_id_t, 8);
KREPLAY_CHECK_FIELD(kreplay_agent_id_t, handle, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_queue_id_t, 8);
KREPLAY_CHECK_FIELD(kreplay_queue_id_t, handle, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_user_data_t, 8);
KREPLAY_CHECK_FIELD(kreplay_user_data_t, value, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_user_data_t, ptr, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_dim3_t, 12);
KREPLAY_CHECK_FIELD(kreplay_dim3_t, x, 0, 4);
KREPLAY_CHECK_FIELD(kreplay_dim3_t, y, 4, 4);
KREPLAY_CHECK_FIELD(kreplay_dim3_t, z, 8, 4);

/* kreplay_kernel_dispatch_info_t: 128 bytes. */
KREPLAY_CHECK_SIZE(kreplay_kernel_dispatch_info_t, 128);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, agent_id, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, queue_id, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, kernel_id, 24, 8);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, dispatch_id, 32, 8);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, private_segment_size, 40, 4);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, group_segment_size, 44, 4);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, workgroup_size, 48, 12);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, grid_size, 60, 12);
KREPLAY_CHECK_FIELD(kreplay_kernel_dispatch_info_t, reserved_padding, 72, 56);

/* Callback pointers are one pointer wide. */
KREPLAY_CHECK_SIZE(kreplay_pass_count_cb_t, 8);
KREPLAY_CHECK_SIZE(kreplay_continue_cb_t, 8);
KREPLAY_CHECK_SIZE(kreplay_context_toggle_cb_t, 8);
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_cb_t, 8);

/* kreplay_callback_tracing_kernel_replay_data_t: the first 184 bytes, then the CONFIG EXIT outcome. */
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_kernel_replay_data_t, 216);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, dispatch_info, 8, 128);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, current_pass, 136, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, total_passes, 144, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, replay_pass_count, 152, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, replay_continue, 160, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, replay_start_context, 168, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, replay_stop_context, 176, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, outcome, 184, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, end_reason, 188, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, status, 192, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, decline_reason, 196, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, passes_run, 200, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_data_t, bytes_lost, 208, 8);

/* kreplay_callback_tracing_kernel_replay_memory_data_t: 280 bytes. */
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_kernel_replay_memory_data_t, 280);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, dispatch_info, 8, 128);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, current_pass, 136, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, bytes_planned, 144, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, bytes_moved, 152, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, regions, 160, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, chunks_restored, 168, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, tier, 176, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, strategy, 180, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, status, 184, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, decline_reason, 188, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, bytes_lost, 192, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, chunks_repaired, 200, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, unverified, 208, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, reserved, 212, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, agent_regions, 216, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, agent_bytes, 224, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, referenced_regions, 232, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, referenced_bytes, 240, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, module_variable_regions, 248, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, module_variable_bytes, 256, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, adopted_regions, 264, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_replay_memory_data_t, adopted_bytes, 272, 8);

/* kreplay_counters_t: 240 bytes. */
KREPLAY_CHECK_SIZE(kreplay_counters_t, 240);
KREPLAY_CHECK_FIELD(kreplay_counters_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, dispatches, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, replays, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, passes, 24, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, ran_once, 32, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, declines, 40, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, ended_early, 48, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, pass_failures, 56, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, restore_failures, 64, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, bytes_snapshotted, 72, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, bytes_restored, 80, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, bytes_lost, 88, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, chunks_repaired, 96, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, unverified_restores, 104, 8);
KREPLAY_CHECK_FIELD(kreplay_counters_t, declines_by_reason, 112, 128);

/* kreplay_callback_tracing_kernel_dispatch_data_t: 160 bytes. */
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_kernel_dispatch_data_t, 160);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_dispatch_data_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_dispatch_data_t, dispatch_info, 8, 128);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_dispatch_data_t, start_timestamp, 136, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_dispatch_data_t, end_timestamp, 144, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_kernel_dispatch_data_t, replay_pass, 152, 8);

/* kreplay_callback_tracing_record_t: 48 bytes. */
KREPLAY_CHECK_SIZE(kreplay_callback_tracing_record_t, 48);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, context_id, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, thread_id, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, correlation_id, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, kind, 24, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, operation, 28, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, phase, 32, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, decline_reason, 36, 4);
KREPLAY_CHECK_FIELD(kreplay_callback_tracing_record_t, payload, 40, 8);

/* Tool discovery. */
KREPLAY_CHECK_SIZE(kreplay_client_id_t, 16);
KREPLAY_CHECK_FIELD(kreplay_client_id_t, name, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_client_id_t, handle, 8, 4);
KREPLAY_CHECK_SIZE(kreplay_tool_configure_result_t, 32);
KREPLAY_CHECK_FIELD(kreplay_tool_configure_result_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_tool_configure_result_t, initialize, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_tool_configure_result_t, finalize, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_tool_configure_result_t, tool_data, 24, 8);

/* docs/abi.md §2: values are ABI. */
_Static_assert(KREPLAY_STATUS_SUCCESS == 0, "SUCCESS is 0");
_Static_assert(KREPLAY_CALLBACK_TRACING_NONE == 0, "kind NONE is 0");
_Static_assert(KREPLAY_KERNEL_REPLAY_NONE == 0 && KREPLAY_KERNEL_REPLAY_CONFIG == 1 &&
                   KREPLAY_KERNEL_REPLAY_PASS == 2 && KREPLAY_KERNEL_REPLAY_SNAPSHOT == 3 &&
                   KREPLAY_KERNEL_REPLAY_RESTORE == 4 && KREPLAY_KERNEL_REPLAY_LAST == 5,
               "kernel replay operations");
_Static_assert(KREPLAY_CALLBACK_PHASE_NONE == 0 && KREPLAY_CALLBACK_PHASE_ENTER == 1 &&
                   KREPLAY_CALLBACK_PHASE_EXIT == 2,
               "phases");

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
/* The three id types are distinct types (kreplay.h: three distinct typedefs). */
#define KREPLAY_IS_CONTEXT_ID(value) _Generic((value), kreplay_context_id_t: 1, default: 0)
_Static_assert(KREPLAY_IS_CONTEXT_ID((kreplay_context_id_t){0}), "context id");
_Static_assert(!KREPLAY_IS_CONTEXT_ID((kreplay_agent_id_t){0}), "agent id is distinct");
_Static_assert(!KREPLAY_IS_CONTEXT_ID((kreplay_queue_id_t){0}), "queue id is distinct");
#endif

/* The callback typedefs accept functions of the documented shapes. */
static uint64_t pass_count(kreplay_kernel_dispatch_info_t info, kreplay_user_data_t user_data) {
    (void)info;
    return user_data.value;
}
static int keep_going(kreplay_kernel_dispatch_info_t info, uint64_t current, uint64_t total,
                      kreplay_user_data_t user_data) {
    (void)info;
    (void)user_data;
    return current + 1 < total;
}
static void on_record(kreplay_callback_tracing_record_t record, kreplay_user_data_t* user_data,
                      void* callback_data) {
    (void)callback_data;
    user_data->value = record.correlation_id;
}

void kreplay_layout_check_callbacks(kreplay_callback_tracing_kernel_replay_data_t* data,
                                    kreplay_callback_tracing_cb_t* callback);
void kreplay_layout_check_callbacks(kreplay_callback_tracing_kernel_replay_data_t* data,
                                    kreplay_callback_tracing_cb_t* callback) {
    data->replay_pass_count = pass_count;
    data->replay_continue = keep_going;
    *callback = on_record;
}

/* Dispatch counter collection. */
KREPLAY_CHECK_SIZE(kreplay_counter_id_t, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_id_t, handle, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_counter_config_id_t, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_config_id_t, handle, 0, 8);
KREPLAY_CHECK_SIZE(kreplay_counter_info_t, 48);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, id, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, name, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, description, 24, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, block, 32, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, block_limit, 40, 4);
KREPLAY_CHECK_FIELD(kreplay_counter_info_t, is_derived, 44, 4);
KREPLAY_CHECK_SIZE(kreplay_counter_record_t, 56);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, size, 0, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, counter_id, 8, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, dispatch_id, 16, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, replay_pass, 24, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, agent_id, 32, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, context_id, 40, 8);
KREPLAY_CHECK_FIELD(kreplay_counter_record_t, value, 48, 8);
_Static_assert(KREPLAY_STATUS_ERROR_EXCEEDS_PASS_LIMIT == 12 && KREPLAY_STATUS_ERROR_FINALIZED == 13 &&
                   KREPLAY_STATUS_LAST == 14,
               "status values are appended");
