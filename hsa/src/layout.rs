//! Which release laid out the API table kreplay is handed, checked before anything is read
//! through it or written into it.
//!
//! Each table starts with an `ApiTableVersion`: `major_id` changes when entries move, and
//! `minor_id` holds the size in bytes the runtime was built with. kreplay accepts only the
//! shapes of the releases it knows (see `docs/rocm.md`):
//!
//! | release       | root       | core        | AMD extension | AMD order         |
//! |---------------|------------|-------------|---------------|-------------------|
//! | ROCm 5.2–5.4  | 1, 48      | 1, 1016     | 1, 400        | 5.2 (the bindings) |
//! | ROCm 5.5      | 1, 48      | 1, 1016     | 1, 424        | 5.2               |
//! | ROCm 5.6–5.7  | 1, 48      | 1, 1016     | 1, 456        | 5.6               |
//! | ROCm 6.0      | 2, 48      | 2, ≥ 1016   | 2, ≥ 552      | 5.6, appended     |
//! | ROCm 6.1–7.x  | 3, ≥ 56    | 2, ≥ 1016   | 2, ≥ 552      | 5.6, appended     |
//!
//! Majors 2 and 3 only ever grow by appending, so a larger size is accepted there, and an entry
//! is used only when it lies inside the size the runtime declares (offset + 8 ≤ `minor_id`).
//! Anything else is refused with one message that names what was seen.

use std::fmt;

use hsa_sys::layouts::{AmdExtTableV2, sizes};
use hsa_sys::*;

/// The order of the AMD extension table's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmdOrder {
    /// ROCm 5.2 to 5.5: the order of the bindings ([`hsa_sys::AmdExtTable`]).
    Rocm52,
    /// ROCm 5.6 and later: [`hsa_sys::layouts::AmdExtTableV2`] (two entries inserted after
    /// `hsa_amd_memory_async_copy`, later ones appended).
    Rocm56,
}

/// One table's version header as the runtime filled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Version {
    /// `major_id`.
    pub major: u32,
    /// `minor_id`: the table's size in bytes.
    pub size: u32,
    /// `step_id`.
    pub step: u32,
}

impl From<ApiTableVersion> for Version {
    fn from(v: ApiTableVersion) -> Self {
        Version {
            major: v.major_id,
            size: v.minor_id,
            step: v.step_id,
        }
    }
}

/// The shape of an accepted table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableShape {
    /// The root `HsaApiTable`.
    pub root: Version,
    /// `core_`.
    pub core: Version,
    /// `amd_ext_`.
    pub amd: Version,
    /// How the AMD extension table is ordered.
    pub amd_order: AmdOrder,
    /// The releases that hand out this shape.
    pub release: &'static str,
}

impl TableShape {
    /// Whether an AMD extension entry at byte `offset` exists in this runtime's table.
    pub(crate) fn amd_has(&self, offset: usize) -> bool {
        offset + 8 <= self.amd.size as usize
    }

    /// Whether a core entry at byte `offset` exists in this runtime's table.
    pub(crate) fn core_has(&self, offset: usize) -> bool {
        offset + 8 <= self.core.size as usize
    }
}

/// What was seen, for messages: "root 3/64/1, core 2/1016/0, AMD extension 2/576/3".
struct Seen(Version, Option<Version>, Option<Version>);

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |f: &mut fmt::Formatter<'_>, name: &str, v: Option<Version>| match v {
            Some(v) => write!(
                f,
                "{name} major {} size {} step {}",
                v.major, v.size, v.step
            ),
            None => write!(f, "{name} absent"),
        };
        one(f, "root", Some(self.0))?;
        f.write_str(", ")?;
        one(f, "core", self.1)?;
        f.write_str(", ")?;
        one(f, "AMD extension", self.2)
    }
}

/// "root major 3 size 64 step 1, core major 2 size 1016 step 0, AMD extension major 2 size 576
/// step 3".
pub(crate) fn describe(shape: &TableShape) -> String {
    Seen(shape.root, Some(shape.core), Some(shape.amd)).to_string()
}

fn refuse(seen: Seen, why: &str) -> String {
    format!(
        "unsupported HSA API table ({seen}): {why}; kreplay knows the tables of ROCm 5.2 to 7.x \
         (docs/rocm.md), so the application runs without it"
    )
}

