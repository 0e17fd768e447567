//! Images (the HSA image extension, what HIP arrays, textures and surfaces are on ROCm) and
//! replays.
//!
//! * **Writes.** `hsa_ext_image_import`, `_copy` and `_clear` write an image's data, memory the
//!   application allocated from an agent's pool and that a replay of that agent snapshots. Made
//!   by another thread while a replay's window is open, such a write lands between a pass and a
//!   restore, which undoes it. The first pass's PASS ENTER waits (bounded) for the write to
//!   return: unfenced it returns while the replay runs, every time; fenced it cannot return
//!   before the replay ended, so the callback waits out its bound, which the test checks.
//! * **Reach.** A kernel gets an image as a handle among its arguments, and the handle is not an
//!   address inside the image's data, so the argument scan finds nothing there: the data must be
//!   reached from the handle, or a replayed kernel writing an image outside the agent's own
//!   coarse memory writes it once per pass.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::layouts::AmdExtTableV2;
use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig};
use kreplay_softhsa::{Image, OwnedApiTable, TableLayout, WorkGroup};
use support::app::{self, App, Aql, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// The images' width and height (R, 32-bit unsigned texels).
const W: u32 = 16;
const H: u32 = 8;
/// Rows the replayed kernel increments; the racing write covers the others.
const KERNEL_ROWS: u32 = 4;
/// How long the first pass's PASS ENTER waits for the racing write to return.
const WRITE_WINDOW: Duration = Duration::from_millis(300);
/// What the racing write puts in every texel it covers.
const WRITTEN: u32 = 0x5eed;

/// Set at the first PASS ENTER (the replay window is open).
static PASS_RUNNING: AtomicBool = AtomicBool::new(false);
/// Set by the writing thread once its write returned.
static WRITE_DONE: AtomicBool = AtomicBool::new(false);
/// Set if a PASS ENTER saw the write done while the replay was still running.
static WRITE_SEEN_MID_REPLAY: AtomicBool = AtomicBool::new(false);
/// Runs of the kernel's work-group 0.
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Arguments of [`add_one_texel`]: an image handle and how many rows to touch.
#[repr(C)]
#[derive(Clone, Copy)]
struct TexelArgs {
    image: u64,
    rows: u32,
    pad: u32,
}

/// `texel += 1` for work-item `i` at (`i % W`, `i / W`) of the image the arguments name, in its
/// first `rows` rows.
fn add_one_texel(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `TexelArgs` block.
    let args: TexelArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    let image = Image::from_handle(args.image).expect("a live image");
    for [i, _, _] in group.work_items() {
        let (x, y) = (i % W, i / W);
        if y < args.rows {
            let mut texel = image.load([x, y, 0]).expect("inside the image");
            texel[0] += 1;
            assert!(image.store([x, y, 0], texel), "a writable texel");
        }
    }
}

/// Arguments of [`add_one_texel_indirect`]: where the image handle is stored (as HIP passes a
/// texture or surface object: a pointer to a descriptor in device memory).
#[repr(C)]
#[derive(Clone, Copy)]
struct IndirectArgs {
    handle_at: u64,
}

/// [`add_one_texel`] over every row of the image whose handle is stored at `handle_at`.
fn add_one_texel_indirect(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `IndirectArgs` block.
    let args: IndirectArgs = unsafe { group.kernargs() };
    // SAFETY: the argument points at a live u64 holding an image handle.
    let handle = unsafe { (args.handle_at as *const u64).read() };
    let image = Image::from_handle(handle).expect("a live image");
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

fn rows(first: u32, count: u32) -> hsa_ext_image_region_t {
    hsa_ext_image_region_t {
        offset: hsa_dim3_t {
            x: 0,
            y: first,
            z: 0,
        },
        range: hsa_dim3_t {
            x: W,
            y: count,
            z: 1,
        },
    }
}

/// The entry an image is created with.
#[derive(Clone, Copy)]
enum Create {
    /// `hsa_ext_image_create` of the image extension.
    Extension,
    /// `hsa_amd_image_create` of the AMD extension (a device-specific layout).
    Amd,
}

/// A `W` x `H` image of `agent` over fresh memory of `pool`, holding `init` (row-major).
fn image_in(
    app: &App,
    agent: hsa_agent_t,
    pool: hsa_amd_memory_pool_t,
    init: &[u32],
) -> (hsa_ext_image_t, Ptr) {
    image_made(app, Create::Extension, agent, pool, init)
}

/// [`image_in`], the image created with `create`.
fn image_made(
    app: &App,
    create: Create,
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
    let status = match create {
        Create::Extension => image!(
            app,
            hsa_ext_image_create_fn(
                agent,
                &descriptor(),
                data.raw().cast_const(),
                HSA_ACCESS_PERMISSION_RW,
                &mut image
            )
        ),
        Create::Amd => {
            let f = app
                .amd()
                .hsa_amd_image_create_fn
                .expect("hsa_amd_image_create");
            let layout = hsa_amd_image_descriptor_t::default();
            // SAFETY: the AMD extension's entry (kreplay's wrapper of the runtime's), with a
            // descriptor, a layout, memory and a handle valid for the call.
            unsafe {
                f(
                    agent,
                    &descriptor(),
                    &layout,
                    data.raw().cast_const(),
                    HSA_ACCESS_PERMISSION_RW,
                    &mut image,
                )
            }
        }
    };
    ok(status, "image create");
    import(app, agent, image, init, &rows(0, H));
    (image, data)
}

fn import(
    app: &App,
    agent: hsa_agent_t,
    image: hsa_ext_image_t,
    words: &[u32],
    region: &hsa_ext_image_region_t,
) {
    ok(
        image!(
            app,
            hsa_ext_image_import_fn(agent, words.as_ptr().cast(), 0, 0, image, region)
        ),
        "image import",
    );
}

/// Every texel of `image`, row-major.
fn export(app: &App, agent: hsa_agent_t, image: hsa_ext_image_t) -> Vec<u32> {
    let mut out = vec![0u32; (W * H) as usize];
    ok(
        image!(
            app,
            hsa_ext_image_export_fn(agent, image, out.as_mut_ptr().cast(), 0, 0, &rows(0, H))
        ),
        "image export",
    );
    out
}

/// One image write of another thread: puts [`WRITTEN`] in rows `KERNEL_ROWS..H` of `dst`;
/// `src` is an image of the same agent whose first rows hold [`WRITTEN`].
type Write = fn(app: &App, agent: hsa_agent_t, dst: hsa_ext_image_t, src: hsa_ext_image_t);

fn with_import(app: &App, agent: hsa_agent_t, dst: hsa_ext_image_t, _src: hsa_ext_image_t) {
    let words = vec![WRITTEN; (W * (H - KERNEL_ROWS)) as usize];
    import(app, agent, dst, &words, &rows(KERNEL_ROWS, H - KERNEL_ROWS));
}

fn with_copy(app: &App, agent: hsa_agent_t, dst: hsa_ext_image_t, src: hsa_ext_image_t) {
    let from = hsa_dim3_t { x: 0, y: 0, z: 0 };
    let region = rows(KERNEL_ROWS, H - KERNEL_ROWS);
    ok(
        image!(
            app,
            hsa_ext_image_copy_fn(agent, src, &from, dst, &region.offset, &region.range)
        ),
        "image copy",
    );
}

fn with_clear(app: &App, agent: hsa_agent_t, dst: hsa_ext_image_t, _src: hsa_ext_image_t) {
    let value = [WRITTEN];
    ok(
        image!(
            app,
            hsa_ext_image_clear_fn(
                agent,
                dst,
                value.as_ptr().cast(),
                &rows(KERNEL_ROWS, H - KERNEL_ROWS)
            )
        ),
        "image clear",
    );
}

fn initial() -> Vec<u32> {
    (0..W * H).map(|i| 7 * i).collect()
}

/// Replays, three passes, a dispatch on GPU 0 incrementing the first [`KERNEL_ROWS`] rows of an
/// image in GPU 0's coarse memory (reached through its handle) while another thread writes its other rows with `write`;
/// checks that the write is all there and the kernel's rows hold one run's result.
fn race(strategy: RestoreStrategy, write: Write) {
    race_in(strategy, write, |app| {
        (app.gpus[0], app.pools(app.gpus[0]).coarse)
    });
}

/// [`race`] with the written images created for the agent `place` gives, the data of the one
/// the kernel writes in the memory of the pool it gives.
fn race_in(
    strategy: RestoreStrategy,
    write: Write,
    place: fn(&App) -> (hsa_agent_t, hsa_amd_memory_pool_t),
) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot: SnapshotConfig::default().with_strategy(strategy),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3).on_pass_enter(|_, _, pass, _| {
        if pass == 0 {
            PASS_RUNNING.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + WRITE_WINDOW;
            while !WRITE_DONE.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        if WRITE_DONE.load(Ordering::SeqCst) {
            WRITE_SEEN_MID_REPLAY.store(true, Ordering::SeqCst);
        }
    }));
    let gpu = app.gpus[0];
    let pools = app.pools(gpu);
    let init = initial();
    let (agent, pool) = place(&app);
    let (dst, _) = image_in(&app, agent, pool, &init);
    let (src, _) = image_in(
        &app,
        agent,
        app.pools(agent).coarse,
        &[WRITTEN; (W * H) as usize],
    );
    let kernel = kreplay_softhsa::register_kernel("add_one_texel", add_one_texel);
    let kernarg = app.kernargs(
        &pools,
        TexelArgs {
            image: dst.handle,
            rows: KERNEL_ROWS,
            pad: 0,
        },
    );
    let writer = std::thread::spawn(move || {
        assert!(support::wait_flag(&PASS_RUNNING), "the first pass began");
        write(&app, agent, dst, src);
        WRITE_DONE.store(true, Ordering::SeqCst);
    });
    let q = app.queue(gpu);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, W * KERNEL_ROWS, 16, kernarg, done));
    assert_eq!(
        app.wait_zero(done),
        0,
        "the application's dispatch completed"
    );
    writer.join().expect("the writing thread ends");

    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let texels = export(&app, agent, dst);
    let split = (W * KERNEL_ROWS) as usize;
    let lost = texels[split..].iter().filter(|&&t| t != WRITTEN).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} written texels were lost",
        texels.len() - split
    );
    let expected: Vec<u32> = init[..split].iter().map(|v| v + 1).collect();
    assert_eq!(&texels[..split], &expected[..], "one run's result");
    assert!(
        !WRITE_SEEN_MID_REPLAY.load(Ordering::SeqCst),
        "the write returned while the replay was running"
    );
}

