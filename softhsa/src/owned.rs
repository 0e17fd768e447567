//! An owned, modifiable copy of an API table, as a runtime hands one to a tools library, in the
//! layout of the ROCm release it imitates.

use hsa_sys::layouts::{AmdExtTableV2, HsaApiTableV3, amd_ext_is_v2, sizes};
use hsa_sys::{
    AmdExtTable, ApiTableVersion, CoreApiTable, FinalizerExtTable, HsaApiTable, ImageExtTable,
};

/// Environment variable choosing the layout of [`OwnedApiTable::softhsa`]: `5.2` (the default),
/// `5.6`, `6.2` or `7`.
pub const TABLE_LAYOUT_ENV: &str = "KREPLAY_SOFTHSA_TABLE";

/// Which ROCm release's API table layout softhsa hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TableLayout {
    /// ROCm 5.2 to 5.4: majors 1, AMD extension table of 400 bytes (the bindings' layout).
    #[default]
    Rocm52,
    /// ROCm 5.6 and 5.7: majors 1, two entries inserted after `hsa_amd_memory_async_copy`
    /// (AMD extension table of 456 bytes).
    Rocm56,
    /// ROCm 6.2 and later: root major 3 (64 bytes), core and AMD extension majors 2, the AMD
    /// extension table in the 5.6 order with the 6.x entries appended (576 bytes).
    Rocm62,
    /// A ROCm 7 runtime of AMD extension interface 1.19: the 6.2 layout with the AMD extension
    /// table grown to `hsa_amd_agent_preload` (656 bytes), `hsa_amd_memory_async_batch_copy`
    /// and `hsa_amd_ais_file_read` included (softhsa's other 7.x entries are null).
    Rocm7,
}

impl TableLayout {
    /// Every layout.
    pub const ALL: [TableLayout; 4] = [
        TableLayout::Rocm52,
        TableLayout::Rocm56,
        TableLayout::Rocm62,
        TableLayout::Rocm7,
    ];

    /// The value of [`TABLE_LAYOUT_ENV`] that selects this layout.
    pub fn name(self) -> &'static str {
        match self {
            TableLayout::Rocm52 => "5.2",
            TableLayout::Rocm56 => "5.6",
            TableLayout::Rocm62 => "6.2",
            TableLayout::Rocm7 => "7",
        }
    }

    /// Parses a [`TABLE_LAYOUT_ENV`] value.
    pub fn parse(value: &str) -> Result<Self, String> {
        TableLayout::ALL
            .into_iter()
            .find(|l| l.name() == value.trim())
            .ok_or_else(|| {
                format!("{TABLE_LAYOUT_ENV}={value:?} is not a table layout (5.2, 5.6, 6.2 or 7)")
            })
    }

    /// The layout [`TABLE_LAYOUT_ENV`] selects; unset means [`TableLayout::Rocm52`].
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(TABLE_LAYOUT_ENV) {
            Ok(value) => TableLayout::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(TableLayout::default()),
            Err(e) => Err(format!("{TABLE_LAYOUT_ENV}: {e}")),
        }
    }
}

/// The AMD extension table in one of its two orders.
enum AmdTable {
    V1(Box<AmdExtTable>),
    V2(Box<AmdExtTableV2>),
}

/// A root `HsaApiTable` with its own copies of the core, AMD-extension, finalizer and image
/// tables, the root pointing at those copies.
///
/// This is what the real runtime passes to a tools library's `OnLoad`: a table the tool may
/// modify in place (replacing entries with wrappers), which the application then calls through.
/// Boxed so the root's pointers stay valid wherever the value moves.
///
/// ```
/// use kreplay_softhsa::{OwnedApiTable, TableLayout};
/// let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
/// let root: *mut hsa_sys::HsaApiTable = table.as_mut_ptr();
/// // SAFETY: `root` points into `table`, which is alive.
/// unsafe {
///     assert_eq!((*root).version.major_id, 3);
///     assert_eq!((*(*root).amd_ext_).version.minor_id, 576);
/// }
/// ```
pub struct OwnedApiTable {
    root: Box<HsaApiTableV3>,
    core: Box<CoreApiTable>,
    amd: AmdTable,
    finalizer: Box<FinalizerExtTable>,
    image: Box<ImageExtTable>,
}

impl std::fmt::Debug for OwnedApiTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedApiTable").finish_non_exhaustive()
    }
}

/// A `T` with the first `min(len, size_of T)` bytes of `*src`, the rest zero; the empty table
/// when `src` is null.
///
/// # Safety
/// `src` is null or points to `len` readable bytes; all-zero is a valid `T`.
unsafe fn copy_prefix<T: Default>(src: *const u8, len: usize) -> T {
    let mut out = T::default();
    if !src.is_null() {
        let len = len.min(std::mem::size_of::<T>());
        // SAFETY: per the caller; `out` has room for `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, (&raw mut out).cast::<u8>(), len) };
    }
    out
}

/// The size a table declares in its version header (0 for a null table).
///
/// # Safety
/// `table` is null or points to a readable version header.
unsafe fn declared(table: *const ApiTableVersion) -> usize {
    if table.is_null() {
        0
    } else {
        // SAFETY: non-null and readable per the caller.
        unsafe { (*table).minor_id as usize }
    }
}

fn version(major: u32, size: u32, step: u32) -> ApiTableVersion {
    ApiTableVersion {
        major_id: major,
        minor_id: size,
        step_id: step,
        reserved: 0,
    }
}