/// Checks the table's shape before kreplay reads or writes anything else in it.
///
/// # Safety
/// `table` is null or points to a readable `HsaApiTable` root whose `core_` and `amd_ext_` are
/// null or point to readable tables at least as long as their `minor_id` says (what the runtime
/// hands a tools library's `OnLoad`).
pub unsafe fn inspect(table: *const HsaApiTable) -> Result<TableShape, String> {
    if table.is_null() {
        return Err("the HSA API table is null".into());
    }
    // SAFETY: non-null and readable per the caller; the version header is the first 16 bytes
    // of every root table.
    let root: Version = unsafe { (*table).version }.into();
    let seen_root = Seen(root, None, None);
    let root_ok = match root.major {
        1 | 2 => root.size == sizes::ROOT_5,
        3 => root.size >= sizes::ROOT_6_1 && root.size.is_multiple_of(8),
        _ => return Err(refuse(seen_root, "unknown root table major")),
    };
    if !root_ok {
        return Err(refuse(
            seen_root,
            "the root table's size does not match its major",
        ));
    }
    // SAFETY: the root declares at least 48 bytes (checked), so `core_` (16) and `amd_ext_` (24)
    // lie inside it.
    let (core_ptr, amd_ptr) = unsafe { ((*table).core_, (*table).amd_ext_) };
    if core_ptr.is_null() || amd_ptr.is_null() {
        return Err(refuse(
            seen_root,
            "the root table has no core or no AMD extension table",
        ));
    }
    // SAFETY: both point to readable tables (caller); their version headers come first.
    let (core, amd): (Version, Version) =
        unsafe { ((*core_ptr).version.into(), (*amd_ptr).version.into()) };
    let seen = || Seen(root, Some(core), Some(amd));
    let child_major = if root.major == 1 { 1 } else { 2 };
    if core.major != child_major || amd.major != child_major {
        return Err(refuse(
            seen(),
            &format!(
                "a root table of major {} goes with core and AMD extension tables of major \
                 {child_major}",
                root.major
            ),
        ));
    }
    let core_ok = if child_major == 1 {
        core.size == sizes::CORE
    } else {
        core.size >= sizes::CORE && core.size.is_multiple_of(8)
    };
    if !core_ok {
        return Err(refuse(
            seen(),
            "the core table's size does not match its major",
        ));
    }
    let (amd_order, release) = match (root.major, amd.size) {
        (1, sizes::AMD_5_2) => (AmdOrder::Rocm52, "ROCm 5.2 to 5.4"),
        (1, sizes::AMD_5_5) => (AmdOrder::Rocm52, "ROCm 5.5"),
        (1, sizes::AMD_5_6) => (AmdOrder::Rocm56, "ROCm 5.6 or 5.7"),
        (1, _) => {
            return Err(refuse(
                seen(),
                "an AMD extension table of major 1 is 400 (ROCm 5.2-5.4), 424 (5.5) or 456 \
                 (5.6-5.7) bytes long",
            ));
        }
        (_, size) if size >= sizes::AMD_6_0 && size.is_multiple_of(8) => (
            AmdOrder::Rocm56,
            if root.major == 2 {
                "ROCm 6.0"
            } else {
                "ROCm 6.1 or later"
            },
        ),
        _ => {
            return Err(refuse(
                seen(),
                "an AMD extension table of major 2 is at least 552 bytes long (ROCm 6.0)",
            ));
        }
    };
    Ok(TableShape {
        root,
        core,
        amd,
        amd_order,
        release,
    })
}

/// Copies the runtime's core table: the bytes it declares, at most one `CoreApiTable`; entries
/// past its size stay null.
///
/// # Safety
/// `src` points to a readable core table of `shape.core.size` bytes.
pub(crate) unsafe fn copy_core(src: *const CoreApiTable, shape: &TableShape) -> CoreApiTable {
    // SAFETY: forwarded.
    unsafe { copy_prefix(src.cast(), shape.core.size as usize) }
}

/// Copies the runtime's AMD extension table into the ROCm 5.6+ order, whatever its own order:
/// entries it does not have (past its size, or absent from its layout) stay null.
///
/// # Safety
/// `src` points to a readable AMD extension table of `shape.amd.size` bytes.
pub(crate) unsafe fn copy_amd(src: *const AmdExtTable, shape: &TableShape) -> AmdExtTableV2 {
    let len = shape.amd.size as usize;
    match shape.amd_order {
        AmdOrder::Rocm52 => {
            // SAFETY: forwarded.
            let mut amd = AmdExtTableV2::from_v1(&unsafe { copy_prefix(src.cast(), len) });
            if shape.amd.size != sizes::AMD_5_2 {
                // ROCm 5.5 inserted hsa_amd_spm_* before hsa_amd_queue_cu_get_mask: the bound
                // layout's last slot holds hsa_amd_spm_acquire there.
                amd.hsa_amd_queue_cu_get_mask_fn = None;
            }
            amd
        }
        // SAFETY: forwarded.
        AmdOrder::Rocm56 => unsafe { copy_prefix(src.cast(), len) },
    }
}

