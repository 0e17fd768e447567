//! The image extension through the API table: capabilities, data requirements, creation over
//! pool memory, import, export, copy, clear and destroy, every bad input answered with the status
//! `hsa_ext_image.h` documents, and kernels reading and writing texels by handle.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use kreplay_softhsa::{Image, WorkGroup, register_kernel};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// Calls one entry of the image table.
macro_rules! image {
    ($hsa:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $hsa.image().$entry.expect(stringify!($entry));
        // SAFETY: softhsa's entry; every call site passes pointers that are null (to check the
        // answer) or valid for the entry's contract.
        unsafe { f($($arg),*) }
    }};
}

const FORMAT_UNSUPPORTED: hsa_status_t = HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED as _;
const SIZE_UNSUPPORTED: hsa_status_t = HSA_EXT_STATUS_ERROR_IMAGE_SIZE_UNSUPPORTED as _;
const PITCH_UNSUPPORTED: hsa_status_t = HSA_EXT_STATUS_ERROR_IMAGE_PITCH_UNSUPPORTED as _;

fn format(order: u32, channel: u32) -> hsa_ext_image_format_t {
    hsa_ext_image_format_t {
        channel_type: channel,
        channel_order: order,
    }
}

fn r32() -> hsa_ext_image_format_t {
    format(
        HSA_EXT_IMAGE_CHANNEL_ORDER_R,
        HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT32,
    )
}

fn rgba8() -> hsa_ext_image_format_t {
    format(
        HSA_EXT_IMAGE_CHANNEL_ORDER_RGBA,
        HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT8,
    )
}

fn desc_2d(
    width: usize,
    height: usize,
    format: hsa_ext_image_format_t,
) -> hsa_ext_image_descriptor_t {
    hsa_ext_image_descriptor_t {
        geometry: HSA_EXT_IMAGE_GEOMETRY_2D,
        width,
        height,
        depth: 0,
        array_size: 0,
        format,
    }
}

fn region(offset: [u32; 3], range: [u32; 3]) -> hsa_ext_image_region_t {
    hsa_ext_image_region_t {
        offset: hsa_dim3_t {
            x: offset[0],
            y: offset[1],
            z: offset[2],
        },
        range: hsa_dim3_t {
            x: range[0],
            y: range[1],
            z: range[2],
        },
    }
}

fn info(
    hsa: &Hsa,
    agent: hsa_agent_t,
    desc: &hsa_ext_image_descriptor_t,
) -> hsa_ext_image_data_info_t {
    let mut info = hsa_ext_image_data_info_t::default();
    let status = image!(
        hsa,
        hsa_ext_image_data_get_info_fn(agent, desc, HSA_ACCESS_PERMISSION_RW, &mut info)
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    info
}

/// An image of `desc` on `gpu` over fresh coarse memory of the size the runtime asks for.
fn create(
    hsa: &Hsa,
    gpu: hsa_agent_t,
    desc: &hsa_ext_image_descriptor_t,
) -> (hsa_ext_image_t, *mut u8) {
    let need = info(hsa, gpu, desc);
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), need.size)
        .unwrap();
    assert!((data as usize).is_multiple_of(need.alignment));
    let mut image = hsa_ext_image_t { handle: 0 };
    let status = image!(
        hsa,
        hsa_ext_image_create_fn(gpu, desc, data.cast(), HSA_ACCESS_PERMISSION_RW, &mut image)
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    (image, data)
}

fn import(
    hsa: &Hsa,
    gpu: hsa_agent_t,
    image: hsa_ext_image_t,
    words: &[u32],
    r: &hsa_ext_image_region_t,
) -> hsa_status_t {
    image!(
        hsa,
        hsa_ext_image_import_fn(gpu, words.as_ptr().cast(), 0, 0, image, r)
    )
}

