//! The image extension's entry points (`ImageExtTable`), after `hsa_ext_image.h`.
//!
//! Every pointer argument the header says must not be NULL is checked (`INVALID_ARGUMENT`), every
//! region against the image's extent (`INVALID_ARGUMENT` where the header leaves an
//! out-of-bounds region undefined), and image data against the runtime's allocations, so bad
//! input is a status, never a fault. Host memory given to import and export is the
//! application's to keep in bounds, as the header says.

use super::{HsaResult, put, with_runtime};
use crate::image::{DATA_ALIGNMENT, Format, ImageDesc, Layout, extent, geometry_supported};
use crate::runtime::Runtime;
use hsa_sys::*;
use std::ffi::c_void;

/// Every capability an image of a supported format has (linear data, so the layout does not
/// depend on the access permission).
const ALL_CAPABILITIES: u32 = HSA_EXT_IMAGE_CAPABILITY_READ_ONLY
    | HSA_EXT_IMAGE_CAPABILITY_WRITE_ONLY
    | HSA_EXT_IMAGE_CAPABILITY_READ_WRITE
    | HSA_EXT_IMAGE_CAPABILITY_READ_MODIFY_WRITE
    | HSA_EXT_IMAGE_CAPABILITY_ACCESS_INVARIANT_DATA_LAYOUT;

/// Reads a non-null input pointer.
///
/// # Safety
/// A non-null `ptr` points to a readable `T`.
unsafe fn read<T: Copy>(ptr: *const T) -> Result<T, hsa_status_t> {
    if ptr.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and readable per the caller.
    Ok(unsafe { ptr.read_unaligned() })
}

fn check_permission(permission: hsa_access_permission_t) -> HsaResult {
    match permission {
        HSA_ACCESS_PERMISSION_RO | HSA_ACCESS_PERMISSION_WO | HSA_ACCESS_PERMISSION_RW => Ok(()),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

fn check_layout(layout: hsa_ext_image_data_layout_t) -> HsaResult {
    match layout {
        HSA_EXT_IMAGE_DATA_LAYOUT_OPAQUE | HSA_EXT_IMAGE_DATA_LAYOUT_LINEAR => Ok(()),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// The capability mask of `geometry` and `format` on `agent` (0 on the CPU agent).
///
/// # Safety
/// A non-null `format` points to a readable format.
unsafe fn capability(
    rt: &Runtime,
    agent: hsa_agent_t,
    geometry: hsa_ext_image_geometry_t,
    format: *const hsa_ext_image_format_t,
) -> Result<u32, hsa_status_t> {
    rt.agent(agent.handle)?;
    // SAFETY: forwarded from the caller.
    let format = unsafe { read(format) }?;
    let supported = geometry_supported(geometry)?;
    if rt.gpu_agent(agent.handle).is_err() || !supported || Format::of(&format).is_err() {
        return Ok(0);
    }
    Ok(ALL_CAPABILITIES)
}

pub(crate) unsafe extern "C" fn hsa_ext_image_get_capability(
    agent: hsa_agent_t,
    geometry: hsa_ext_image_geometry_t,
    format: *const hsa_ext_image_format_t,
    mask: *mut u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `format` points to a format, `mask` to a uint32_t.
        unsafe { put(mask, capability(rt, agent, geometry, format)?) }
    })
}

pub(crate) unsafe extern "C" fn hsa_ext_image_get_capability_with_layout(
    agent: hsa_agent_t,
    geometry: hsa_ext_image_geometry_t,
    format: *const hsa_ext_image_format_t,
    layout: hsa_ext_image_data_layout_t,
    mask: *mut u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        check_layout(layout)?;
        // SAFETY: HSA contract: `format` points to a format, `mask` to a uint32_t.
        unsafe { put(mask, capability(rt, agent, geometry, format)?) }
    })
}

/// The format, extent and layout an image of `desc` has on `agent`: the opaque layout, or the
/// linear one with the given pitches.
///
/// # Safety
/// A non-null `desc` points to a readable descriptor.
unsafe fn describe(
    rt: &Runtime,
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    permission: hsa_access_permission_t,
    linear: Option<(usize, usize)>,
) -> Result<(Format, [usize; 3], Layout), hsa_status_t> {
    rt.gpu_agent(agent.handle)?;
    // SAFETY: forwarded from the caller.
    let desc = unsafe { read(desc) }?;
    check_permission(permission)?;
    let extent = extent(&desc)?;
    let format = Format::of(&desc.format)?;
    let layout = match linear {
        None => Layout::opaque(extent, format),
        Some((row, slice)) => Layout::linear(extent, format, row, slice)?,
    };
    Ok((format, extent, layout))
}

