//! The image extension (`hsa_ext_image_*`, what HIP arrays, textures and surfaces are on ROCm):
//! its writes fenced against replays, and image handles resolved to the memory they name.
//!
//! An image's data is memory the application allocated from an agent's pool and created the
//! image over (`hsa_ext_image_create`, `_create_with_layout`, and `hsa_amd_image_create` of the
//! AMD extension, which takes a device-specific layout); kreplay remembers each image's
//! handle with its data's address and agent from a successful create to a successful destroy,
//! or to the free of the allocation holding its data (an image over freed memory is dead; a
//! free the runtime refuses leaves its images known).
//!
//! * **Writes.** `hsa_ext_image_import` (host to image), `_copy` (image to image) and `_clear`
//!   write an image's data, and `_export` reads it into memory that may be tracked; each is
//!   fenced for the length of the call like `hsa_memory_copy` (`crate::copies`): it takes the
//!   reader side of the agent it names, of the GPU owning the image's data (and, for a copy or
//!   an export, the other end's), and of every GPU when the memory written is tracked memory the
//!   CPU owns. The write of an image kreplay never saw created (made before kreplay was
//!   installed) waits for a replay on any GPU. From inside a
//!   replay window, what such a write changed is found by comparison (`crate::fold`): kreplay
//!   does not know an image's pitches, so it never takes a region as written whole.
//! * **Reach.** A kernel receives an image as its handle, and on ROCm the handle is the address
//!   of the image's resource descriptor, not an address inside its data. A kernel argument equal
//!   to a known image handle reaches the image's data (`crate::reach`), so the snapshot holds it
//!   whatever its kind or owner, and the agents a replay holds include its owner; the handle
//!   itself is not taken for an address of untracked memory. A kernel may also find a handle in
//!   memory (a HIP texture or surface object is a pointer to a descriptor in device memory),
//!   which no argument scan sees; an image can be used only by kernels of the agent it was
//!   created for, so a replay on an agent reaches the data of every image created for it.
//!
//! Only where the runtime's table has an image extension table (`image_ext_` non-null, major 1
//! or 2, as ROCm 5.x and 6.x/7.x lay it out) and only over the entries inside the size it
//! declares.

use std::collections::HashMap;
use std::ffi::c_void;

use hsa_sys::*;
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};
use crate::copies::{Fence, owner, write_agents};
use crate::original::forward;

/// Where one image's data lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ImageData {
    /// The address the image was created over.
    pub(crate) data: u64,
    /// The agent it was created for, the only one whose kernels can use it.
    pub(crate) agent: u64,
}

/// The runtime's own image entries and the images created since installation.
#[derive(Default)]
pub(crate) struct Images {
    /// The runtime's image extension table as it was before installation (entries past its
    /// declared size null); `None` without one.
    original: Option<ImageExtTable>,
    /// Its declared size in bytes.
    size: usize,
    by_handle: Mutex<HashMap<u64, ImageData>>,
}

// SAFETY: the table holds only function pointers into the runtime, callable from any thread and
// never changed after the copy.
unsafe impl Send for Images {}
// SAFETY: see `Send`; shared access only reads the function pointers (the map is behind a lock).
unsafe impl Sync for Images {}

