//! The trackers of this process and the ranges each follows.
//!
//! The kernel lets a tracker register addresses another tracker still holds only once the
//! other's registration ended with its mapping (unmapped, mapped over, moved). Both trackers'
//! requests then reach the same page tables: the older one would read the newer one's written
//! pages as its own (its memory was replaced, every byte of it may differ) and, protecting
//! them, hide the newer one's writes. So a tracker entering here tells every tracker that
//! follows any of its addresses that its memory there is gone.

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Where a tracker's memory was found replaced (the first such range), once it was.
pub(crate) type Lost = Arc<OnceLock<Range<usize>>>;

struct Holder {
    /// Sorted, disjoint, page-aligned.
    ranges: Vec<Range<usize>>,
    lost: Lost,
}

/// The process the holders belong to (a forked child starts over: the trackers it inherited
/// refuse there anyway) and the holders.
static LIVE: Mutex<(u32, Vec<Holder>)> = Mutex::new((0, Vec::new()));

/// A tracker registered with the kernel now follows `ranges` (sorted, disjoint): every other
/// tracker following any of them learns its memory there was replaced. Returns the new
/// tracker's own handle.
pub(crate) fn enter(ranges: &[Range<usize>]) -> Lost {
    let lost = Lost::default();
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    if live.0 != pid {
        *live = (pid, Vec::new());
    }
    for holder in &live.1 {
        if let Some(overlap) = first_overlap(&holder.ranges, ranges) {
            let _ = holder.lost.set(overlap);
        }
    }
    live.1.push(Holder {
        ranges: ranges.to_vec(),
        lost: lost.clone(),
    });
    lost
}

/// The tracker holding `lost` stops following (it is dropped in the process that made it).
pub(crate) fn leave(lost: &Lost) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.1.retain(|holder| !Arc::ptr_eq(&holder.lost, lost));
}

/// The first range both `a` and `b` (each sorted and disjoint) hold.
fn first_overlap(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Range<usize>> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            return Some(start..end);
        }
        if a[i].end <= b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_overlap_of_two_sorted_lists_is_found_wherever_it_lies() {
        let a = [0..10, 20..30, 40..50];
        assert_eq!(first_overlap(&a, &[10..20, 29..41]), Some(29..30));
        assert_eq!(first_overlap(&a, &[10..20, 30..40, 50..60]), None);
        assert_eq!(first_overlap(&a, &[45..46, 60..70]), Some(45..46));
        assert_eq!(first_overlap(&[], &a), None);
    }
}
