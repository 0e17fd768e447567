//! An image whose backing memory's free the runtime refuses is still an image: kreplay must
//! keep knowing where its data lies, so that a replayed kernel writing it (reaching the data
//! only through the image handle) has it restored between passes.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_softhsa::{Image, WorkGroup};
use support::app::{self, App, Aql, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// The image's width and height (R, 32-bit unsigned texels).
const W: u32 = 16;
const H: u32 = 8;

/// Runs of the kernel's work-group 0.
static RUNS: AtomicU32 = AtomicU32::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct TexelArgs {
    image: u64,
}

/// `texel += 1` for work-item `i` at (`i % W`, `i / W`) of the image the arguments name.
fn add_one_texel(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `TexelArgs` block.
    let args: TexelArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    let image = Image::from_handle(args.image).expect("a live image");
    for [i, _, _] in group.work_items() {
        let (x, y) = (i % W, i / W);
        let mut texel = image.load([x, y, 0]).expect("inside the image");
        texel[0] += 1;
        assert!(image.store([x, y, 0], texel), "a writable texel");
    }
}

fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(status, HSA_STATUS_SUCCESS, "{what} failed with {status:#x}");
}

/// Calls one entry of the (wrapped) image table.
macro_rules! image {
    ($app:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let hsa = $app.hsa();
        let f = hsa.image().$entry.expect(stringify!($entry));
        // SAFETY: the image table's entry (kreplay's wrapper of softhsa's); every call site
        // passes live images and pointers valid for the call.
        unsafe { f($($arg),*) }
    }};
}

fn descriptor() -> hsa_ext_image_descriptor_t {
    hsa_ext_image_descriptor_t {
        geometry: HSA_EXT_IMAGE_GEOMETRY_2D,
        width: W as usize,
        height: H as usize,
        depth: 0,
        array_size: 0,
        format: hsa_ext_image_format_t {
            channel_type: HSA_EXT_IMAGE_CHANNEL_TYPE_UNSIGNED_INT32,
            channel_order: HSA_EXT_IMAGE_CHANNEL_ORDER_R,
        },
    }
}

fn whole() -> hsa_ext_image_region_t {
    hsa_ext_image_region_t {
        offset: hsa_dim3_t { x: 0, y: 0, z: 0 },
        range: hsa_dim3_t { x: W, y: H, z: 1 },
    }
}

/// A `W` x `H` image of `agent` over fresh memory of `pool`, holding `init` (row-major).
fn image_in(
    app: &App,
    agent: hsa_agent_t,
    pool: hsa_amd_memory_pool_t,
    init: &[u32],
) -> (hsa_ext_image_t, Ptr) {
    let mut need = hsa_ext_image_data_info_t::default();
    ok(
        image!(
            app,
            hsa_ext_image_data_get_info_fn(
                agent,
                &descriptor(),
                HSA_ACCESS_PERMISSION_RW,
                &mut need
            )
        ),
        "image data info",
    );
    let data = app.alloc(pool, need.size);
    let mut image = hsa_ext_image_t { handle: 0 };
    ok(
        image!(
            app,
            hsa_ext_image_create_fn(
                agent,
                &descriptor(),
                data.raw().cast_const(),
                HSA_ACCESS_PERMISSION_RW,
                &mut image
            )
        ),
        "image create",
    );
    ok(
        image!(
            app,
            hsa_ext_image_import_fn(agent, init.as_ptr().cast(), 0, 0, image, &whole())
        ),
        "image import",
    );
    (image, data)
}

/// Every texel of `image`, row-major.
fn export(app: &App, agent: hsa_agent_t, image: hsa_ext_image_t) -> Vec<u32> {
    let mut out = vec![0u32; (W * H) as usize];
    ok(
        image!(
            app,
            hsa_ext_image_export_fn(agent, image, out.as_mut_ptr().cast(), 0, 0, &whole())
        ),
        "image export",
    );
    out
}

/// Creates an image in GPU 0's fine-grained memory (in a replay's snapshot only when the
/// dispatch reaches it, here through the image handle alone), has `free` of its memory refused
/// by the runtime, then replays (three passes) a kernel incrementing every texel, and checks
/// one run's result.
fn refused_free_then_replay(free: fn(&App, Ptr) -> hsa_status_t) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let gpu = app.gpus[0];
    let pools = app.pools(gpu);
    let init: Vec<u32> = (0..W * H).map(|i| 7 * i).collect();
    let (image, data) = image_in(&app, gpu, pools.fine, &init);

    let status = free(&app, data);
    assert_ne!(status, HSA_STATUS_SUCCESS, "the runtime refuses the free");

    let kernel = kreplay_softhsa::register_kernel("loose_add_one_texel", add_one_texel);
    let kernarg = app.kernargs(
        &pools,
        TexelArgs {
            image: image.handle,
        },
    );
    let q = app.queue(gpu);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, W * H, 16, kernarg, done));
    assert_eq!(app.wait_zero(done), 0, "the dispatch completed");
    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 3, "three passes ran");
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(
        export(&app, gpu, image),
        expected,
        "one run's result, not one per pass"
    );
}

/// `hsa_amd_memory_pool_free` of an address inside the allocation, not its base.
fn pool_free_inside(app: &App, data: Ptr) -> hsa_status_t {
    let free = app.amd().hsa_amd_memory_pool_free_fn.expect("pool free");
    // SAFETY: an address inside a live allocation of this process; the runtime checks it.
    unsafe { free((data.0 + 64) as *mut c_void) }
}

/// `hsa_memory_free` of an address inside the allocation, not its base.
fn memory_free_inside(app: &App, data: Ptr) -> hsa_status_t {
    let free = app.core().hsa_memory_free_fn.expect("memory free");
    // SAFETY: an address inside a live allocation of this process; the runtime checks it.
    unsafe { free((data.0 + 64) as *mut c_void) }
}

scenarios! {
    /// A pool free the runtime refuses leaves the image over that memory known to kreplay.
    fn an_image_over_memory_whose_pool_free_was_refused_is_restored_between_passes() {
        refused_free_then_replay(pool_free_inside);
    }

    /// The same with `hsa_memory_free`.
    fn an_image_over_memory_whose_memory_free_was_refused_is_restored_between_passes() {
        refused_free_then_replay(memory_free_inside);
    }
}
