//! What one launch's snapshot covers (SPEC rules 2 and 3 on CUDA).
//!
//! * **Scope.** `KREPLAY_SNAPSHOT_SCOPE=agent` (the default) starts from every tracked
//!   allocation of the launch's device; `referenced` starts from nothing. Both add the writable
//!   module-scope variables of the launched function's module ([`crate::globals`]) and what the
//!   kernel arguments point into.
//! * **Kernel arguments.** Each parameter's bytes are scanned for 8-byte aligned values (aligned
//!   in the parameter buffer, where the kernel sees them): with `kernelParams`, parameter `i`
//!   is `cuFuncGetParamInfo`'s offset and size of parameter `i` (CUDA 12.4 and later); with
//!   `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER`), the whole buffer. A value inside a tracked
//!   allocation selects that allocation, whatever its device (inside a VMM mapping, under
//!   `referenced`, every writable mapping contiguous with it too: `MemoryWatch::mapped_runs`); a value inside one of the
//!   module's variables is covered already; a value the driver knows as memory kreplay does not
//!   track (`cuPointerGetAttribute`; pageable host memory only on a device that writes it
//!   directly, see [`untracked_kind`]) declines the launch (`untracked_memory`); any other
//!   value is a plain number.
//! * When the parameter layout is unknown (an older driver, or the driver refuses to describe
//!   the function), `kernelParams` cannot be scanned: `referenced` then falls back to the agent
//!   scope for that launch (warned once), never to a narrower snapshot.
//!
//! The limit, as on HSA: memory reached only through pointers stored in memory (a pointer
//! table in a buffer) is invisible to the scan; under `agent` scope it is still covered when
//! it is the device's own memory.

use std::ffi::c_void;

use kreplay_snapshot::{Filter, Inventory, RegionSource};

use crate::driver::{
    CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_UNIFIED,
};
use crate::globals::Range;

/// What an argument value the driver knows as memory of `kind` (`CU_MEMORYTYPE_*`) is, when it
/// declines the launch; `None` when it does not. `has_range`: the driver named the allocation
/// holding it; `tracked`: that allocation is one kreplay tracks (the value is then past the size
/// asked for, inside the driver's rounding: an end pointer). Host memory without an allocation
/// range is pageable memory the driver merely sees: most likely a plain number that happens to
/// be a host address, and out of a kernel's reach, unless the device reads and writes pageable
/// memory directly (`pageable`: HMM, or ATS on Grace Hopper), where a kernel given it may write
/// it and no snapshot holds it.
pub fn untracked_kind(
    kind: u32,
    has_range: bool,
    tracked: bool,
    pageable: bool,
) -> Option<&'static str> {
    if tracked {
        return None;
    }
    Some(match kind {
        CU_MEMORYTYPE_HOST if !has_range && !pageable => return None,
        CU_MEMORYTYPE_HOST if !has_range => {
            "pageable host memory, which this device writes directly (pageable memory access)"
        }
        CU_MEMORYTYPE_HOST => "page-locked host memory",
        CU_MEMORYTYPE_DEVICE => "device memory not allocated through a tracked call",
        CU_MEMORYTYPE_ARRAY => "a CUDA array",
        CU_MEMORYTYPE_UNIFIED => "managed memory",
        _ => "memory of an unknown type",
    })
}

/// [`untracked_kind`] of an argument value `addr` the driver knows as memory of `kind` whose
/// range starts at `start`, where `end` says the value is one past a tracked allocation or a
/// covered variable (see [`launch_filter`]): such an end pointer inside the range it ends (the
/// driver's rounding past an allocation's size, the rest of a module's data) is nothing a
/// kernel writes; only memory that begins at it is other memory.
pub fn untracked_at(
    addr: u64,
    end: bool,
    kind: u32,
    start: Option<u64>,
    tracked: bool,
    pageable: bool,
) -> Option<&'static str> {
    if end && start != Some(addr) {
        return None;
    }
    untracked_kind(kind, start.is_some(), tracked, pageable)
}