/// A `T` whose first `min(len, size_of T)` bytes are copied from `src`, the rest zero (null).
///
/// # Safety
/// `len` bytes are readable at `src`; `T` is a table of nullable entries (all-zero is valid).
unsafe fn copy_prefix<T: Default>(src: *const u8, len: usize) -> T {
    let mut out = T::default();
    let len = len.min(std::mem::size_of::<T>());
    // SAFETY: `len` bytes are readable at `src` (caller) and writable in `out`; no overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, (&raw mut out).cast::<u8>(), len) };
    out
}

/// Where an AMD extension entry lives in the runtime's table: its offset in the ROCm 5.6+
/// order (`offset_of!(AmdExtTableV2, entry)`) mapped to the table's own order. `None` when that
/// order has no such entry.
pub(crate) fn amd_offset(order: AmdOrder, v2_offset: usize) -> Option<usize> {
    // In the 5.2 order, the two entries at 144 and 152 do not exist and everything after them
    // up to hsa_amd_svm_prefetch_async (400 in the 5.6 order) sits 16 bytes earlier.
    const INSERTED: usize = 144;
    const LAST_SHIFTED: usize = 400;
    match order {
        AmdOrder::Rocm56 => Some(v2_offset),
        AmdOrder::Rocm52 if v2_offset < INSERTED => Some(v2_offset),
        AmdOrder::Rocm52 if v2_offset < INSERTED + 16 => None,
        AmdOrder::Rocm52 if v2_offset <= LAST_SHIFTED => Some(v2_offset - 16),
        AmdOrder::Rocm52 => None,
    }
}

// The mapping agrees with the bound 5.2 layout for every entry kreplay uses there.
macro_rules! assert_mapped {
    ($($entry:ident),* $(,)?) => {
        const _: () = {
            $(
                let v2 = std::mem::offset_of!(AmdExtTableV2, $entry);
                let v1 = std::mem::offset_of!(AmdExtTable, $entry);
                assert!(v2 == v1 || (v2 >= 160 && v2 <= 400 && v2 - 16 == v1));
            )*
        };
    };
}
assert_mapped!(
    hsa_amd_profiling_set_profiler_enabled_fn,
    hsa_amd_profiling_get_dispatch_time_fn,
    hsa_amd_profiling_get_async_copy_time_fn,
    hsa_amd_signal_async_handler_fn,
    hsa_amd_memory_pool_get_info_fn,
    hsa_amd_agent_iterate_memory_pools_fn,
    hsa_amd_memory_pool_allocate_fn,
    hsa_amd_memory_pool_free_fn,
    hsa_amd_memory_async_copy_fn,
    hsa_amd_memory_lock_fn,
    hsa_amd_memory_unlock_fn,
    hsa_amd_memory_fill_fn,
    hsa_amd_interop_map_buffer_fn,
    hsa_amd_interop_unmap_buffer_fn,
    hsa_amd_image_create_fn,
    hsa_amd_pointer_info_fn,
    hsa_amd_ipc_memory_attach_fn,
    hsa_amd_ipc_memory_detach_fn,
    hsa_amd_queue_intercept_create_fn,
    hsa_amd_queue_intercept_register_fn,
    hsa_amd_memory_async_copy_rect_fn,
    hsa_amd_memory_lock_to_pool_fn,
    hsa_amd_svm_prefetch_async_fn,
);

/// Writes one entry (a function pointer or null) at `offset` of a table.
///
/// # Safety
/// `table` points to a writable table of at least `offset + 8` bytes whose entry at `offset`
/// has the type of `F` (an `Option` of an `extern "C"` function pointer).
pub(crate) unsafe fn write_entry<F: Copy>(table: *mut u8, offset: usize, entry: F) {
    const { assert!(std::mem::size_of::<F>() == 8) };
    // SAFETY: per the caller; entries are 8-byte aligned in every table layout.
    unsafe { table.add(offset).cast::<F>().write(entry) };
}