fn export(
    hsa: &Hsa,
    gpu: hsa_agent_t,
    image: hsa_ext_image_t,
    words: usize,
    r: &hsa_ext_image_region_t,
) -> Vec<u32> {
    let mut out = vec![0u32; words];
    let status = image!(
        hsa,
        hsa_ext_image_export_fn(gpu, image, out.as_mut_ptr().cast(), 0, 0, r)
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    out
}

#[test]
fn supported_formats_report_every_capability_and_others_none() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let cpu = hsa.cpu_agent().unwrap();
    let mask = |agent, geometry, f: &hsa_ext_image_format_t| {
        let mut mask = 0xdead_u32;
        let status = image!(
            hsa,
            hsa_ext_image_get_capability_fn(agent, geometry, f, &mut mask)
        );
        (status, mask)
    };
    let (status, all) = mask(gpu, HSA_EXT_IMAGE_GEOMETRY_2D, &rgba8());
    assert_eq!(status, HSA_STATUS_SUCCESS);
    for bit in [
        HSA_EXT_IMAGE_CAPABILITY_READ_ONLY,
        HSA_EXT_IMAGE_CAPABILITY_WRITE_ONLY,
        HSA_EXT_IMAGE_CAPABILITY_READ_WRITE,
    ] {
        assert_ne!(all & bit, 0);
    }
    let half = format(
        HSA_EXT_IMAGE_CHANNEL_ORDER_R,
        HSA_EXT_IMAGE_CHANNEL_TYPE_HALF_FLOAT,
    );
    assert_eq!(
        mask(gpu, HSA_EXT_IMAGE_GEOMETRY_2D, &half),
        (HSA_STATUS_SUCCESS, 0)
    );
    assert_eq!(
        mask(gpu, HSA_EXT_IMAGE_GEOMETRY_2DA, &r32()),
        (HSA_STATUS_SUCCESS, 0)
    );
    assert_eq!(
        mask(cpu, HSA_EXT_IMAGE_GEOMETRY_2D, &r32()),
        (HSA_STATUS_SUCCESS, 0)
    );
    assert_eq!(mask(gpu, 99, &r32()).0, HSA_STATUS_ERROR_INVALID_ARGUMENT);
    let status = image!(
        hsa,
        hsa_ext_image_get_capability_fn(gpu, HSA_EXT_IMAGE_GEOMETRY_1D, null(), null_mut())
    );
    assert_eq!(status, HSA_STATUS_ERROR_INVALID_ARGUMENT);
    let mut m = 0u32;
    let status = image!(
        hsa,
        hsa_ext_image_get_capability_with_layout_fn(
            gpu,
            HSA_EXT_IMAGE_GEOMETRY_3D,
            &r32(),
            HSA_EXT_IMAGE_DATA_LAYOUT_LINEAR,
            &mut m
        )
    );
    assert_eq!((status, m), (HSA_STATUS_SUCCESS, all));
}

#[test]
fn data_requirements_follow_the_descriptor_and_bad_descriptors_get_their_status() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let need = info(&hsa, gpu, &desc_2d(3, 2, rgba8()));
    // Rows of 12 bytes padded to 64.
    assert_eq!((need.size, need.alignment), (128, 256));
    let get = |agent, desc: *const hsa_ext_image_descriptor_t, permission| {
        let mut out = hsa_ext_image_data_info_t::default();
        image!(
            hsa,
            hsa_ext_image_data_get_info_fn(agent, desc, permission, &mut out)
        )
    };
    let rw = HSA_ACCESS_PERMISSION_RW;
    let half = format(
        HSA_EXT_IMAGE_CHANNEL_ORDER_RGBA,
        HSA_EXT_IMAGE_CHANNEL_TYPE_HALF_FLOAT,
    );
    assert_eq!(get(gpu, &desc_2d(4, 4, half), rw), FORMAT_UNSUPPORTED);
    assert_eq!(get(gpu, &desc_2d(0, 4, r32()), rw), SIZE_UNSUPPORTED);
    assert_eq!(get(gpu, &desc_2d(1 << 20, 4, r32()), rw), SIZE_UNSUPPORTED);
    assert_eq!(
        get(gpu, &desc_2d(4, 4, r32()), 0),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(get(gpu, null(), rw), HSA_STATUS_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        get(hsa.cpu_agent().unwrap(), &desc_2d(4, 4, r32()), rw),
        HSA_STATUS_ERROR_INVALID_AGENT
    );
    let status = image!(
        hsa,
        hsa_ext_image_data_get_info_fn(gpu, &desc_2d(4, 4, r32()), rw, null_mut())
    );
    assert_eq!(status, HSA_STATUS_ERROR_INVALID_ARGUMENT);
    let with = |row, slice| {
        let mut out = hsa_ext_image_data_info_t::default();
        let mut desc = desc_2d(4, 3, r32());
        desc.geometry = HSA_EXT_IMAGE_GEOMETRY_3D;
        desc.depth = 2;
        let status = image!(
            hsa,
            hsa_ext_image_data_get_info_with_layout_fn(
                gpu,
                &desc,
                rw,
                HSA_EXT_IMAGE_DATA_LAYOUT_LINEAR,
                row,
                slice,
                &mut out
            )
        );
        (status, out.size)
    };
    assert_eq!(with(0, 0), (HSA_STATUS_SUCCESS, 4 * 4 * 3 * 2));
    assert_eq!(with(32, 128), (HSA_STATUS_SUCCESS, 256));
    assert_eq!(with(8, 0).0, PITCH_UNSUPPORTED);
    assert_eq!(with(18, 0).0, PITCH_UNSUPPORTED);
    assert_eq!(with(32, 64).0, PITCH_UNSUPPORTED);
}

