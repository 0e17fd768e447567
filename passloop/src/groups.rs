//! Splitting requested counters into the fewest passes.
//!
//! A device counts events in blocks, and each block can count only a few counters in one pass.
//! A requested counter occupies one or more hardware counters (a derived counter occupies the
//! hardware counters it is computed from, which must be counted in the same pass). A group is
//! valid when, for every block, the distinct hardware counters its members occupy fit the
//! block's limit. [`plan_groups`] finds the fewest valid groups covering every request: exactly
//! for the small sets profilers ask for (up to 64 distinct requests, a search of at most 200,000
//! steps per candidate count), first-fit otherwise.

use std::collections::BTreeSet;
use std::fmt;

/// A hardware counter: the block it is counted in and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HardwareCounter {
    /// Index into the limits given to [`plan_groups`].
    pub block: usize,
    /// The counter's id (unique across blocks).
    pub id: u32,
}

/// Why counters cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// Request `request` alone needs `needs` counters of `block`, which counts `limit` per pass.
    DoesNotFit {
        /// Index of the request.
        request: usize,
        /// The block.
        block: usize,
        /// Its per-pass limit.
        limit: u32,
        /// What the request needs of it.
        needs: usize,
    },
    /// A hardware counter names a block without a limit.
    UnknownBlock(usize),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::DoesNotFit {
                request,
                block,
                limit,
                needs,
            } => write!(
                f,
                "counter {request} needs {needs} counters of block {block}, which counts at most \
                 {limit} per pass"
            ),
            PlanError::UnknownBlock(b) => write!(f, "block {b} has no per-pass limit"),
        }
    }
}

impl std::error::Error for PlanError {}

/// The groups (each a list of request indices, in request order) that cover every request in
/// the fewest passes (found exactly for up to 64 requests, within a bounded search; beyond
/// that, or where the search runs out, first-fit's). `requests[i]` lists the hardware counters request `i` occupies;
/// `limits[b]` is block `b`'s per-pass limit. Requests occupying the same hardware counters
/// share them. An empty request list gives no groups.
pub fn plan_groups(
    requests: &[Vec<HardwareCounter>],
    limits: &[u32],
) -> Result<Vec<Vec<usize>>, PlanError> {
    let needs: Vec<BTreeSet<HardwareCounter>> = requests
        .iter()
        .map(|r| r.iter().copied().collect())
        .collect();
    for (request, need) in needs.iter().enumerate() {
        for hw in need {
            let limit = *limits
                .get(hw.block)
                .ok_or(PlanError::UnknownBlock(hw.block))?;
            let in_block = need.iter().filter(|h| h.block == hw.block).count();
            if in_block > limit as usize {
                return Err(PlanError::DoesNotFit {
                    request,
                    block: hw.block,
                    limit,
                    needs: in_block,
                });
            }
        }
    }
    if needs.is_empty() {
        return Ok(Vec::new());
    }
    // Largest requests first.
    let mut order: Vec<usize> = (0..needs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(needs[i].len()));
    let mut best = first_fit(&needs, &order, limits);
    let lower = lower_bound(&needs, limits);
    // The exact search recurses once per request: beyond EXACT_MOST requests it would go deep
    // enough to overflow a thread's stack, and first-fit stands.
    let mut k = if needs.len() <= EXACT_MOST {
        lower
    } else {
        best.len()
    };
    while k < best.len() {
        // Each candidate count gets the whole budget: one spent proving a smaller count
        // impossible must not leave the next count unsearched.
        let mut budget = SEARCH_BUDGET;
        let mut groups: Vec<BTreeSet<HardwareCounter>> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        match search(
            &needs,
            &order,
            limits,
            k,
            0,
            &mut groups,
            &mut members,
            &mut budget,
        ) {
            Some(true) => {
                best = members;
                break;
            }
            Some(false) => k += 1,
            None => break,
        }
    }
    for group in &mut best {
        group.sort_unstable();
    }
    best.sort();
    Ok(best)
}

fn fits(
    group: &BTreeSet<HardwareCounter>,
    need: &BTreeSet<HardwareCounter>,
    limits: &[u32],
) -> bool {
    need.iter().all(|hw| {
        let used = group.union(need).filter(|h| h.block == hw.block).count();
        used <= limits[hw.block] as usize
    })
}

fn first_fit(
    needs: &[BTreeSet<HardwareCounter>],
    order: &[usize],
    limits: &[u32],
) -> Vec<Vec<usize>> {
    let mut groups: Vec<BTreeSet<HardwareCounter>> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for &i in order {
        match groups.iter().position(|g| fits(g, &needs[i], limits)) {
            Some(g) => {
                groups[g].extend(needs[i].iter().copied());
                members[g].push(i);
            }
            None => {
                groups.push(needs[i].clone());
                members.push(vec![i]);
            }
        }
    }
    members
}