impl Images {
    /// The images' lock, for the fork set (`crate::fork`).
    pub(crate) fn fork_lock(&self) -> crate::fork::Lock<'_> {
        &self.by_handle
    }

    /// Copies the runtime's image extension table, if the root has one kreplay knows.
    ///
    /// # Safety
    /// `table` points to a valid root table whose `image_ext_`, if non-null and inside the size
    /// the root declares, points to a table at least as long as its `minor_id` says.
    pub(crate) unsafe fn capture(table: *const HsaApiTable) -> Images {
        // SAFETY: per the caller.
        let root = unsafe { &*table };
        let inside_root = std::mem::offset_of!(HsaApiTable, image_ext_) + 8;
        if (root.version.minor_id as usize) < inside_root || root.image_ext_.is_null() {
            return Images::default();
        }
        // SAFETY: non-null, and valid per the caller.
        let version = unsafe { (*root.image_ext_).version };
        if !(1..=2).contains(&version.major_id) {
            return Images::default();
        }
        let size = (version.minor_id as usize).min(std::mem::size_of::<ImageExtTable>());
        let mut copy = ImageExtTable::default();
        // SAFETY: the runtime's table holds `minor_id` readable bytes (per the caller), of which
        // at most `size_of::<ImageExtTable>()` are copied; all-zero entries are null.
        unsafe {
            std::ptr::copy_nonoverlapping(
                root.image_ext_.cast::<u8>(),
                (&raw mut copy).cast::<u8>(),
                size,
            )
        };
        Images {
            original: Some(copy),
            size,
            by_handle: Mutex::default(),
        }
    }

    /// The runtime's image entries (null where it has none).
    fn table(&self) -> ImageExtTable {
        self.original.unwrap_or_default()
    }

    /// Whether the runtime's table has the entry at byte `offset`.
    fn has(&self, offset: usize) -> bool {
        self.original.is_some() && offset + 8 <= self.size
    }

    /// The data of the image whose handle is `handle`, if kreplay saw it created.
    pub(crate) fn data_of(&self, handle: u64) -> Option<ImageData> {
        if handle == 0 {
            return None;
        }
        let map = self.by_handle.lock();
        if map.is_empty() {
            return None;
        }
        map.get(&handle).copied()
    }

    /// Forgets the images whose data lies in `[base, end)`, memory being freed: an image
    /// over freed memory is dead, and its data address may soon be another allocation's.
    /// Returns them, by handle, for [`reinstate`](Self::reinstate) should the free be refused.
    pub(crate) fn forget_within(&self, base: u64, end: u64) -> Vec<(u64, ImageData)> {
        let mut map = self.by_handle.lock();
        if map.is_empty() {
            return Vec::new();
        }
        let within: Vec<(u64, ImageData)> = map
            .iter()
            .filter(|(_, image)| (base..end).contains(&image.data))
            .map(|(&handle, &image)| (handle, image))
            .collect();
        for (handle, _) in &within {
            map.remove(handle);
        }
        within
    }

    /// Knows again the images [`forget_within`](Self::forget_within) returned: the free of
    /// their memory was refused, so they are alive still. A handle known again meanwhile (an
    /// image created since) keeps what is known of it now.
    pub(crate) fn reinstate(&self, images: Vec<(u64, ImageData)>) {
        if images.is_empty() {
            return;
        }
        let mut map = self.by_handle.lock();
        for (handle, image) in images {
            map.entry(handle).or_insert(image);
        }
    }

    /// The data of every image created for `agent`.
    pub(crate) fn data_of_agent(&self, agent: u64) -> Vec<u64> {
        let map = self.by_handle.lock();
        map.values()
            .filter(|i| i.agent == agent)
            .map(|i| i.data)
            .collect()
    }

    fn created(
        &self,
        status: hsa_status_t,
        agent: hsa_agent_t,
        image: *mut hsa_ext_image_t,
        data: *const c_void,
    ) {
        if status != HSA_STATUS_SUCCESS || image.is_null() {
            return;
        }
        // SAFETY: the runtime wrote the handle through the application's non-null pointer.
        let handle = unsafe { image.read_unaligned() }.handle;
        self.by_handle.lock().insert(
            handle,
            ImageData {
                data: data as u64,
                agent: agent.handle,
            },
        );
    }
}

/// Writes a wrapper over each image entry the runtime has.
///
/// # Safety
/// `table` is the table `images` was captured from, writable.
pub(crate) unsafe fn install_wrappers(table: *mut HsaApiTable, images: &Images) {
    if images.original.is_none() {
        return;
    }
    // SAFETY: the caller's table; `capture` found its image table non-null.
    let image = unsafe { (*table).image_ext_.cast::<u8>() };
    macro_rules! wrap {
        ($($entry:ident = $wrapper:expr),* $(,)?) => {$({
            let offset = std::mem::offset_of!(ImageExtTable, $entry);
            if images.has(offset) && images.table().$entry.is_some() {
                let mut typed = ImageExtTable::default();
                typed.$entry = Some($wrapper);
                // SAFETY: the entry lies inside the size the runtime declares for its image
                // table (checked), and `typed.$entry` has the entry's type.
                unsafe { crate::layout::write_entry(image, offset, typed.$entry) };
            }
        })*};
    }
    wrap!(
        hsa_ext_image_create_fn = image_create,
        hsa_ext_image_create_with_layout_fn = image_create_with_layout,
        hsa_ext_image_destroy_fn = image_destroy,
        hsa_ext_image_import_fn = image_import,
        hsa_ext_image_export_fn = image_export,
        hsa_ext_image_copy_fn = image_copy,
        hsa_ext_image_clear_fn = image_clear,
    );
}

/// Calls the runtime's own image entry with the application's arguments.
macro_rules! forward_image {
    ($b:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        match $b.images.table().$entry {
            // SAFETY: the runtime's own entry point, called with the application's arguments
            // unchanged, under the HSA contract the application's call was made under.
            Some(f) => unsafe { f($($arg),*) },
            None => HSA_STATUS_ERROR,
        }
    }};
}