/// Values below this are never addresses, and the 8-byte values at every 4-byte aligned
/// position of a parameter (the snapshot crate's, shared with the HSA backend's scan).
pub use kreplay_snapshot::{MIN_ADDRESS, aligned_values};
/// `CU_LAUNCH_PARAM_END`.
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`.
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// `CU_LAUNCH_PARAM_BUFFER_SIZE`.
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
/// The most key/value pairs of an `extra` array read before giving up on its end marker.
const MAX_EXTRA_PAIRS: usize = 64;

/// One parameter of a function: its offset in the parameter buffer and its size.
pub type Param = (usize, usize);

/// Why a launch's arguments could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgumentsUnknown {
    /// `kernelParams` was given but the function's parameter layout is unknown.
    NoLayout,
    /// The `extra` array is malformed (why).
    BadExtra(String),
}

/// The candidate addresses among a launch's arguments.
///
/// # Safety
/// `params` and `extra` are the `kernelParams` and `extra` of a launch call in progress, and
/// `layout`, when given, describes the launched function's parameters (so `params` has that
/// many entries, each pointing to at least its parameter's size in bytes).
pub unsafe fn argument_values(
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    layout: Option<&[Param]>,
) -> Result<Vec<u64>, ArgumentsUnknown> {
    let mut out = Vec::new();
    if !params.is_null() {
        let layout = layout.ok_or(ArgumentsUnknown::NoLayout)?;
        for (i, &(offset, size)) in layout.iter().enumerate() {
            // SAFETY: params has an entry per parameter (the caller's promise).
            let p = unsafe { *params.add(i) };
            if p.is_null() || size == 0 {
                continue;
            }
            // SAFETY: each entry points to the parameter's value, `size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
            aligned_values(bytes, offset, &mut out);
        }
        return Ok(out);
    }
    if extra.is_null() {
        return Ok(out);
    }
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), None::<usize>);
    let mut ended = false;
    for pair in 0..MAX_EXTRA_PAIRS {
        // SAFETY: `extra` is a key/value array ended by CU_LAUNCH_PARAM_END (the driver accepted
        // it for this launch); reading stops at the end marker.
        let key = unsafe { *extra.add(2 * pair) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            ended = true;
            break;
        }
        // SAFETY: as above, every key other than the end marker is followed by its value.
        let value = unsafe { *extra.add(2 * pair + 1) };
        match key {
            CU_LAUNCH_PARAM_BUFFER_POINTER => buffer = value as *const u8,
            CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                size = Some(unsafe { *(value as *const usize) });
            }
            _ => {}
        }
    }
    if !ended {
        return Err(ArgumentsUnknown::BadExtra(format!(
            "no end marker within {MAX_EXTRA_PAIRS} pairs"
        )));
    }
    match (buffer.is_null(), size) {
        (true, _) => {}
        (false, Some(len)) => {
            // SAFETY: the launch's argument buffer of `len` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(buffer, len) };
            aligned_values(bytes, 0, &mut out);
        }
        (false, None) => {
            return Err(ArgumentsUnknown::BadExtra(
                "a buffer pointer without its size".into(),
            ));
        }
    }
    Ok(out)
}

/// What a launch's snapshot filter became, with what it adds to the starting scope.
#[derive(Clone, Debug)]
pub struct Scoped {
    /// The filter.
    pub filter: Filter,
    /// Bytes of the distinct allocations the arguments reached.
    pub referenced_bytes: u64,
    /// Bytes of the module variables covered.
    pub variable_bytes: u64,
}

