//! Agents whose kernels may write each other's memory, locked together.
//!
//! A replay on one agent holds that agent's writer side and drains its queues. When a kernel of
//! *another* agent may write the replayed agent's memory (peer access), that kernel could run
//! between the replay's snapshot and its restores, which would undo its writes. So agents that
//! share memory form a group: a replay on any of them takes the writer side of every agent of
//! the group, in ascending key order (the order every replay uses, so two replays of one group
//! never wait for each other crosswise), and drains them all; ordinary work on the others, which
//! takes its own agent's reader side, then waits for it. Agents with no link between them never
//! block each other. Groups only grow: a link is never taken back.

use std::collections::BTreeSet;

use parking_lot::Mutex;

/// Disjoint groups of agents linked by shared memory (each with two or more agents).
#[derive(Debug, Default)]
pub struct AgentGroups {
    groups: Mutex<Vec<BTreeSet<u64>>>,
}

impl AgentGroups {
    /// No links.
    pub fn new() -> AgentGroups {
        AgentGroups::default()
    }

    /// Links `agents` (and everything already linked to any of them) into one group.
    pub fn link(&self, agents: &[u64]) {
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
        if merged.len() > 1 {
            groups.push(merged);
        }
    }

    /// The agents locked together with `agent`, in ascending order (`agent` alone when it
    /// shares memory with no other).
    pub fn group(&self, agent: u64) -> Vec<u64> {
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
    fn an_agent_without_links_is_its_own_group() {
        let p = AgentGroups::new();
        assert_eq!(p.group(7), [7]);
        p.link(&[7]);
        p.link(&[7, 7]);
        assert_eq!(p.group(7), [7], "a link to itself links nothing");
    }

    #[test]
    fn links_join_agents_transitively_and_leave_others_apart() {
        let p = AgentGroups::new();
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