#[test]
fn an_image_is_created_only_over_runtime_memory_that_holds_it() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let desc = desc_2d(16, 16, r32());
    let need = info(&hsa, gpu, &desc);
    let pool = hsa.coarse_pool(gpu).unwrap();
    let small = hsa.allocate(pool, need.size / 2).unwrap();
    let big = hsa.allocate(pool, need.size * 2).unwrap();
    let host = vec![0u8; need.size * 2];
    let rw = HSA_ACCESS_PERMISSION_RW;
    let try_create = |data: *const u8, out: *mut hsa_ext_image_t| {
        image!(
            hsa,
            hsa_ext_image_create_fn(gpu, &desc, data.cast(), rw, out)
        )
    };
    let mut image = hsa_ext_image_t { handle: 0 };
    let invalid = HSA_STATUS_ERROR_INVALID_ARGUMENT;
    assert_eq!(try_create(small, &mut image), invalid, "too small");
    assert_eq!(
        try_create(host.as_ptr(), &mut image),
        invalid,
        "not runtime memory"
    );
    let misaligned = big.wrapping_add(4);
    assert_eq!(try_create(misaligned, &mut image), invalid, "misaligned");
    assert_eq!(try_create(null(), &mut image), invalid, "null data");
    assert_eq!(try_create(big, null_mut()), invalid, "null handle");
    assert_eq!(image.handle, 0);
    assert_eq!(try_create(big, &mut image), HSA_STATUS_SUCCESS);
    assert_ne!(image.handle, 0);
    let destroy = |agent, image| image!(hsa, hsa_ext_image_destroy_fn(agent, image));
    assert_eq!(
        destroy(hsa.gpu_agents().unwrap()[1], image),
        invalid,
        "another agent's"
    );
    assert_eq!(destroy(gpu, image), HSA_STATUS_SUCCESS);
    assert_eq!(destroy(gpu, image), invalid, "destroyed twice");
}

#[test]
fn import_and_export_move_a_region_through_the_images_row_pitch() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    // 5 texels of 4 bytes a row: 20 bytes, padded to 64.
    let (image, data) = create(&hsa, gpu, &desc_2d(5, 4, r32()));
    let words: Vec<u32> = (100..106).collect();
    let r = region([1, 1, 0], [3, 2, 1]);
    assert_eq!(import(&hsa, gpu, image, &words, &r), HSA_STATUS_SUCCESS);
    // SAFETY: the image's data holds 4 rows of 64 bytes.
    let raw = unsafe { read_u32s(data.cast(), 64) };
    assert_eq!(&raw[17..20], &[100, 101, 102], "row 1 at 64 bytes");
    assert_eq!(&raw[33..36], &[103, 104, 105], "row 2 at 128 bytes");
    assert_eq!(raw.iter().filter(|&&w| w != 0).count(), 6);
    assert_eq!(export(&hsa, gpu, image, 6, &r), words);
    // A source row pitch longer than the region's row.
    let padded = [1u32, 2, 0, 0, 3, 4, 0, 0];
    let status = image!(
        hsa,
        hsa_ext_image_import_fn(
            gpu,
            padded.as_ptr().cast(),
            16,
            0,
            image,
            &region([0, 2, 0], [2, 2, 1])
        )
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(
        export(&hsa, gpu, image, 4, &region([0, 2, 0], [2, 2, 1])),
        [1, 2, 3, 4]
    );
}