/// Replays, three passes, a dispatch on GPU 0 incrementing every texel of an image over memory
/// of `pool` (of agent `owner`), the image reached only through its handle; checks one run's
/// result.
fn increment_image(app: &App, hooks: &TestHooks, owner: hsa_agent_t, pool: hsa_amd_memory_pool_t) {
    increment_image_made(app, hooks, Create::Extension, owner, pool);
}

/// [`increment_image`], the image created with `create`.
fn increment_image_made(
    app: &App,
    hooks: &TestHooks,
    create: Create,
    owner: hsa_agent_t,
    pool: hsa_amd_memory_pool_t,
) {
    let gpu = app.gpus[0];
    let init = initial();
    let (image, _) = image_made(app, create, owner, pool, &init);
    let kernel = kreplay_softhsa::register_kernel("add_one_texel", add_one_texel);
    let kernarg = app.kernargs(
        &app.pools(gpu),
        TexelArgs {
            image: image.handle,
            rows: H,
            pad: 0,
        },
    );
    let q = app.queue(gpu);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, W * H, 16, kernarg, done));
    assert_eq!(
        app.wait_zero(done),
        0,
        "the application's dispatch completed"
    );
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
    assert_eq!(export(app, owner, image), expected, "one run's result");
}

/// softhsa's `hsa_ext_image_create` standing in for a runtime's `hsa_amd_image_create`, which
/// softhsa does not provide: the image the descriptor describes over `data`, its
/// device-specific layout not read.
unsafe extern "C" fn amd_image_create_stand_in(
    agent: hsa_agent_t,
    desc: *const hsa_ext_image_descriptor_t,
    _layout: *const hsa_amd_image_descriptor_t,
    data: *const std::ffi::c_void,
    permission: hsa_access_permission_t,
    image: *mut hsa_ext_image_t,
) -> hsa_status_t {
    // SAFETY: softhsa's own table and its image table are valid for the process; the caller's
    // arguments are forwarded unchanged.
    unsafe {
        let create = (*kreplay_softhsa::api_table().image_ext_)
            .hsa_ext_image_create_fn
            .expect("softhsa's image create");
        create(agent, desc, data, permission, image)
    }
}

