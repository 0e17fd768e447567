//! The example tool of docs/c-tools.md (examples/c-tool/pass_counter.c), built the way the guide
//! says (C11, `-lkreplay`), loaded the way ROCm loads it: the runtime opens libkreplay.so with
//! `dlopen(path, RTLD_LAZY)` (so its symbols are NOT global) and calls `OnLoad`; kreplay loads the
//! tool from `KREPLAY_TOOL_LIBRARIES`. The tool's dependency on `libkreplay.so.0` (the SONAME)
//! must resolve to that already loaded library, not to a second copy: the tool then replays the
//! application's dispatches, and the application sees single-run results.
//!
//! One test in this file: the loaded library and its tool are process-wide.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_LAZY, RTLD_LOCAL};

const ELEMENTS: usize = 2048;
const DISPATCHES: usize = 4;
const PASSES: u64 = 4;

#[derive(Clone, Copy)]
#[repr(C)]
struct AddOneArgs {
    data: *mut u32,
    len: u32,
}

/// `x[i] += 1`: a replay that forgets a restore leaves `x + passes`.
fn add_one(group: &WorkGroup) {
    // SAFETY: the test passes an `AddOneArgs` kernarg block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: `data` holds `len` u32 in live device memory; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

/// `cc -std=c11 ... pass_counter.c -L<dir> -lkreplay` (no run path: on ROCm the dependency is
/// satisfied by the libkreplay the runtime already loaded).
fn build_example(dir: &Path) -> PathBuf {
    let link_dir = dir.join("link");
    std::fs::create_dir_all(&link_dir).expect("link folder");
    let link_name = link_dir.join("libkreplay.so");
    let _ = std::fs::remove_file(&link_name);
    std::os::unix::fs::symlink(common::libkreplay(), &link_name).expect("symlink for -lkreplay");
    let out = dir.join("libpass_counter.so");
    common::build_c_library_from(
        &common::example_source("c-tool/pass_counter.c"),
        &out,
        "c11",
        &["-L".as_ref(), link_dir.as_os_str(), "-lkreplay".as_ref()],
    );
    out
}

#[test]
fn example_c_tool_linked_with_lkreplay_replays_dispatches_when_loaded_as_rocm_loads_tools() {
    assert!(common::have_compiler("cc"), "this test needs `cc`");
    let dir = common::scratch_dir("example_tool");
    let tool = build_example(&dir);
    let summary = dir.join("summary.txt");
    let _ = std::fs::remove_file(&summary);
    // SAFETY: set before any other thread of this test process reads the environment.
    unsafe {
        std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool);
        std::env::set_var("EXAMPLE_TOOL_PASSES", PASSES.to_string());
        std::env::set_var("EXAMPLE_TOOL_OUTPUT", &summary);
    }

    // As ROCm's runtime loads HSA_TOOLS_LIB: RTLD_LAZY, local scope.
    let kreplay = common::load_libkreplay(RTLD_LAZY | RTLD_LOCAL);
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table this test owns until the end.
    let loaded = unsafe { (kreplay.on_load)(table.as_mut_ptr(), 1, 0, std::ptr::null()) };
    assert!(loaded, "OnLoad succeeds");

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let kernel = register_kernel("example_tool_add_one", add_one);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let data = hsa
        .allocate(pool, ELEMENTS * 4)
        .expect("buffer")
        .cast::<u32>();
    // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
    unsafe { std::ptr::write_bytes(data, 0, ELEMENTS) };
    for _ in 0..DISPATCHES {
        let args = hsa
            .allocate(kernarg_pool, size_of::<AddOneArgs>())
            .expect("kernargs")
            .cast::<AddOneArgs>();
        // SAFETY: the kernarg allocation holds one AddOneArgs.
        unsafe {
            args.write(AddOneArgs {
                data,
                len: ELEMENTS as u32,
            })
        };
        let done = hsa.signal_create(1).expect("signal");
        // SAFETY: `queue` is live; the packet names a registered kernel with valid kernargs.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(kernel, ELEMENTS as u32, 64, args.cast(), done),
            )
        };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(10)),
            "the application's completion fires"
        );
        hsa.signal_destroy(done).expect("destroy signal");
    }
    // SAFETY: as above; every dispatch completed.
    let result = unsafe { std::slice::from_raw_parts(data, ELEMENTS) };
    assert!(
        result.iter().all(|&x| x == DISPATCHES as u32),
        "each dispatch adds exactly 1 although it ran {PASSES} times: {:?}",
        &result[..8]
    );
    drop(session);
    // SAFETY: the runtime's shutdown entry point; nothing runs through the table afterwards.
    unsafe { (kreplay.on_unload)() };

    let summary = std::fs::read_to_string(&summary)
        .expect("the tool wrote its summary at finalize (it was initialized by this libkreplay)");
    let runs = DISPATCHES as u64 * PASSES;
    assert!(
        summary.starts_with(&format!(
            "pass_counter: {DISPATCHES} dispatches, {DISPATCHES} replayed, 0 declined; {runs} passes;"
        )),
        "the tool replayed every dispatch: {summary}"
    );
    assert!(
        summary.contains(&format!(
            "0 restore failures; {runs} completions in passes, 0 single; \
             {runs} enqueues in passes, 0 single; 0 user_data errors"
        )),
        "the tool traced one submission and one completion per pass and got its user data \
         back: {summary}"
    );
}