/// The GPU agents a write into `dst` (an image's data or host memory) waits for: the agent the
/// call names and the owners of `ends` (see `crate::copies::write_agents`); every GPU when an
/// image of the call is unknown.
fn agents_of(
    b: &Backend,
    agent: hsa_agent_t,
    ends: &[Option<*const c_void>],
    dst: *const c_void,
) -> Vec<u64> {
    if ends.iter().any(Option::is_none) {
        return b.gpus().to_vec();
    }
    let touched = std::iter::once(Some(agent))
        .chain(ends.iter().map(|p| p.and_then(|p| owner(b, p))))
        .flatten();
    write_agents(b, touched, dst)
}

/// The data of `image` as a pointer, if kreplay knows the image.
fn data(b: &Backend, image: hsa_ext_image_t) -> Option<*const c_void> {
    b.images
        .data_of(image.handle)
        .map(|d| d.data as *const c_void)
}

/// An image write (`forward`) fenced for the length of the call on the agents `agents` names,
/// while any replay may be in progress; compared only from inside a window (a region's pitches
/// are unknown, so it is never taken as written whole).
fn fenced(
    b: &Backend,
    agents: impl FnOnce() -> Vec<u64>,
    forward: impl FnOnce() -> hsa_status_t,
) -> hsa_status_t {
    if crate::copies::unfenced(b) {
        return forward();
    }
    let _fence = Fence::enter(b, &agents());
    forward()
}

pub(crate) unsafe extern "C" fn image_create(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward_image!(
            b,
            hsa_ext_image_create_fn(agent, desc, data, permission, image)
        );
        b.images.created(status, agent, image, data);
        status
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn image_create_with_layout(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    layout: hsa_ext_image_data_layout_t,
    row_pitch: usize,
    slice_pitch: usize,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward_image!(
            b,
            hsa_ext_image_create_with_layout_fn(
                agent,
                desc,
                data,
                permission,
                layout,
                row_pitch,
                slice_pitch,
                image
            )
        );
        b.images.created(status, agent, image, data);
        status
    })
}

/// Wrapper of `hsa_amd_image_create` (an image over `data` with a device-specific layout, in
/// the AMD extension table): remembered like the extension's own creates, so a kernel given its
/// handle reaches its data and writes into it are fenced for the agents they concern.
pub(crate) unsafe extern "C" fn amd_image_create(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    layout: *const hsa_amd_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_image_create_fn(agent, desc, layout, data, permission, image)
        );
        b.images.created(status, agent, image, data);
        status
    })
}

pub(crate) unsafe extern "C" fn image_destroy(
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward_image!(b, hsa_ext_image_destroy_fn(agent, image));
        if status == HSA_STATUS_SUCCESS {
            b.images.by_handle.lock().remove(&image.handle);
        }
        status
    })
}

pub(crate) unsafe extern "C" fn image_import(
    agent: hsa_agent_t,
    src: *const c_void,
    row_pitch: usize,
    slice_pitch: usize,
    dst: hsa_ext_image_t,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || {
            forward_image!(
                b,
                hsa_ext_image_import_fn(agent, src, row_pitch, slice_pitch, dst, region)
            )
        };
        fenced(
            b,
            || {
                let to = data(b, dst);
                agents_of(b, agent, &[to, Some(src)], to.unwrap_or(std::ptr::null()))
            },
            forward,
        )
    })
}

pub(crate) unsafe extern "C" fn image_export(
    agent: hsa_agent_t,
    src: hsa_ext_image_t,
    dst: *mut c_void,
    row_pitch: usize,
    slice_pitch: usize,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || {
            forward_image!(
                b,
                hsa_ext_image_export_fn(agent, src, dst, row_pitch, slice_pitch, region)
            )
        };
        fenced(
            b,
            || agents_of(b, agent, &[data(b, src), Some(dst.cast_const())], dst),
            forward,
        )
    })
}

pub(crate) unsafe extern "C" fn image_copy(
    agent: hsa_agent_t,
    src: hsa_ext_image_t,
    src_offset: *const hsa_dim3_t,
    dst: hsa_ext_image_t,
    dst_offset: *const hsa_dim3_t,
    range: *const hsa_dim3_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || {
            forward_image!(
                b,
                hsa_ext_image_copy_fn(agent, src, src_offset, dst, dst_offset, range)
            )
        };
        fenced(
            b,
            || {
                let (from, to) = (data(b, src), data(b, dst));
                agents_of(b, agent, &[from, to], to.unwrap_or(std::ptr::null()))
            },
            forward,
        )
    })
}

pub(crate) unsafe extern "C" fn image_clear(
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
    value: *const c_void,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || forward_image!(b, hsa_ext_image_clear_fn(agent, image, value, region));
        fenced(
            b,
            || {
                let to = data(b, image);
                agents_of(b, agent, &[to], to.unwrap_or(std::ptr::null()))
            },
            forward,
        )
    })
}
