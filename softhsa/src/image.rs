//! The image extension (`hsa_ext_image_*`): images over application memory in a linear layout.
//!
//! An image is a descriptor (geometry, extent, format, row and slice pitch) over memory the
//! application allocated from an agent's pool, sized and aligned as
//! `hsa_ext_image_data_get_info` said. Its handle is the address of that descriptor, which
//! softhsa owns: like a ROCm image handle (the address of the image's resource descriptor), it is
//! a value a kernel receives among its arguments, and it points to no byte of the image's data.
//!
//! softhsa supports the 1D, 2D and 3D geometries, the channel orders R, RG and RGBA and the
//! channel types `UNSIGNED_INT8`, `SIGNED_INT8`, `UNORM_INT8`, `UNSIGNED_INT32`, `SIGNED_INT32`
//! and `FLOAT`; the opaque layout is linear, each row padded to 64 bytes. Kernels (host
//! functions) reach an image's texels through [`Image::from_handle`]. The extension is reached
//! through the API table's image extension table only: `hsa_system_extension_supported` does not
//! report it and `hsa_system_get_major_extension_table` does not hand it out.

use hsa_sys::*;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Alignment of image data, opaque or linear.
pub(crate) const DATA_ALIGNMENT: usize = 256;
/// Row alignment of the opaque layout.
const OPAQUE_ROW_ALIGNMENT: usize = 64;
/// Largest width or height of any geometry.
const MAX_DIM: usize = 16384;
/// Largest depth of a 3D image.
const MAX_DEPTH: usize = 2048;

/// What one channel holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    U8,
    S8,
    Unorm8,
    U32,
    S32,
    F32,
}

impl Channel {
    fn bytes(self) -> usize {
        match self {
            Channel::U8 | Channel::S8 | Channel::Unorm8 => 1,
            Channel::U32 | Channel::S32 | Channel::F32 => 4,
        }
    }

    /// One component as stored, from its access-type value (u32 bits of a uint, int or float):
    /// 8-bit integers saturate, `UNORM_INT8` rounds `[0, 1]` to `[0, 255]`.
    fn encode(self, value: u32, out: &mut [u8]) {
        match self {
            Channel::U8 => out[0] = value.min(255) as u8,
            Channel::S8 => out[0] = (value as i32).clamp(-128, 127) as i8 as u8,
            Channel::Unorm8 => {
                let v = f32::from_bits(value);
                let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
                out[0] = (v * 255.0).round() as u8;
            }
            Channel::U32 | Channel::S32 | Channel::F32 => {
                out[..4].copy_from_slice(&value.to_ne_bytes());
            }
        }
    }

    /// One stored component as its access-type value (u32 bits).
    fn decode(self, bytes: &[u8]) -> u32 {
        match self {
            Channel::U8 => u32::from(bytes[0]),
            Channel::S8 => i32::from(bytes[0] as i8) as u32,
            Channel::Unorm8 => (f32::from(bytes[0]) / 255.0).to_bits(),
            Channel::U32 | Channel::S32 | Channel::F32 => {
                u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
            }
        }
    }
}

/// A format softhsa supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Format {
    channels: usize,
    channel: Channel,
}

impl Format {
    /// The format of `format`, or `HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED`.
    pub(crate) fn of(format: &hsa_ext_image_format_t) -> Result<Format, hsa_status_t> {
        let unsupported = HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED as hsa_status_t;
        let channels = match format.channel_order {
            HSA_EXT_IMAGE_CHANNEL_ORDER_R => 1,
            HSA_EXT_IMAGE_CHANNEL_ORDER_RG => 2,
            HSA_EXT_IMAGE_CHANNEL_ORDER_RGBA => 4,
            _ => return Err(unsupported),
        };
        let channel = match format.channel_type {
            HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT8 => Channel::U8,
            HSA_EXT_IMAGE_CHANNEL_TYPE_SIGNED_INT8 => Channel::S8,
            HSA_EXT_IMAGE_CHANNEL_TYPE_UNORM_INT8 => Channel::Unorm8,
            HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT32 => Channel::U32,
            HSA_EXT_IMAGE_CHANNEL_TYPE_SIGNED_INT32 => Channel::S32,
            HSA_EXT_IMAGE_CHANNEL_TYPE_FLOAT => Channel::F32,
            _ => return Err(unsupported),
        };
        Ok(Format { channels, channel })
    }

    /// Bytes of one texel.
    pub(crate) fn texel_bytes(self) -> usize {
        self.channels * self.channel.bytes()
    }