/// The explicit layout's pitches, where the layout is linear (an opaque one takes none).
fn explicit(
    layout: hsa_ext_image_data_layout_t,
    row: usize,
    slice: usize,
) -> Result<Option<(usize, usize)>, hsa_status_t> {
    check_layout(layout)?;
    Ok((layout == HSA_EXT_IMAGE_DATA_LAYOUT_LINEAR).then_some((row, slice)))
}

fn data_info(layout: Layout) -> hsa_ext_image_data_info_t {
    hsa_ext_image_data_info_t {
        size: layout.size,
        alignment: DATA_ALIGNMENT,
    }
}

pub(crate) unsafe extern "C" fn hsa_ext_image_data_get_info(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    permission: hsa_access_permission_t,
    info: *mut hsa_ext_image_data_info_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `desc` points to a descriptor.
        let (_, _, layout) = unsafe { describe(rt, agent, desc, permission, None) }?;
        // SAFETY: HSA contract: `info` points to a data info block.
        unsafe { put(info, data_info(layout)) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_ext_image_data_get_info_with_layout(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    permission: hsa_access_permission_t,
    layout: hsa_ext_image_data_layout_t,
    row_pitch: usize,
    slice_pitch: usize,
    info: *mut hsa_ext_image_data_info_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let linear = explicit(layout, row_pitch, slice_pitch)?;
        // SAFETY: HSA contract: `desc` points to a descriptor.
        let (_, _, layout) = unsafe { describe(rt, agent, desc, permission, linear) }?;
        // SAFETY: HSA contract: `info` points to a data info block.
        unsafe { put(info, data_info(layout)) }
    })
}

