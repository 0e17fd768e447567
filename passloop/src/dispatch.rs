//! What the loop knows about the dispatch it replays.

/// Plain mirror of kreplay.h's `kreplay_kernel_dispatch_info_t` (without its `size` and padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DispatchInfo {
    /// The agent (device) the dispatch runs on.
    pub agent_id: u64,
    /// The queue the dispatch was submitted to.
    pub queue_id: u64,
    /// The kernel being dispatched.
    pub kernel_id: u64,
    /// The dispatch; one id is used for every pass.
    pub dispatch_id: u64,
    /// Private (scratch) segment bytes per work-item.
    pub private_segment_size: u32,
    /// Group (LDS) segment bytes per work-group.
    pub group_segment_size: u32,
    /// Work-group size, x/y/z.
    pub workgroup_size: [u32; 3],
    /// Grid size, x/y/z.
    pub grid_size: [u32; 3],
}
