//! The counter functions of `kreplay.h` on the CUDA backend, without a GPU: counter collection
//! is HSA-only, and a tool asking for counters once kreplay runs under CUDA is told there are
//! none, not that kreplay is not loaded yet (which kreplay.h says to answer by calling again
//! later, for ever).

use std::ffi::c_void;

use kreplay::abi::{AgentId, CounterId, CounterInfo, Status};
use kreplay::counting::{
    kreplay_create_counter_config, kreplay_iterate_agent_counters, kreplay_plan_counter_passes,
};

unsafe extern "C" fn collect(
    _agent: AgentId,
    _counters: *const CounterInfo,
    _count: usize,
    _data: *mut c_void,
) -> Status {
    Status::SUCCESS
}

#[test]
fn counter_functions_under_the_cuda_backend_say_there_are_no_counters() {
    let _tools = kreplay::cuda_tool::make_tools().expect("the CUDA backend's tool side");
    let agent = AgentId { handle: 0 };
    let one = CounterId { handle: 1 };
    // SAFETY: a callback of the right type; no data.
    let iterate =
        unsafe { kreplay_iterate_agent_counters(agent, Some(collect), std::ptr::null_mut()) };
    let mut passes = 0u64;
    // SAFETY: one readable id, a writable count.
    let plan =
        unsafe { kreplay_plan_counter_passes(agent, &one, 1, std::ptr::null_mut(), &mut passes) };
    let mut config = kreplay::abi::CounterConfigId::default();
    // SAFETY: one readable id, a writable configuration.
    let create = unsafe { kreplay_create_counter_config(agent, &one, 1, &mut config) };
    for (what, status) in [("iterate", iterate), ("plan", plan), ("create", create)] {
        assert_eq!(status, Status::ERROR_INVALID_ARGUMENT, "{what}");
    }
}