/// Creates an image over `data` and writes its handle.
///
/// # Safety
/// `desc` and `image` are null or valid for reading a descriptor and writing a handle.
unsafe fn create(
    rt: &Runtime,
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    linear: Option<(usize, usize)>,
    image: *mut hsa_ext_image_t,
) -> HsaResult {
    // SAFETY: forwarded from the caller.
    let (format, extent, layout) = unsafe { describe(rt, agent, desc, permission, linear) }?;
    if image.is_null() || data.is_null() || !(data as usize).is_multiple_of(DATA_ALIGNMENT) {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // The data must be memory of the runtime's, large enough: softhsa's images are written
    // by the CPU, so anything else would be a fault instead of a status.
    let allocation = rt
        .memory
        .find(data as usize)
        .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
    let end = (data as usize - allocation.base).checked_add(layout.size);
    if end.is_none_or(|end| end > allocation.size) {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    let handle = rt.images.create(ImageDesc {
        agent: agent.handle,
        data: data as usize,
        extent,
        format,
        layout,
        permission,
    });
    // SAFETY: non-null (checked) and writable per the caller.
    unsafe { put(image, hsa_ext_image_t { handle }) }
}

pub(crate) unsafe extern "C" fn hsa_ext_image_create(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    // SAFETY: HSA contract: `desc` points to a descriptor, `image` to a handle.
    with_runtime(|rt| unsafe { create(rt, agent, desc, data, permission, None, image) })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_ext_image_create_with_layout(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    data: *const c_void,
    permission: hsa_access_permission_t,
    layout: hsa_ext_image_data_layout_t,
    row_pitch: usize,
    slice_pitch: usize,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let linear = explicit(layout, row_pitch, slice_pitch)?;
        // SAFETY: HSA contract: `desc` points to a descriptor, `image` to a handle.
        unsafe { create(rt, agent, desc, data, permission, linear, image) }
    })
}

/// The image `image` of `agent`: `INVALID_AGENT` for an agent that is no GPU,
/// `INVALID_ARGUMENT` for an image that does not exist or belongs to another agent.
fn image_of(
    rt: &Runtime,
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
) -> Result<ImageDesc, hsa_status_t> {
    rt.gpu_agent(agent.handle)?;
    match rt.images.get(image.handle) {
        Some(desc) if desc.agent == agent.handle => Ok(desc),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

pub(crate) unsafe extern "C" fn hsa_ext_image_destroy(
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        image_of(rt, agent, image)?;
        if rt.images.destroy(image.handle) {
            Ok(())
        } else {
            Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
        }
    })
}

/// The pitches of linear host memory at `base` holding `range` (a row at least as long as the
/// region's, a slice at least as long as its rows); `INVALID_ARGUMENT` when the memory they
/// describe would not fit in the address space.
fn host_pitches(
    desc: &ImageDesc,
    base: usize,
    range: [usize; 3],
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<(usize, usize), hsa_status_t> {
    let overflow = HSA_STATUS_ERROR_INVALID_ARGUMENT;
    let len = range[0] * desc.format.texel_bytes();
    let row = row_pitch.max(len);
    let slice = slice_pitch.max(row.checked_mul(range[1]).ok_or(overflow)?);
    let last = |n: usize, pitch: usize| n.saturating_sub(1).checked_mul(pitch);
    last(range[2], slice)
        .zip(last(range[1], row))
        .and_then(|(z, y)| z.checked_add(y)?.checked_add(len)?.checked_add(base))
        .ok_or(overflow)?;
    Ok((row, slice))
}

pub(crate) unsafe extern "C" fn hsa_ext_image_import(
    agent: hsa_agent_t,
    src: *const c_void,
    row_pitch: usize,
    slice_pitch: usize,
    image: hsa_ext_image_t,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `region` points to a region.
        let region = unsafe { read(region) }?;
        if src.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let desc = image_of(rt, agent, image)?;
        let (offset, range) = desc.region(&region.offset, &region.range)?;
        let (row, slice) = host_pitches(&desc, src as usize, range, row_pitch, slice_pitch)?;
        let len = range[0] * desc.format.texel_bytes();
        desc.rows(offset, range, |texel, y, z| {
            let from = src as usize + z * slice + y * row;
            // SAFETY: the row lies inside the image's data (region checked against its extent,
            // data checked against its allocation at creation); the source rows are the
            // application's memory, in bounds by the header's contract. `copy` tolerates an
            // overlap, which the header leaves undefined.
            unsafe { std::ptr::copy(from as *const u8, texel as *mut u8, len) };
        });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_ext_image_export(
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
    dst: *mut c_void,
    row_pitch: usize,
    slice_pitch: usize,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `region` points to a region.
        let region = unsafe { read(region) }?;
        if dst.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let desc = image_of(rt, agent, image)?;
        let (offset, range) = desc.region(&region.offset, &region.range)?;
        let (row, slice) = host_pitches(&desc, dst as usize, range, row_pitch, slice_pitch)?;
        let len = range[0] * desc.format.texel_bytes();
        desc.rows(offset, range, |texel, y, z| {
            let to = dst as usize + z * slice + y * row;
            // SAFETY: as in import, the other way round.
            unsafe { std::ptr::copy(texel as *const u8, to as *mut u8, len) };
        });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_ext_image_copy(
    agent: hsa_agent_t,
    src_image: hsa_ext_image_t,
    src_offset: *const hsa_dim3_t,
    dst_image: hsa_ext_image_t,
    dst_offset: *const hsa_dim3_t,
    range: *const hsa_dim3_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: the three point to a hsa_dim3_t each.
        let (src_offset, dst_offset, range) =
            unsafe { (read(src_offset)?, read(dst_offset)?, read(range)?) };
        let src = image_of(rt, agent, src_image)?;
        let dst = image_of(rt, agent, dst_image)?;
        if src.format != dst.format {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let (from, r) = src.region(&src_offset, &range)?;
        let (to, _) = dst.region(&dst_offset, &range)?;
        let len = r[0] * src.format.texel_bytes();
        // Through a staging buffer: the header leaves overlapping regions undefined, softhsa
        // copies them as if the source were read first.
        let mut staged = Vec::with_capacity(len * r[1] * r[2]);
        src.rows(from, r, |texel, _, _| {
            // SAFETY: a row of the source region, inside its image's data (checked).
            staged
                .extend_from_slice(unsafe { std::slice::from_raw_parts(texel as *const u8, len) });
        });
        let mut rows = staged.chunks_exact(len.max(1));
        dst.rows(to, r, |texel, _, _| {
            if let Some(row) = rows.next() {
                // SAFETY: a row of the destination region, inside its image's data (checked).
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), texel as *mut u8, len) };
            }
        });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_ext_image_clear(
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
    data: *const c_void,
    region: *const hsa_ext_image_region_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `region` points to a region.
        let region = unsafe { read(region) }?;
        if data.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let desc = image_of(rt, agent, image)?;
        let (offset, range) = desc.region(&region.offset, &region.range)?;
        let mut components = [0u32; 4];
        for (c, slot) in components.iter_mut().take(desc.channels()).enumerate() {
            // SAFETY: HSA contract: `data` holds one 4-byte component per channel of the
            // image's channel order.
            *slot = unsafe { data.cast::<u32>().add(c).read_unaligned() };
        }
        let texel = desc.encode(&components);
        desc.rows(offset, range, |row, _, _| {
            for x in 0..range[0] {
                // SAFETY: a texel of the region, inside the image's data (checked).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        texel.as_ptr(),
                        (row + x * texel.len()) as *mut u8,
                        texel.len(),
                    )
                };
            }
        });
        Ok(())
    })
}

super::unsupported_entries! {
    /// Samplers are not provided: softhsa's kernels read texels by coordinates.
    hsa_ext_sampler_create(hsa_agent_t, *const hsa_ext_sampler_descriptor_t, *mut hsa_ext_sampler_t);
    /// See `hsa_ext_sampler_create`.
    hsa_ext_sampler_destroy(hsa_agent_t, hsa_ext_sampler_t);
}