/// No plan has fewer groups: every block's distinct counters, spread at `limit` per pass.
fn lower_bound(needs: &[BTreeSet<HardwareCounter>], limits: &[u32]) -> usize {
    let all: BTreeSet<HardwareCounter> = needs.iter().flatten().copied().collect();
    limits
        .iter()
        .enumerate()
        .map(|(b, &limit)| {
            let n = all.iter().filter(|h| h.block == b).count();
            n.div_ceil(limit.max(1) as usize)
        })
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The most requests the exact search takes on (its recursion is one level per request).
const EXACT_MOST: usize = 64;
/// Search nodes per candidate pass count.
const SEARCH_BUDGET: u32 = 200_000;

/// Places `order[at..]` into at most `k` groups. `Some(true)`: found (in `members`);
/// `Some(false)`: impossible; `None`: the search budget ran out.
#[allow(clippy::too_many_arguments)]
fn search(
    needs: &[BTreeSet<HardwareCounter>],
    order: &[usize],
    limits: &[u32],
    k: usize,
    at: usize,
    groups: &mut Vec<BTreeSet<HardwareCounter>>,
    members: &mut Vec<Vec<usize>>,
    budget: &mut u32,
) -> Option<bool> {
    if at == order.len() {
        return Some(true);
    }
    *budget = budget.checked_sub(1)?;
    let i = order[at];
    for g in 0..groups.len() {
        if fits(&groups[g], &needs[i], limits) {
            let before = groups[g].clone();
            groups[g].extend(needs[i].iter().copied());
            members[g].push(i);
            if search(needs, order, limits, k, at + 1, groups, members, budget)? {
                return Some(true);
            }
            members[g].pop();
            groups[g] = before;
        }
    }
    // A new group (all empty groups are alike: try one).
    if groups.len() < k {
        groups.push(needs[i].clone());
        members.push(vec![i]);
        if search(needs, order, limits, k, at + 1, groups, members, budget)? {
            return Some(true);
        }
        groups.pop();
        members.pop();
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw(block: usize, id: u32) -> HardwareCounter {
        HardwareCounter { block, id }
    }

    fn valid(requests: &[Vec<HardwareCounter>], limits: &[u32], groups: &[Vec<usize>]) {
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..requests.len()).collect::<Vec<_>>(), "each once");
        for g in groups {
            let used: BTreeSet<HardwareCounter> = g
                .iter()
                .flat_map(|&i| requests[i].iter().copied())
                .collect();
            for (b, &limit) in limits.iter().enumerate() {
                assert!(used.iter().filter(|h| h.block == b).count() <= limit as usize);
            }
        }
    }

    #[test]
    fn counters_of_one_block_fill_passes_up_to_its_limit() {
        // Nine counters of a block counting 4 per pass: 3 passes.
        let requests: Vec<_> = (0..9).map(|i| vec![hw(0, i)]).collect();
        let groups = plan_groups(&requests, &[4]).unwrap();
        assert_eq!(groups.len(), 3);
        valid(&requests, &[4], &groups);
    }

    #[test]
    fn blocks_count_side_by_side_in_one_pass() {
        let requests = vec![
            vec![hw(0, 0)],
            vec![hw(1, 10)],
            vec![hw(0, 1)],
            vec![hw(1, 11)],
        ];
        let groups = plan_groups(&requests, &[2, 2]).unwrap();
        assert_eq!(groups, vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn derived_counters_share_their_inputs_and_the_plan_is_minimal() {
        // Limit 2 in block 0. Derived a = {0,1}, b = {2,3}; c = {0}, d = {3}. First-fit by
        // size puts a and b apart and c, d with them: 2 passes, the minimum.
        let requests = vec![
            vec![hw(0, 0), hw(0, 1)],
            vec![hw(0, 2), hw(0, 3)],
            vec![hw(0, 0)],
            vec![hw(0, 3)],
        ];
        let groups = plan_groups(&requests, &[2]).unwrap();
        assert_eq!(groups.len(), 2);
        valid(&requests, &[2], &groups);
    }

    #[test]
    fn plans_reach_the_minimum_number_of_passes() {
        let requests = vec![
            vec![hw(0, 0), hw(0, 1)],
            vec![hw(0, 2), hw(0, 3)],
            vec![hw(0, 4), hw(0, 5)],
            vec![hw(0, 1), hw(0, 2)],
        ];
        // Distinct counters: 6, limit 3 -> at least 2; {0,1}+{1,2} = {0,1,2}, {2,3}+{4,5} is 4:
        // no 2-pass plan exists, so 3 is minimal and must not be exceeded.
        let groups = plan_groups(&requests, &[3]).unwrap();
        valid(&requests, &[3], &groups);
        assert_eq!(groups.len(), 3);
        let requests = vec![
            vec![hw(0, 0), hw(0, 1)],
            vec![hw(0, 2), hw(0, 3)],
            vec![hw(0, 4)],
            vec![hw(0, 5)],
            vec![hw(0, 0)],
            vec![hw(0, 3)],
        ];
        let groups = plan_groups(&requests, &[3]).unwrap();
        valid(&requests, &[3], &groups);
        assert_eq!(groups.len(), 2);
    }

    #[test]
    fn a_request_that_cannot_fit_any_pass_is_an_error_naming_the_limit() {
        let requests = vec![vec![hw(0, 0)], vec![hw(0, 1), hw(0, 2), hw(0, 3)]];
        let err = plan_groups(&requests, &[2]).unwrap_err();
        assert_eq!(
            err,
            PlanError::DoesNotFit {
                request: 1,
                block: 0,
                limit: 2,
                needs: 3
            }
        );
        assert!(err.to_string().contains("at most 2 per pass"));
        assert_eq!(
            plan_groups(&[vec![hw(5, 0)]], &[2]),
            Err(PlanError::UnknownBlock(5))
        );
        assert_eq!(plan_groups(&[], &[2]), Ok(vec![]));
    }
}