    /// A texel's bytes from its components' access-type values (the first `channels`).
    fn encode(self, components: &[u32; 4], out: &mut [u8]) {
        let step = self.channel.bytes();
        for (c, &value) in components.iter().take(self.channels).enumerate() {
            self.channel.encode(value, &mut out[c * step..]);
        }
    }

    fn decode(self, bytes: &[u8]) -> [u32; 4] {
        let step = self.channel.bytes();
        let mut out = [0u32; 4];
        for (c, slot) in out.iter_mut().take(self.channels).enumerate() {
            *slot = self.channel.decode(&bytes[c * step..]);
        }
        out
    }
}

/// The extent (width, height, depth) of a descriptor's geometry, checked.
pub(crate) fn extent(desc: &hsa_ext_image_descriptor_t) -> Result<[usize; 3], hsa_status_t> {
    let size_unsupported = HSA_EXT_STATUS_ERROR_IMAGE_SIZE_UNSUPPORTED as hsa_status_t;
    let extent = match desc.geometry {
        HSA_EXT_IMAGE_GEOMETRY_1D => [desc.width, 1, 1],
        HSA_EXT_IMAGE_GEOMETRY_2D => [desc.width, desc.height, 1],
        HSA_EXT_IMAGE_GEOMETRY_3D => [desc.width, desc.height, desc.depth],
        g if g <= HSA_EXT_IMAGE_GEOMETRY_2DADEPTH => {
            return Err(HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED as hsa_status_t);
        }
        _ => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    };
    if extent.contains(&0) || extent[0] > MAX_DIM || extent[1] > MAX_DIM || extent[2] > MAX_DEPTH {
        return Err(size_unsupported);
    }
    Ok(extent)
}

/// Whether `geometry` is one softhsa supports (an unknown value is an invalid argument).
pub(crate) fn geometry_supported(geometry: hsa_ext_image_geometry_t) -> Result<bool, hsa_status_t> {
    match geometry {
        HSA_EXT_IMAGE_GEOMETRY_1D | HSA_EXT_IMAGE_GEOMETRY_2D | HSA_EXT_IMAGE_GEOMETRY_3D => {
            Ok(true)
        }
        g if g <= HSA_EXT_IMAGE_GEOMETRY_2DADEPTH => Ok(false),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// Where an image's texels lie in its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) row_pitch: usize,
    pub(crate) slice_pitch: usize,
    /// Bytes of data the image needs.
    pub(crate) size: usize,
}

impl Layout {
    /// The opaque layout: rows padded to 64 bytes, slices packed.
    pub(crate) fn opaque(extent: [usize; 3], format: Format) -> Layout {
        // Bounded by MAX_DIM, MAX_DEPTH and 16-byte texels: no overflow.
        let row_pitch = (extent[0] * format.texel_bytes()).next_multiple_of(OPAQUE_ROW_ALIGNMENT);
        let slice_pitch = row_pitch * extent[1];
        Layout {
            row_pitch,
            slice_pitch,
            size: slice_pitch * extent[2],
        }
    }

    /// The linear layout with the application's pitches (0: packed), or
    /// `HSA_EXT_STATUS_ERROR_IMAGE_PITCH_UNSUPPORTED`: a row pitch shorter than a row or not a
    /// whole number of texels, a slice pitch (3D) shorter than a slice or not a whole number of
    /// rows.
    pub(crate) fn linear(
        extent: [usize; 3],
        format: Format,
        row_pitch: usize,
        slice_pitch: usize,
    ) -> Result<Layout, hsa_status_t> {
        let bad = HSA_EXT_STATUS_ERROR_IMAGE_PITCH_UNSUPPORTED as hsa_status_t;
        let texel = format.texel_bytes();
        let row = extent[0] * texel;
        let row_pitch = if row_pitch == 0 { row } else { row_pitch };
        if row_pitch < row || !row_pitch.is_multiple_of(texel) {
            return Err(bad);
        }
        let slice = row_pitch.checked_mul(extent[1]).ok_or(bad)?;
        let slice_pitch = if extent[2] == 1 || slice_pitch == 0 {
            slice
        } else {
            slice_pitch
        };
        if slice_pitch < slice || !slice_pitch.is_multiple_of(row_pitch) {
            return Err(bad);
        }
        let size = slice_pitch.checked_mul(extent[2]).ok_or(bad)?;
        Ok(Layout {
            row_pitch,
            slice_pitch,
            size,
        })
    }
}

/// What softhsa knows of one image; the image handle is the address of this block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ImageDesc {
    /// The agent the image was created for (handle).
    pub(crate) agent: u64,
    pub(crate) data: usize,
    pub(crate) extent: [usize; 3],
    pub(crate) format: Format,
    pub(crate) layout: Layout,
    pub(crate) permission: hsa_access_permission_t,
}