/// The filter of one launch: `base` (the scope's start), the module's writable variables and
/// what the argument `values` point into. `known(v, end)` says whether the driver knows an
/// address kreplay does not track as memory (`Some(what it is)`: the launch is declined);
/// `end` is true where `v` is one past a tracked allocation or a covered variable (an end
/// pointer), where only memory the driver says begins at `v` itself is another allocation.
pub fn launch_filter(
    base: Filter,
    inventory: &Inventory,
    variables: &[Range],
    values: &[u64],
    known: impl Fn(u64, bool) -> Option<String>,
) -> Result<Scoped, String> {
    let mut filter = base;
    let mut variable_bytes = 0;
    for &(addr, size) in variables {
        filter = filter.vouch(addr, size, RegionSource::ModuleVariable);
        variable_bytes += size;
    }
    let mut reached: Vec<(u64, u64)> = Vec::new();
    for &v in values {
        if let Some(a) = inventory.lookup(v) {
            if a.kind.is_reachable() && !reached.iter().any(|(b, _)| *b == a.base) {
                reached.push((a.base, a.size));
                filter = filter.reach(v, RegionSource::Referenced);
            }
            continue;
        }
        if variables
            .iter()
            .any(|&(b, s)| v >= b && v < b.saturating_add(s))
        {
            continue;
        }
        // One past an allocation's or a variable's end (an end pointer): a kernel may walk back
        // from it, so the allocation it ends is reached too; other memory that begins there is
        // the driver's to say.
        let ends = inventory.ending_at(v);
        if let Some(a) = ends.filter(|a| a.kind.is_reachable())
            && !reached.iter().any(|(b, _)| *b == a.base)
        {
            reached.push((a.base, a.size));
            filter = filter.reach(a.base, RegionSource::Referenced);
        }
        let end = ends.is_some() || variables.iter().any(|&(b, s)| b.saturating_add(s) == v);
        if let Some(what) = known(v, end) {
            return Err(format!(
                "a kernel argument points into memory kreplay does not track at {v:#x} ({what}); \
                 the launch runs once"
            ));
        }
    }
    Ok(Scoped {
        filter,
        referenced_bytes: reached.iter().map(|(_, s)| s).sum(),
        variable_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pageable_host_memory_declines_only_where_the_device_can_write_it() {
        // A host address without an allocation range: a plain number where the device cannot
        // reach pageable memory; memory a kernel may write where it can (HMM, ATS).
        assert_eq!(
            untracked_kind(CU_MEMORYTYPE_HOST, false, false, false),
            None
        );
        let why = untracked_kind(CU_MEMORYTYPE_HOST, false, false, true).expect("declined");
        assert!(why.contains("pageable"), "{why}");
        // Page-locked host memory, foreign device memory, arrays and managed memory decline
        // either way; the rounding past a tracked allocation never does.
        for kind in [
            CU_MEMORYTYPE_HOST,
            CU_MEMORYTYPE_DEVICE,
            CU_MEMORYTYPE_ARRAY,
            CU_MEMORYTYPE_UNIFIED,
        ] {
            for pageable in [false, true] {
                assert!(untracked_kind(kind, true, false, pageable).is_some());
                assert_eq!(untracked_kind(kind, true, true, pageable), None);
            }
        }
    }
    use kreplay_snapshot::{MemoryKind, NewAllocation};

    fn inventory() -> Inventory {
        let inv = Inventory::new();
        for (base, size, owner) in [
            (0x10_0000, 0x1000, 0),
            (0x20_0000, 0x2000, 0),
            (0x30_0000, 0x100, 1),
        ] {
            inv.on_alloc(NewAllocation {
                base,
                size,
                owner_agent: owner,
                kind: MemoryKind::CoarseDevice,
            });
        }
        inv
    }

    #[test]
    fn values_are_read_at_aligned_positions_of_the_parameter_buffer() {
        let mut out = Vec::new();
        // A parameter at offset 2: its first 4-byte aligned window starts 2 bytes in, and a
        // pointer at 4 bytes past that (a packed struct's) is read too.
        let mut bytes = vec![0u8; 2];
        bytes.extend_from_slice(&[0u8; 4]);
        bytes.extend_from_slice(&0x10_0010u64.to_ne_bytes());
        aligned_values(&bytes, 2, &mut out);
        assert!(out.contains(&0x10_0010), "{out:x?}");
        assert!(
            out.iter().all(|&v| v == 0x10_0010 || v >> 32 != 0),
            "only whole 4-byte aligned windows: {out:x?}"
        );
        out.clear();
        aligned_values(&[1, 0, 0, 0, 0, 0, 0, 0], 0, &mut out);
        assert!(out.is_empty(), "small numbers are never addresses");
    }

    #[test]
    fn kernel_params_are_scanned_by_layout_and_refused_without_one() {
        let mut a = 0x10_0040u64;
        let mut n = 7u32;
        let mut b = 0x30_0000u64;
        let mut params: [*mut c_void; 3] = [
            (&raw mut a).cast(),
            (&raw mut n).cast(),
            (&raw mut b).cast(),
        ];
        let layout = [(0, 8), (8, 4), (16, 8)];
        // SAFETY: three parameters as the layout says, alive for the call.
        let v =
            unsafe { argument_values(params.as_mut_ptr(), std::ptr::null_mut(), Some(&layout)) };
        assert_eq!(v, Ok(vec![0x10_0040, 0x30_0000]));
        // SAFETY: as above.
        let v = unsafe { argument_values(params.as_mut_ptr(), std::ptr::null_mut(), None) };
        assert_eq!(v, Err(ArgumentsUnknown::NoLayout));
    }

    #[test]
    fn a_pointer_inside_a_packed_struct_parameter_is_read() {
        // `struct __attribute__((packed)) { uint32_t n; float *x; uint32_t pad; }` by value:
        // one 16-byte parameter whose pointer sits at offset 4 (it was never read).
        let mut packed = [0u8; 16];
        packed[0..4].copy_from_slice(&64u32.to_ne_bytes());
        packed[4..12].copy_from_slice(&0x20_0010u64.to_ne_bytes());
        let mut params: [*mut c_void; 1] = [packed.as_mut_ptr().cast()];
        // SAFETY: one parameter of 16 bytes, alive for the call.
        let v =
            unsafe { argument_values(params.as_mut_ptr(), std::ptr::null_mut(), Some(&[(0, 16)])) };
        assert!(v.as_ref().is_ok_and(|v| v.contains(&0x20_0010)), "{v:x?}");
    }

    #[test]
    fn an_extra_buffer_is_scanned_whole() {
        let mut buffer = [0u64; 3];
        buffer[1] = 0x20_0008;
        let mut size: usize = 24;
        let mut extra: [*mut c_void; 5] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buffer.as_mut_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&raw mut size).cast(),
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: a well-formed extra array over a live buffer.
        let v = unsafe { argument_values(std::ptr::null_mut(), extra.as_mut_ptr(), None) };
        assert!(v.as_ref().is_ok_and(|v| v.contains(&0x20_0008)), "{v:x?}");
        extra[2] = CU_LAUNCH_PARAM_END as *mut c_void;
        // SAFETY: as above, now without the size.
        let v = unsafe { argument_values(std::ptr::null_mut(), extra.as_mut_ptr(), None) };
        assert!(matches!(v, Err(ArgumentsUnknown::BadExtra(_))));
    }

    #[test]
    fn referenced_scope_selects_what_arguments_and_variables_reach_and_nothing_else() {
        let inv = inventory();
        let s = launch_filter(
            Filter::referenced_only(0),
            &inv,
            &[(0x7000_0000, 16)],
            &[0x20_0010, 0x30_0000, 0x20_0000, 123_456_789, 0x7000_0004],
            |_, _| None,
        )
        .unwrap();
        assert_eq!(s.referenced_bytes, 0x2000 + 0x100);
        assert_eq!(s.variable_bytes, 16);
        let agent = inv.select(&Filter::for_replay(0));
        assert_eq!(
            agent.len(),
            2,
            "the agent scope would take both of device 0's"
        );
    }

    #[test]
    fn an_argument_into_memory_the_driver_knows_and_kreplay_does_not_declines() {
        let inv = inventory();
        let why = launch_filter(Filter::for_replay(0), &inv, &[], &[0x50_0000], |v, _| {
            (v == 0x50_0000).then(|| "device memory".to_string())
        })
        .unwrap_err();
        assert!(
            why.contains("0x500000") && why.contains("does not track"),
            "{why}"
        );
    }

    /// A driver that knows device memory ranges kreplay does not track (base, size), asked the
    /// way the backend asks it.
    fn driver_knowing(
        inv: &Inventory,
        ranges: &[(u64, u64)],
    ) -> impl Fn(u64, bool) -> Option<String> {
        let ranges = ranges.to_vec();
        let tracked: Vec<(u64, u64)> = inv
            .select(&Filter::for_replay(0))
            .iter()
            .map(|r| (r.base, r.size))
            .collect();
        move |v, end| {
            let start = ranges
                .iter()
                .chain(tracked.iter())
                .find(|&&(b, s)| v >= b && v < b + s)
                .map(|&(b, _)| b)?;
            let is_tracked = tracked.iter().any(|&(b, _)| b == start);
            untracked_at(v, end, CU_MEMORYTYPE_DEVICE, Some(start), is_tracked, false)
                .map(str::to_owned)
        }
    }

    #[test]
    fn an_end_pointer_where_untracked_memory_begins_declines() {
        // Device 0's tracked allocation ends at 0x20_2000; memory kreplay does not track (say
        // opened from another process) begins right there.
        let inv = inventory();
        let known = driver_knowing(&inv, &[(0x20_2000, 0x1000)]);
        let why =
            launch_filter(Filter::referenced_only(0), &inv, &[], &[0x20_2000], known).unwrap_err();
        assert!(why.contains("0x202000"), "{why}");
    }

    #[test]
    fn an_end_pointer_reaches_the_allocation_it_ends_and_declines_nothing_else() {
        let inv = inventory();
        // Nothing at the end pointer: the allocation it ends is reached (a kernel may walk
        // back from it; it was taken for a number), and nothing is declined.
        let s = launch_filter(
            Filter::referenced_only(0),
            &inv,
            &[],
            &[0x20_2000],
            driver_knowing(&inv, &[]),
        )
        .unwrap();
        assert_eq!(s.referenced_bytes, 0x2000);
        // The driver rounded the allocation up: its range (starting at the tracked base) goes
        // on past the end pointer: still no decline.
        let rounded = |v: u64, end: bool| {
            let start = (0x20_0000..0x20_4000).contains(&v).then_some(0x20_0000);
            untracked_at(v, end, CU_MEMORYTYPE_DEVICE, start, start.is_some(), false)
                .map(str::to_owned)
        };
        let s =
            launch_filter(Filter::referenced_only(0), &inv, &[], &[0x20_2000], rounded).unwrap();
        assert_eq!(s.referenced_bytes, 0x2000);
        // Given with its start too, it is counted once.
        let s = launch_filter(
            Filter::referenced_only(0),
            &inv,
            &[],
            &[0x20_0000, 0x20_2000],
            driver_knowing(&inv, &[]),
        )
        .unwrap();
        assert_eq!(s.referenced_bytes, 0x2000);
    }

    #[test]
    fn a_value_one_past_a_variable_is_covered_only_as_an_end_pointer() {
        let inv = inventory();
        let var = (0x7000_0000u64, 0x100u64);
        let past = var.0 + var.1;
        // Other memory kreplay does not track begins right after the variable: declined.
        let why = launch_filter(
            Filter::referenced_only(0),
            &inv,
            &[var],
            &[past],
            driver_knowing(&inv, &[(past, 0x100)]),
        )
        .unwrap_err();
        assert!(why.contains("does not track"), "{why}");
        // The module's data goes on past the variable (one range from before it): an end
        // pointer, nothing to write.
        let module_data = |v: u64, end: bool| {
            let start = (0x7000_0000..0x7001_0000)
                .contains(&v)
                .then_some(0x6fff_0000);
            untracked_at(v, end, CU_MEMORYTYPE_DEVICE, start, false, false).map(str::to_owned)
        };
        let s = launch_filter(
            Filter::referenced_only(0),
            &inv,
            &[var],
            &[past],
            module_data,
        )
        .unwrap();
        assert_eq!(s.variable_bytes, 0x100);
    }
}