/// kreplay installed, a three-pass replay service configured.
fn installed() -> (App, std::sync::Arc<TestHooks>) {
    installed_into(Box::leak(Box::new(OwnedApiTable::softhsa_with(
        TableLayout::from_env().expect("a known table layout"),
    ))))
}

/// [`installed`] into a table whose runtime has an `hsa_amd_image_create`.
fn installed_with_amd_image_create() -> (App, std::sync::Arc<TestHooks>) {
    let layout = TableLayout::from_env().expect("a known table layout");
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    let stand_in = Some(amd_image_create_stand_in as _);
    // SAFETY: the copy's AMD extension table is valid, laid out in `layout`'s order, and only
    // this scenario uses it so far.
    unsafe {
        let amd = (*table.as_mut_ptr()).amd_ext_;
        match layout {
            TableLayout::Rocm52 => (*amd.cast::<AmdExtTable>()).hsa_amd_image_create_fn = stand_in,
            _ => (*amd.cast::<AmdExtTableV2>()).hsa_amd_image_create_fn = stand_in,
        }
    }
    installed_into(table)
}

fn installed_into(table: &'static mut OwnedApiTable) -> (App, std::sync::Arc<TestHooks>) {
    let hooks = TestHooks::new(0);
    let app = app::install_into(
        table,
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    (app, hooks)
}

scenarios! {
    /// `hsa_ext_image_import` into rows of an image the replayed kernel does not touch.
    fn an_image_import_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Full, with_import);
    }

    /// `hsa_ext_image_copy` from another image of the agent, write-set restores.
    fn an_image_copy_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Writeset, with_copy);
    }

    /// `hsa_ext_image_clear`, hashing restores.
    fn an_image_clear_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Hash, with_clear);
    }

    /// The image's data is system memory, which the CPU owns: in the replay's snapshot because
    /// the dispatch reaches it through the handle, and any GPU may write it, so the import waits
    /// for a replay on any GPU.
    fn an_image_import_into_host_memory_a_replay_reaches_is_not_undone() {
        race_in(RestoreStrategy::Full, with_import, |app| (app.gpus[0], app.host_pool()));
    }

    /// The image belongs to the other GPU and lies in its memory; GPU 0's replayed dispatch
    /// reaches it through the handle, so the replay holds GPU 1 too, and a copy into it naming
    /// GPU 1 waits for that replay.
    fn an_image_copy_into_another_gpus_image_a_replay_reaches_is_not_undone() {
        race_in(RestoreStrategy::Writeset, with_copy, |app| {
            (app.gpus[1], app.pools(app.gpus[1]).coarse)
        });
    }

    /// A tool imports into the image the replayed kernel writes, from PASS ENTER of the second
    /// pass (inside the replay window, after the first restore): its texels survive the
    /// restore that follows, as every write of a replay callback does.
    fn a_tools_image_import_from_a_replay_callback_survives_the_restores() {
        let (app, hooks) = installed();
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let init = initial();
        let (dst, _) = image_in(&app, gpu, pools.coarse, &init);
        hooks.set_script(Script::passes(3).on_pass_enter(move |_, _, pass, _| {
            if pass == 1 {
                with_import(&app, gpu, dst, dst);
            }
        }));
        let kernel = kreplay_softhsa::register_kernel("add_one_texel", add_one_texel);
        let kernarg = app.kernargs(
            &pools,
            TexelArgs {
                image: dst.handle,
                rows: KERNEL_ROWS,
                pad: 0,
            },
        );
        let q = app.queue(gpu);
        let done = app.signal(1);
        app.dispatch(q, Aql::dispatch(kernel, W * KERNEL_ROWS, 16, kernarg, done));
        assert_eq!(app.wait_zero(done), 0, "the application's dispatch completed");
        let dispatch = hooks.configured_dispatches()[0].dispatch_id;
        assert!(matches!(
            hooks.finished_record(dispatch).outcome,
            ReplayOutcome::Replayed { passes: 3, .. }
        ));
        let texels = export(&app, gpu, dst);
        let split = (W * KERNEL_ROWS) as usize;
        let lost = texels[split..].iter().filter(|&&t| t != WRITTEN).count();
        assert_eq!(lost, 0, "{lost} texels the tool imported were lost");
        let expected: Vec<u32> = init[..split].iter().map(|v| v + 1).collect();
        assert_eq!(&texels[..split], &expected[..], "one run's result");
    }

    /// The baseline: the image's data is coarse memory of the dispatch's agent, in its snapshot
    /// whatever the arguments say.
    fn a_replayed_kernel_writing_an_image_in_the_agents_coarse_memory_applies_once() {
        let (app, hooks) = installed();
        let gpu = app.gpus[0];
        increment_image(&app, &hooks, gpu, app.pools(gpu).coarse);
    }

    /// The image's data is fine-grained memory of the agent: in the snapshot only when the
    /// dispatch reaches it, here through the image handle alone.
    fn a_replayed_kernel_writing_an_image_in_fine_grained_memory_applies_once() {
        let (app, hooks) = installed();
        let gpu = app.gpus[0];
        increment_image(&app, &hooks, gpu, app.pools(gpu).fine);
    }

    /// The image's data is coarse memory of the other GPU.
    fn a_replayed_kernel_writing_an_image_in_another_gpus_memory_applies_once() {
        let (app, hooks) = installed();
        let other = app.gpus[1];
        increment_image(&app, &hooks, other, app.pools(other).coarse);
    }

    /// The kernel finds the image's handle in memory, not among its arguments (a HIP texture
    /// or surface object is a pointer to a descriptor in device memory), and the snapshot
    /// holds only what the arguments reach (`KREPLAY_SNAPSHOT_SCOPE=referenced`): an image
    /// can be used only by kernels of the agent it was created for, so a replay on that agent
    /// reaches every image of it.
    fn an_image_reached_through_memory_is_in_a_referenced_snapshot() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(WAIT),
                snapshot: SnapshotConfig::default()
                    .with_scope(kreplay_snapshot::SnapshotScope::Referenced),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let init = initial();
        let (image, _) = image_in(&app, gpu, pools.coarse, &init);
        let (lo, hi) = (image.handle as u32, (image.handle >> 32) as u32);
        let stored = app.buffer(pools.coarse, &[lo, hi]);
        let kernel = kreplay_softhsa::register_kernel("add_one_texel_indirect", add_one_texel_indirect);
        let kernarg = app.kernargs(&pools, IndirectArgs { handle_at: stored.0 });
        let q = app.queue(gpu);
        let done = app.signal(1);
        app.dispatch(q, Aql::dispatch(kernel, W * H, 16, kernarg, done));
        assert_eq!(app.wait_zero(done), 0, "the application's dispatch completed");
        let dispatch = hooks.configured_dispatches()[0].dispatch_id;
        assert!(matches!(
            hooks.finished_record(dispatch).outcome,
            ReplayOutcome::Replayed { passes: 3, .. }
        ));
        let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
        assert_eq!(export(&app, gpu, image), expected, "one run's result");
    }

    /// An image whose memory the application freed without destroying the image first is
    /// dead: a later replay on its agent neither reaches nor declines over the freed memory
    /// (with XNACK, an address of the process's heap that no allocation holds any more would
    /// decline every replay on the agent as `untracked_memory`).
    fn an_image_over_freed_memory_does_not_decline_later_replays() {
        kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
            svm_accessible_by_default: true,
            ..Default::default()
        })
        .expect("softhsa configured");
        let (app, hooks) = installed();
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let (_dead, data) = image_in(&app, gpu, pools.fine, &initial());
        // Allocated after the image's memory, so freeing that memory leaves it mapped.
        let init = initial();
        let (live, _) = image_in(&app, gpu, pools.coarse, &init);
        app.free(data);
        let kernel = kreplay_softhsa::register_kernel("add_one_texel", add_one_texel);
        let kernarg = app.kernargs(
            &pools,
            TexelArgs {
                image: live.handle,
                rows: H,
                pad: 0,
            },
        );
        let q = app.queue(gpu);
        let done = app.signal(1);
        app.dispatch(q, Aql::dispatch(kernel, W * H, 16, kernarg, done));
        assert_eq!(app.wait_zero(done), 0, "the application's dispatch completed");
        let dispatch = hooks.configured_dispatches()[0].dispatch_id;
        assert_eq!(
            hooks.finished_record(dispatch).outcome,
            ReplayOutcome::Replayed {
                passes: 3,
                end: LoopEnd::LastPass
            }
        );
        let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
        assert_eq!(export(&app, gpu, live), expected, "one run's result");
    }

    /// Where agents reach any host memory of the process (XNACK), an argument that is an
    /// address mapped in the process but in no memory the runtime knows declines the replay;
    /// an image handle is such an address (the runtime's descriptor), and names the image's
    /// data, which is snapshotted: the dispatch is replayed.
    fn an_image_handle_is_not_untracked_memory_where_agents_reach_host_memory() {
        kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
            svm_accessible_by_default: true,
            ..Default::default()
        })
        .expect("softhsa configured");
        let (app, hooks) = installed();
        let gpu = app.gpus[0];
        increment_image(&app, &hooks, gpu, app.pools(gpu).fine);
    }

    /// An image made with the AMD extension's `hsa_amd_image_create` over fine-grained memory
    /// of the agent: its data is reached through its handle as that of an image made with the
    /// image extension, so the replayed kernel's increment applies once.
    fn a_replayed_kernel_writing_an_image_made_with_the_amd_extension_applies_once() {
        let (app, hooks) = installed_with_amd_image_create();
        let gpu = app.gpus[0];
        increment_image_made(&app, &hooks, Create::Amd, gpu, app.pools(gpu).fine);
    }
}