impl ImageDesc {
    /// The address of texel `[x, y, z]` (inside the extent).
    fn texel(&self, [x, y, z]: [usize; 3]) -> usize {
        self.data
            + z * self.layout.slice_pitch
            + y * self.layout.row_pitch
            + x * self.format.texel_bytes()
    }

    /// Checks that `offset + range` lies inside the image; returns both as `usize`.
    pub(crate) fn region(
        &self,
        offset: &hsa_dim3_t,
        range: &hsa_dim3_t,
    ) -> Result<([usize; 3], [usize; 3]), hsa_status_t> {
        let o = [offset.x as usize, offset.y as usize, offset.z as usize];
        let r = [range.x as usize, range.y as usize, range.z as usize];
        for d in 0..3 {
            if o[d] + r[d] > self.extent[d] {
                return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
            }
        }
        Ok((o, r))
    }

    /// Calls `f(texel address of row (y, z) of the region, its row index, its slice index)` for
    /// every row of the region `offset`/`range` (checked by [`ImageDesc::region`]).
    pub(crate) fn rows(
        &self,
        offset: [usize; 3],
        range: [usize; 3],
        mut f: impl FnMut(usize, usize, usize),
    ) {
        for z in 0..range[2] {
            for y in 0..range[1] {
                f(self.texel([offset[0], offset[1] + y, offset[2] + z]), y, z);
            }
        }
    }

    /// The bytes of one texel whose components (access type) are `components`.
    pub(crate) fn encode(&self, components: &[u32; 4]) -> Vec<u8> {
        let mut out = vec![0u8; self.format.texel_bytes()];
        self.format.encode(components, &mut out);
        out
    }

    /// How many components `hsa_ext_image_clear`'s data holds.
    pub(crate) fn channels(&self) -> usize {
        self.format.channels
    }
}

/// The images of one runtime instance, by handle.
#[derive(Default)]
pub(crate) struct Images {
    map: Mutex<HashMap<u64, Box<ImageDesc>>>,
}

impl Images {
    /// Registers an image; its handle is the address of its descriptor block.
    pub(crate) fn create(&self, desc: ImageDesc) -> u64 {
        let block = Box::new(desc);
        let handle = std::ptr::from_ref::<ImageDesc>(&block) as u64;
        self.map.lock().insert(handle, block);
        handle
    }

    /// The image of `handle`, if it exists.
    pub(crate) fn get(&self, handle: u64) -> Option<ImageDesc> {
        self.map.lock().get(&handle).map(|b| **b)
    }

    /// Forgets the image of `handle`; false if there was none.
    pub(crate) fn destroy(&self, handle: u64) -> bool {
        self.map.lock().remove(&handle).is_some()
    }

    /// Forgets every image (the runtime shuts down).
    pub(crate) fn clear(&self) {
        self.map.lock().clear();
    }
}

/// A kernel's view of one image: its texels by coordinates, read and written in the image's
/// format, components as their access type (the bits of a `u32`, `i32` or `f32`).
///
/// ```
/// use kreplay_softhsa::{Image, WorkGroup};
///
/// /// Adds one to the first component of every texel the work-group covers (x, y).
/// fn brighten(group: &WorkGroup) {
///     // SAFETY: the dispatch passes the image handle as its only argument.
///     let handle: u64 = unsafe { group.kernargs() };
///     let image = Image::from_handle(handle).expect("a live image");
///     for [x, y, _] in group.work_items() {
///         if let Some(mut texel) = image.load([x, y, 0]) {
///             texel[0] += 1;
///             image.store([x, y, 0], texel);
///         }
///     }
/// }
/// # let _ = brighten;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Image {
    desc: ImageDesc,
}

impl Image {
    /// The image whose handle (`hsa_ext_image_t::handle`) is `handle`, in the running runtime.
    pub fn from_handle(handle: u64) -> Option<Image> {
        let rt = crate::runtime::current().ok()?;
        rt.images.get(handle).map(|desc| Image { desc })
    }

    /// Width, height and depth (1 for the dimensions a geometry lacks).
    pub fn extent(&self) -> [u32; 3] {
        self.desc.extent.map(|d| d as u32)
    }

