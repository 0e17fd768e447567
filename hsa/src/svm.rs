//! Shared virtual memory (`hsa_amd_svm_attributes_set`): ranges of the process's host memory
//! made accessible to agents (as managed memory may be where XNACK is off). The runtime
//! keeps no allocation there (`hsa_amd_pointer_info` says unknown), so the argument scan would
//! take a pointer into such a range for a plain number; the kernel may write the range, and it
//! may migrate, so no snapshot holds it. Ranges granted to an agent are remembered here, and a
//! dispatch whose arguments point into one is declined (`untracked_memory`, `crate::reach`).
//! Ranges are never forgotten (the memory is freed without a runtime call): a stale range only
//! declines a dispatch pointing into it while it is still mapped in the process.

use std::collections::BTreeMap;
use std::ffi::c_void;

use hsa_sys::*;
use parking_lot::Mutex;

use crate::backend::{backend, guarded};
use crate::original::forward;

/// Ranges granted to an agent: base to size, not overlapping (overlaps are merged).
#[derive(Default)]
pub(crate) struct SvmRanges {
    ranges: Mutex<BTreeMap<u64, u64>>,
}

impl SvmRanges {
    /// The ranges' lock, for the fork set (`crate::fork`).
    pub(crate) fn fork_lock(&self) -> crate::fork::Lock<'_> {
        &self.ranges
    }

    /// The range containing `addr`, as (base, size).
    pub(crate) fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        crate::reach::range_containing(&self.ranges.lock(), addr)
    }

    fn add(&self, base: u64, size: u64) {
        let mut ranges = self.ranges.lock();
        let (mut start, mut end) = (base, base.saturating_add(size));
        // Merge with every range that overlaps or touches [start, end).
        let touching: Vec<(u64, u64)> = ranges
            .range(..=end)
            .filter(|&(&b, &s)| b.saturating_add(s) >= start)
            .map(|(&b, &s)| (b, s))
            .collect();
        for (b, s) in touching {
            ranges.remove(&b);
            start = start.min(b);
            end = end.max(b.saturating_add(s));
        }
        ranges.insert(start, end - start);
    }
}

/// Whether an attribute list grants some agent access to the range.
fn grants_access(pairs: &[hsa_amd_svm_attribute_pair_t]) -> bool {
    pairs.iter().any(|p| {
        p.attribute == u64::from(HSA_AMD_SVM_ATTRIB_AGENT_ACCESSIBLE)
            || p.attribute == u64::from(HSA_AMD_SVM_ATTRIB_AGENT_ACCESSIBLE_IN_PLACE)
    })
}

/// Wrapper of `hsa_amd_svm_attributes_set`: remembers ranges granted to an agent.
pub(crate) unsafe extern "C" fn attributes_set(
    ptr: *mut c_void,
    size: usize,
    attributes: *mut hsa_amd_svm_attribute_pair_t,
    count: usize,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_svm_attributes_set_fn(ptr, size, attributes, count)
        );
        if status == HSA_STATUS_SUCCESS
            && !b.is_finalized()
            && !ptr.is_null()
            && size > 0
            && !attributes.is_null()
        {
            // SAFETY: the runtime accepted the call, so `attributes` holds `count` pairs.
            let pairs = unsafe { std::slice::from_raw_parts(attributes, count) };
            if grants_access(pairs) {
                b.svm.add(ptr as u64, size as u64);
            }
        }
        status
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_and_touching_ranges_merge() {
        let r = SvmRanges::default();
        r.add(0x10000, 0x1000);
        r.add(0x12000, 0x1000);
        assert_eq!(r.containing(0x11000), None);
        r.add(0x10800, 0x1800);
        assert_eq!(r.containing(0x12fff), Some((0x10000, 0x3000)));
        assert_eq!(r.containing(0x13000), None);
        assert_eq!(r.containing(0xffff), None);
    }
}
