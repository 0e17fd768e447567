//! GPU agents whose kernels may write each other's memory, replayed as one group, and the agents
//! a replay locks for the memory its dispatch reaches.
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
//! A grant links the GPU agents it names and the GPU agent owning the memory. A grant of memory
//! the CPU owns links nothing: such memory (system memory, locked host memory) is in a snapshot
//! only when the dispatch's arguments point into it, and then [`replay_agents`] adds every GPU
//! (any of them may write it) to that one replay's agents instead of tying the GPUs together for
//! good. Groups only grow: a grant is never taken back.

use std::collections::BTreeSet;

use kreplay_snapshot::Filter;

use crate::backend::Backend;

/// The groups (see `kreplay_locks::AgentGroups`), keyed by agent handle.
pub(crate) type Peers = kreplay_locks::AgentGroups;

/// The agents a replay on `agent` locks and drains, ascending: the agent's group, and for each
/// owner in `owners` (of the memory the dispatch's arguments point into) the group of that GPU,
/// or of every GPU when the owner is not a GPU (the CPU, or none the runtime names).
pub(crate) fn replay_agents(
    b: &Backend,
    agent: u64,
    owners: impl IntoIterator<Item = u64>,
) -> Vec<u64> {
    let mut agents: BTreeSet<u64> = b.peers.group(agent).into_iter().collect();
    let mut every_gpu = false;
    let mut gpus: Vec<u64> = Vec::new();
    for owner in owners {
        if agents.contains(&owner) || gpus.contains(&owner) {
            continue;
        }
        if b.gpus().contains(&owner) {
            gpus.push(owner);
        } else {
            every_gpu = true;
        }
    }
    if every_gpu {
        gpus.extend_from_slice(b.gpus());
    }
    for gpu in gpus {
        if !agents.contains(&gpu) {
            agents.extend(b.peers.group(gpu));
        }
    }
    agents.into_iter().collect()
}

/// The owners of the tracked memory `filter` reaches through the dispatch's arguments.
pub(crate) fn reached_owners(b: &Backend, filter: &Filter) -> Vec<u64> {
    filter
        .reached()
        .filter_map(|addr| b.inventory.lookup(addr))
        .filter(|a| a.kind.is_reachable())
        .map(|a| a.owner_agent)
        .collect()
}
