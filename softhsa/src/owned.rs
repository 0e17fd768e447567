//! An owned, modifiable copy of an API table, as a runtime hands one to a tools library.

use hsa_sys::{AmdExtTable, CoreApiTable, FinalizerExtTable, HsaApiTable, ImageExtTable};

/// A root `HsaApiTable` with its own copies of the core, AMD-extension, finalizer and image
/// tables, the root pointing at those copies.
///
/// This is what the real runtime passes to a tools library's `OnLoad`: a table the tool may
/// modify in place (replacing entries with wrappers), which the application then calls through.
/// Boxed so the root's pointers stay valid wherever the value moves.
///
/// ```
/// let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
/// let root: *mut hsa_sys::HsaApiTable = table.as_mut_ptr();
/// // SAFETY: `root` points into `table`, which is alive.
/// assert!(unsafe { !(*root).core_.is_null() });
/// ```
pub struct OwnedApiTable {
    root: Box<HsaApiTable>,
    core: Box<CoreApiTable>,
    amd: Box<AmdExtTable>,
    finalizer: Box<FinalizerExtTable>,
    image: Box<ImageExtTable>,
}

impl std::fmt::Debug for OwnedApiTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedApiTable").finish_non_exhaustive()
    }
}

/// Copies `*src`, or gives the empty table when `src` is null.
///
/// # Safety
/// `src` is null or points to a valid `T`.
unsafe fn copy_or_default<T: Copy + Default>(src: *const T) -> T {
    if src.is_null() {
        T::default()
    } else {
        // SAFETY: non-null and valid per the caller.
        unsafe { *src }
    }
}

impl OwnedApiTable {
    /// A copy of softhsa's own table.
    pub fn softhsa() -> Self {
        // SAFETY: softhsa's table and its sub-tables are valid for the life of the process.
        unsafe { Self::copy_of(crate::api_table()) }
    }

    /// A copy of `table` and of every sub-table it points to.
    ///
    /// # Safety
    /// `table`'s sub-table pointers must each be null or valid.
    pub unsafe fn copy_of(table: &HsaApiTable) -> Self {
        // SAFETY: forwarded from the caller.
        let (core, amd, finalizer, image) = unsafe {
            (
                Box::new(copy_or_default(table.core_)),
                Box::new(copy_or_default(table.amd_ext_)),
                Box::new(copy_or_default(table.finalizer_ext_)),
                Box::new(copy_or_default(table.image_ext_)),
            )
        };
        let mut owned = OwnedApiTable {
            root: Box::new(*table),
            core,
            amd,
            finalizer,
            image,
        };
        owned.root.core_ = &mut *owned.core;
        owned.root.amd_ext_ = &mut *owned.amd;
        owned.root.finalizer_ext_ = &mut *owned.finalizer;
        owned.root.image_ext_ = &mut *owned.image;
        owned
    }

    /// The root table, to hand to a tools library's `OnLoad` (which may modify it).
    pub fn as_mut_ptr(&mut self) -> *mut HsaApiTable {
        &mut *self.root
    }

    /// The root table, to call through.
    pub fn table(&self) -> &HsaApiTable {
        &self.root
    }
}