#[test]
fn regions_outside_the_image_and_missing_arguments_are_refused() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let (image, data) = create(&hsa, gpu, &desc_2d(4, 4, r32()));
    let words = [7u32; 64];
    let invalid = HSA_STATUS_ERROR_INVALID_ARGUMENT;
    for r in [
        region([3, 0, 0], [2, 1, 1]),
        region([0, 4, 0], [1, 1, 1]),
        region([0, 0, 1], [1, 1, 1]),
        region([0, 0, 0], [u32::MAX, 1, 1]),
    ] {
        assert_eq!(import(&hsa, gpu, image, &words, &r), invalid);
        let mut out = [0u32; 64];
        let status = image!(
            hsa,
            hsa_ext_image_export_fn(gpu, image, out.as_mut_ptr().cast(), 0, 0, &r)
        );
        assert_eq!(status, invalid);
        let status = image!(
            hsa,
            hsa_ext_image_clear_fn(gpu, image, words.as_ptr().cast(), &r)
        );
        assert_eq!(status, invalid);
        let status = image!(
            hsa,
            hsa_ext_image_copy_fn(gpu, image, &r.offset, image, &r.offset, &r.range)
        );
        assert_eq!(status, invalid);
    }
    let whole = region([0, 0, 0], [4, 4, 1]);
    let status = image!(
        hsa,
        hsa_ext_image_import_fn(gpu, null(), 0, 0, image, &whole)
    );
    assert_eq!(status, invalid);
    let status = image!(
        hsa,
        hsa_ext_image_import_fn(gpu, words.as_ptr().cast(), 0, 0, image, null())
    );
    assert_eq!(status, invalid);
    let status = image!(hsa, hsa_ext_image_clear_fn(gpu, image, null(), &whole));
    assert_eq!(status, invalid);
    let status = image!(
        hsa,
        hsa_ext_image_copy_fn(gpu, image, null(), image, null(), null())
    );
    assert_eq!(status, invalid);
    // Pitches that describe memory past the end of the address space.
    let status = image!(
        hsa,
        hsa_ext_image_import_fn(gpu, words.as_ptr().cast(), usize::MAX / 2, 0, image, &whole)
    );
    assert_eq!(status, invalid);
    let mut out = [0u32; 16];
    let status = image!(
        hsa,
        hsa_ext_image_export_fn(gpu, image, out.as_mut_ptr().cast(), 0, usize::MAX, &whole)
    );
    assert_eq!(
        status, HSA_STATUS_SUCCESS,
        "one slice: its pitch is not used"
    );
    let status = image!(
        hsa,
        hsa_ext_image_export_fn(
            gpu,
            image,
            out.as_mut_ptr().cast(),
            usize::MAX / 2,
            0,
            &whole
        )
    );
    assert_eq!(status, invalid);
    let stale = hsa_ext_image_t {
        handle: 0x1234_5678,
    };
    assert_eq!(import(&hsa, gpu, stale, &words, &whole), invalid);
    let cpu = hsa.cpu_agent().unwrap();
    assert_eq!(
        import(&hsa, cpu, image, &words, &whole),
        HSA_STATUS_ERROR_INVALID_AGENT
    );
    // SAFETY: the image's data holds 16 u32 at a 64-byte row pitch (4 rows).
    let raw = unsafe { read_u32s(data.cast(), 64) };
    assert!(raw.iter().all(|&w| w == 0), "nothing was written");
}

