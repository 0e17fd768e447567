// The header as C++: extern "C" linkage, no C-only constructs. Compiled by tests/header.rs.
#include "kreplay.h"

#include <cstddef>

static_assert(sizeof(kreplay_kernel_dispatch_info_t) == 128, "dispatch info size");
static_assert(sizeof(kreplay_callback_tracing_kernel_replay_data_t) == 216, "replay data size");
static_assert(offsetof(kreplay_callback_tracing_kernel_replay_data_t, outcome) == 184,
              "appended fields start after the first 184 bytes");
static_assert(offsetof(kreplay_callback_tracing_kernel_replay_data_t, replay_stop_context) == 176,
              "replay_stop_context offset");

// A C++ tool defines kreplay_configure with the header's (C) declaration.
extern "C" kreplay_tool_configure_result_t* kreplay_configure(uint32_t version,
                                                              const char* runtime_version,
                                                              uint32_t priority,
                                                              kreplay_client_id_t* client_id) {
    (void)version;
    (void)runtime_version;
    (void)priority;
    client_id->name = "cxx-tool";
    return nullptr;
}
