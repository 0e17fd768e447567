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

use std::collections::BTreeSet;

use parking_lot::Mutex;

/// Disjoint groups of agents linked by grants (each with two or more agents).
#[derive(Debug, Default)]
pub(crate) struct Peers {
    groups: Mutex<Vec<BTreeSet<u64>>>,
}

impl Peers {
    /// Links `agents` (and everything already linked to any of them) into one group.
    pub(crate) fn link(&self, agents: &[u64]) {
        if agents.len() < 2 {
            return;
        }
        let mut groups = self.groups.lock();
        let mut merged: BTreeSet<u64> = agents.iter().copied().collect();
        groups.retain(|g| {
            if g.iter().any(|a| merged.contains(a)) {
                merged.extend(g.iter().copied());
                false
            } else {
                true
            }
        });
        groups.push(merged);
    }

    /// The agents replayed together with `agent`, in handle order (`agent` alone when it shares
    /// memory with no other).
    pub(crate) fn group(&self, agent: u64) -> Vec<u64> {
        self.groups
            .lock()
            .iter()
            .find(|g| g.contains(&agent))
            .map_or_else(|| vec![agent], |g| g.iter().copied().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_without_grants_is_its_own_group() {
        let p = Peers::default();
        assert_eq!(p.group(7), [7]);
        p.link(&[7]);
        assert_eq!(p.group(7), [7], "a grant to the owner alone links nothing");
    }

    #[test]
    fn grants_link_agents_transitively_and_leave_others_apart() {
        let p = Peers::default();
        p.link(&[30, 10]);
        p.link(&[50, 40]);
        assert_eq!(p.group(10), [10, 30]);
        assert_eq!(p.group(40), [40, 50]);
        assert_eq!(p.group(20), [20]);
        p.link(&[30, 40]);
        for a in [10, 30, 40, 50] {
            assert_eq!(p.group(a), [10, 30, 40, 50], "agent {a}");
        }
        assert_eq!(p.group(20), [20]);
    }
}