    fn inside(&self, coord: [u32; 3]) -> Option<[usize; 3]> {
        let c = coord.map(|v| v as usize);
        (0..3).all(|d| c[d] < self.desc.extent[d]).then_some(c)
    }

    /// The components of texel `coord` (unused ones 0), or `None` outside the image or when
    /// the image was created write-only.
    pub fn load(&self, coord: [u32; 3]) -> Option<[u32; 4]> {
        if self.desc.permission == HSA_ACCESS_PERMISSION_WO {
            return None;
        }
        let at = self.desc.texel(self.inside(coord)?);
        let mut bytes = [0u8; 16];
        let n = self.desc.format.texel_bytes();
        // SAFETY: `at` is a texel inside the image, whose data the application keeps alive for
        // as long as the image (the HSA contract of hsa_ext_image_create), `n` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, bytes.as_mut_ptr(), n) };
        Some(self.desc.format.decode(&bytes[..n]))
    }

    /// Writes texel `coord` from its components (unused ones ignored); false outside the image
    /// or when the image was created read-only.
    pub fn store(&self, coord: [u32; 3], components: [u32; 4]) -> bool {
        if self.desc.permission == HSA_ACCESS_PERMISSION_RO {
            return false;
        }
        let Some(c) = self.inside(coord) else {
            return false;
        };
        let at = self.desc.texel(c);
        let mut bytes = [0u8; 16];
        let n = self.desc.format.texel_bytes();
        self.desc.format.encode(&components, &mut bytes[..n]);
        // SAFETY: as in `load`; a texel is written by the work-item that owns it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, n) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(order: u32, channel: u32) -> Result<Format, hsa_status_t> {
        Format::of(&hsa_ext_image_format_t {
            channel_type: channel,
            channel_order: order,
        })
    }

    #[test]
    fn formats_outside_the_supported_set_are_refused_with_the_format_status() {
        let rgba8 = format(
            HSA_EXT_IMAGE_CHANNEL_ORDER_RGBA,
            HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT8,
        )
        .unwrap();
        assert_eq!(rgba8.texel_bytes(), 4);
        assert_eq!(
            format(
                HSA_EXT_IMAGE_CHANNEL_ORDER_R,
                HSA_EXT_IMAGE_CHANNEL_TYPE_FLOAT
            )
            .unwrap()
            .texel_bytes(),
            4
        );
        assert_eq!(
            format(
                HSA_EXT_IMAGE_CHANNEL_ORDER_SRGBA,
                HSA_EXT_IMAGE_CHANNEL_TYPE_UNORM_INT8
            ),
            Err(HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED as hsa_status_t)
        );
        assert_eq!(
            format(
                HSA_EXT_IMAGE_CHANNEL_ORDER_R,
                HSA_EXT_IMAGE_CHANNEL_TYPE_HALF_FLOAT
            ),
            Err(HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED as hsa_status_t)
        );
    }

    #[test]
    fn components_convert_as_their_channel_type_says() {
        let mut b = [0u8; 4];
        Channel::U8.encode(300, &mut b);
        assert_eq!(b[0], 255);
        Channel::S8.encode((-300i32) as u32, &mut b);
        assert_eq!(b[0] as i8, -128);
        Channel::Unorm8.encode(0.5f32.to_bits(), &mut b);
        assert_eq!(b[0], 128);
        assert_eq!(Channel::S8.decode(&[0xff]), (-1i32) as u32);
        Channel::F32.encode(1.5f32.to_bits(), &mut b);
        assert_eq!(f32::from_bits(Channel::F32.decode(&b)), 1.5);
    }

    #[test]
    fn linear_pitches_shorter_than_a_row_or_not_whole_texels_are_refused() {
        let f = format(
            HSA_EXT_IMAGE_CHANNEL_ORDER_RGBA,
            HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT8,
        )
        .unwrap();
        let bad = Err(HSA_EXT_STATUS_ERROR_IMAGE_PITCH_UNSUPPORTED as hsa_status_t);
        assert_eq!(Layout::linear([16, 4, 1], f, 60, 0), bad);
        assert_eq!(Layout::linear([16, 4, 1], f, 66, 0), bad);
        assert_eq!(Layout::linear([16, 4, 2], f, 128, 300), bad);
        let l = Layout::linear([16, 4, 2], f, 128, 0).unwrap();
        assert_eq!((l.row_pitch, l.slice_pitch, l.size), (128, 512, 1024));
        let o = Layout::opaque([3, 2, 1], f);
        assert_eq!((o.row_pitch, o.size), (64, 128));
    }
}