#[test]
fn copy_moves_texels_between_images_of_one_format_and_clear_converts_its_value() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let (a, _) = create(&hsa, gpu, &desc_2d(4, 4, r32()));
    let (b, _) = create(&hsa, gpu, &desc_2d(8, 2, r32()));
    let (c, _) = create(&hsa, gpu, &desc_2d(4, 4, rgba8()));
    let words: Vec<u32> = (1..=16).collect();
    assert_eq!(
        import(&hsa, gpu, a, &words, &region([0, 0, 0], [4, 4, 1])),
        HSA_STATUS_SUCCESS
    );
    let dim = |x, y| hsa_dim3_t { x, y, z: 0 };
    let copy = |src, from: hsa_dim3_t, dst, to: hsa_dim3_t, range: hsa_dim3_t| {
        image!(
            hsa,
            hsa_ext_image_copy_fn(gpu, src, &from, dst, &to, &range)
        )
    };
    let range = hsa_dim3_t { x: 2, y: 2, z: 1 };
    assert_eq!(copy(a, dim(1, 1), b, dim(5, 0), range), HSA_STATUS_SUCCESS);
    assert_eq!(
        export(&hsa, gpu, b, 4, &region([5, 0, 0], [2, 2, 1])),
        [6, 7, 10, 11]
    );
    assert_eq!(
        copy(a, dim(0, 0), c, dim(0, 0), range),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    // Overlapping regions of one image: as if the source were read first.
    assert_eq!(
        copy(a, dim(0, 0), a, dim(1, 0), hsa_dim3_t { x: 3, y: 1, z: 1 }),
        HSA_STATUS_SUCCESS
    );
    assert_eq!(
        export(&hsa, gpu, a, 4, &region([0, 0, 0], [4, 1, 1])),
        [1, 1, 2, 3]
    );

    let value = [300u32, 7, 0, 255];
    let status = image!(
        hsa,
        hsa_ext_image_clear_fn(gpu, c, value.as_ptr().cast(), &region([1, 1, 0], [2, 1, 1]))
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let texels = export(&hsa, gpu, c, 3, &region([0, 1, 0], [3, 1, 1]));
    let rgba = u32::from_ne_bytes([255, 7, 0, 255]);
    assert_eq!(texels, [0, rgba, rgba], "saturated to 8 bits");
    let one = [42u32];
    let status = image!(
        hsa,
        hsa_ext_image_clear_fn(gpu, a, one.as_ptr().cast(), &region([0, 0, 0], [4, 4, 1]))
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(
        export(&hsa, gpu, a, 16, &region([0, 0, 0], [4, 4, 1]))
            .iter()
            .all(|&w| w == 42)
    );
}

#[test]
fn an_image_with_an_explicit_linear_layout_uses_the_applications_pitches() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let mut desc = desc_2d(2, 2, r32());
    desc.geometry = HSA_EXT_IMAGE_GEOMETRY_3D;
    desc.depth = 2;
    let data = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 4096).unwrap();
    let linear = HSA_EXT_IMAGE_DATA_LAYOUT_LINEAR;
    let mut image = hsa_ext_image_t { handle: 0 };
    let rw = HSA_ACCESS_PERMISSION_RW;
    let status = image!(
        hsa,
        hsa_ext_image_create_with_layout_fn(gpu, &desc, data.cast(), rw, linear, 6, 0, &mut image)
    );
    assert_eq!(status, PITCH_UNSUPPORTED);
    let status = image!(
        hsa,
        hsa_ext_image_create_with_layout_fn(gpu, &desc, data.cast(), rw, 7, 0, 0, &mut image)
    );
    assert_eq!(status, HSA_STATUS_ERROR_INVALID_ARGUMENT, "unknown layout");
    let status = image!(
        hsa,
        hsa_ext_image_create_with_layout_fn(
            gpu,
            &desc,
            data.cast(),
            rw,
            linear,
            16,
            64,
            &mut image
        )
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let words: Vec<u32> = (1..=8).collect();
    assert_eq!(
        import(&hsa, gpu, image, &words, &region([0, 0, 0], [2, 2, 2])),
        HSA_STATUS_SUCCESS
    );
    // SAFETY: 4096 bytes of runtime memory.
    let raw = unsafe { read_u32s(data.cast(), 32) };
    assert_eq!(&raw[0..2], &[1, 2]);
    assert_eq!(&raw[4..6], &[3, 4], "row pitch 16 bytes");
    assert_eq!(&raw[16..18], &[5, 6], "slice pitch 64 bytes");
    assert_eq!(&raw[20..22], &[7, 8]);
}

/// `texel += 1` for every texel of the 2D image whose handle is the kernel's argument.
fn add_one_texel(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass one image handle.
    let handle: u64 = unsafe { group.kernargs() };
    let image = Image::from_handle(handle).expect("a live image");
    for [x, y, _] in group.work_items() {
        let mut texel = image.load([x, y, 0]).expect("inside the image");
        texel[0] += 1;
        assert!(image.store([x, y, 0], texel));
    }
}

#[test]
fn a_kernel_reads_and_writes_texels_through_the_image_handle() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let (image, data) = create(&hsa, gpu, &desc_2d(8, 4, r32()));
    let words: Vec<u32> = (0..32).map(|i| i * 10).collect();
    let whole = region([0, 0, 0], [8, 4, 1]);
    assert_eq!(import(&hsa, gpu, image, &words, &whole), HSA_STATUS_SUCCESS);
    // The handle points to none of the image's bytes.
    let need = info(&hsa, gpu, &desc_2d(8, 4, r32()));
    assert!(!(data as u64..data as u64 + need.size as u64).contains(&image.handle));
    let kernel = register_kernel("add_one_texel", add_one_texel);
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let mut handle = image.handle;
    let mut dispatch = Dispatch::linear(kernel, 8, 4, (&raw mut handle).cast::<c_void>(), done);
    dispatch.grid = [8, 4, 1];
    dispatch.workgroup = [4, 2, 1];
    // SAFETY: the queue is live and `handle` outlives the dispatch (waited for below).
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT));
    let expected: Vec<u32> = words.iter().map(|w| w + 1).collect();
    assert_eq!(export(&hsa, gpu, image, 32, &whole), expected);
    // SAFETY: created above, destroyed once.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}
