//! GPU agents whose kernels may write each other's memory, replayed as one group.
//!
//! A replay on one agent snapshots that agent's memory (and what its dispatch points into), and
//! its restores write it back. A kernel of *another* agent that was granted access to that
//! memory (`hsa_amd_agents_allow_access`, or `hsa_amd_vmem_set_access` on a mapping: ROCm's peer
//! access) can write it while the replay runs; the next restore would then undo that write, and
//! the replay's drain, which waits for its own agent's queues only, would not wait for such a
//! kernel already running. So agents that share memory through a grant form a group: a replay on
//! any of them takes the writer side of every agent of the group (in handle order) and drains the
//! queues of them all, and ordinary dispatches of the others, which take their own agent's reader
//! side, wait for it. Agents with no grant between them never block each other.
//!
//! A grant links the GPU agents it names and the GPU agent owning the memory (memory the CPU owns
//! links the GPUs granted it with each other). Groups only grow: a grant is never taken back.

/// The groups (see `kreplay_locks::AgentGroups`), keyed by agent handle.
pub(crate) type Peers = kreplay_locks::AgentGroups;