impl OwnedApiTable {
    /// A copy of softhsa's own table, in the layout [`TABLE_LAYOUT_ENV`] selects (a value it
    /// does not know is reported on stderr, and the default layout used).
    pub fn softhsa() -> Self {
        let layout = TableLayout::from_env().unwrap_or_else(|why| {
            eprintln!("softhsa: {why}; using the ROCm 5.2 layout");
            TableLayout::default()
        });
        Self::softhsa_with(layout)
    }

    /// A copy of softhsa's own table in the layout of `layout`'s releases.
    pub fn softhsa_with(layout: TableLayout) -> Self {
        // SAFETY: softhsa's table and its sub-tables are valid for the life of the process.
        let mut owned = unsafe { Self::copy_of(crate::api_table()) };
        match layout {
            TableLayout::Rocm52 => {}
            TableLayout::Rocm56 => {
                // ROCm 5.6's table ends with the dma-buf entries: nothing of 6.x exists.
                let full = crate::api::amd_table_v2();
                let mut amd = AmdExtTableV2::default();
                // SAFETY: both are tables of nullable entries; only the first 456 bytes (the
                // 5.6 table) are copied.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (&raw const full).cast::<u8>(),
                        (&raw mut amd).cast::<u8>(),
                        sizes::AMD_5_6 as usize,
                    )
                };
                amd.version = version(1, sizes::AMD_5_6, 0);
                owned.set_amd(AmdTable::V2(Box::new(amd)));
            }
            TableLayout::Rocm62 | TableLayout::Rocm7 => {
                let mut amd = crate::api::amd_table_v2();
                amd.version = if layout == TableLayout::Rocm7 {
                    version(2, sizes::AMD_7_PRELOAD, 0x0b)
                } else {
                    // Nothing past 6.2's entries exists there.
                    amd.hsa_amd_memory_async_batch_copy_fn = None;
                    amd.hsa_amd_ais_file_read_fn = None;
                    version(2, sizes::AMD_6_2, 3)
                };
                owned.set_amd(AmdTable::V2(Box::new(amd)));
                owned.root.version = version(3, sizes::ROOT_6_2, 1);
                owned.core.version.major_id = 2;
                owned.finalizer.version.major_id = 2;
                owned.image.version.major_id = 2;
            }
        }
        owned
    }

    /// A copy of `table` and of every sub-table it points to, each as long as it declares
    /// (up to the longest layout softhsa knows), in whichever layout it has.
    ///
    /// # Safety
    /// `table` must be a valid root at least as long as its `minor_id` says, and each of its
    /// sub-table pointers null or valid for the size its own `minor_id` declares.
    pub unsafe fn copy_of(table: &HsaApiTable) -> Self {
        let root_ptr = std::ptr::from_ref(table).cast::<u8>();
        // SAFETY: forwarded from the caller.
        let owned = unsafe {
            let root: HsaApiTableV3 = copy_prefix(root_ptr, table.version.minor_id as usize);
            let core = table.core_.cast::<u8>();
            let amd = table.amd_ext_;
            let finalizer = table.finalizer_ext_.cast::<u8>();
            let image = table.image_ext_.cast::<u8>();
            let amd = if !amd.is_null() && amd_ext_is_v2(&(*amd).version) {
                AmdTable::V2(Box::new(copy_prefix(amd.cast(), declared(amd.cast()))))
            } else {
                AmdTable::V1(Box::new(copy_prefix(amd.cast(), declared(amd.cast()))))
            };
            OwnedApiTable {
                root: Box::new(root),
                core: Box::new(copy_prefix(core, declared(core.cast()))),
                amd,
                finalizer: Box::new(copy_prefix(finalizer, declared(finalizer.cast()))),
                image: Box::new(copy_prefix(image, declared(image.cast()))),
            }
        };
        let mut owned = owned;
        owned.root.core_ = &mut *owned.core;
        owned.root.finalizer_ext_ = &mut *owned.finalizer;
        owned.root.image_ext_ = &mut *owned.image;
        owned.point_at_amd();
        owned
    }

    fn set_amd(&mut self, amd: AmdTable) {
        self.amd = amd;
        self.point_at_amd();
    }

    fn point_at_amd(&mut self) {
        self.root.amd_ext_ = match &mut self.amd {
            AmdTable::V1(t) => &mut **t,
            // The root's field has the bound type; the table behind it is in the 5.6+ order,
            // as on those runtimes (its version says so).
            AmdTable::V2(t) => (&mut **t as *mut AmdExtTableV2).cast(),
        };
    }

    /// The root table, to hand to a tools library's `OnLoad` (which may modify it).
    pub fn as_mut_ptr(&mut self) -> *mut HsaApiTable {
        (&mut *self.root as *mut HsaApiTableV3).cast()
    }

    /// The root table, to call through. Its `amd_ext_` may be in the ROCm 5.6+ order (see its
    /// version): read it with [`hsa_sys::layouts::read_amd_ext_as_v1`] to call by name.
    pub fn table(&self) -> &HsaApiTable {
        // SAFETY: `HsaApiTableV3` starts with the fields of `HsaApiTable`, in the same order and
        // layout (asserted in hsa-sys), and is at least as long.
        unsafe { &*(&*self.root as *const HsaApiTableV3).cast::<HsaApiTable>() }
    }
}
