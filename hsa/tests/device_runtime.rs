//! Kernels whose code object metadata says they may print, call the host or use the device
//! heap (hidden `hidden_printf_buffer`, `hidden_hostcall_buffer`, `hidden_heap_v1` arguments,
//! as on ROCm). Replayed, such a kernel would print its lines (make its host calls, allocate)
//! once per pass, which the application sees: it runs once, declined (`untracked_memory`) with
//! a reason naming the kernel and the argument, before any snapshot. A kernel of the same code
//! object without those arguments still replays, and so does everything where no metadata says
//! so (softhsa's own code object format, an executable destroyed since).
//!
//! Each kernel counts its runs in a host-visible counter standing for what the application
//! would see (a printed line), besides `x += 1` on a buffer that a replay restores.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome};
use kreplay_softhsa::{CodeObject, WorkGroup, register_kernel};
use support::app::{self, App, Aql, Ptr, WAIT};
use support::tool::{Event, Script, TestHooks};

/// Passes the tool asks for.
const PASSES: u64 = 4;

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    x: u64,
}

/// Runs of each kernel: what the application would see once per run (a printed line).
static SEEN: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
const PRINTER: usize = 0;
const CALLER: usize = 1;
const PLAIN: usize = 2;

fn run(group: &WorkGroup, which: usize) {
    // SAFETY: every dispatch of these kernels carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    SEEN[which].fetch_add(1, Ordering::SeqCst);
    // SAFETY: the argument is a live u32 in device memory; one work-item.
    unsafe { *(args.x as *mut u32) += 1 };
}

fn printer(group: &WorkGroup) {
    run(group, PRINTER);
}

fn caller(group: &WorkGroup) {
    run(group, CALLER);
}

fn plain(group: &WorkGroup) {
    run(group, PLAIN);
}

const PRINTER_NAME: &str = "device_runtime_printer";
const CALLER_NAME: &str = "device_runtime_caller";
const PLAIN_NAME: &str = "device_runtime_plain";

/// One code object: a kernel that may print, one that may call the host and use the heap, and
/// one that does neither.
fn code() -> CodeObject {
    CodeObject::new()
        .kernel(PRINTER_NAME, register_kernel(PRINTER_NAME, printer), 8)
        .kernel(CALLER_NAME, register_kernel(CALLER_NAME, caller), 8)
        .kernel(PLAIN_NAME, register_kernel(PLAIN_NAME, plain), 8)
        .hidden_args(
            PRINTER_NAME,
            &["hidden_block_count_x", "hidden_printf_buffer"],
        )
        .hidden_args(CALLER_NAME, &["hidden_hostcall_buffer", "hidden_heap_v1"])
        .hidden_args(
            PLAIN_NAME,
            &["hidden_block_count_x", "hidden_multigrid_sync_arg"],
        )
}

struct Env {
    hooks: Arc<TestHooks>,
    app: App,
}

fn setup() -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(PASSES));
    Env { hooks, app }
}

impl Env {
    /// Dispatches kernel `name` of `exe` on GPU 0 with a fresh `x = 10`; returns (runs the
    /// application saw, `x` after, the replay's outcome, the outcome CONFIG EXIT carried).
    fn dispatch(
        &self,
        exe: hsa_executable_t,
        name: &str,
        which: usize,
    ) -> (u32, u32, ReplayOutcome, ReplayOutcome) {
        let gpu = self.app.gpus[0];
        let hsa = self.app.hsa();
        // The ELF form names a kernel's symbol after its descriptor, `name.kd`, as ROCm does;
        // softhsa's own format by the name.
        let symbol = hsa
            .symbol(exe, gpu, &format!("{name}.kd"))
            .or_else(|_| hsa.symbol(exe, gpu, name))
            .expect("the kernel's symbol");
        let object = hsa
            .symbol_u64(symbol, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)
            .unwrap();
        let pools = self.app.pools(gpu);
        let x: Ptr = self.app.buffer(pools.coarse, &[10]);
        let args = self.app.kernargs(&pools, Args { x: x.0 });
        let before = SEEN[which].load(Ordering::SeqCst);
        let q = self.app.queue(gpu);
        let done = self.app.signal(1);
        self.app
            .dispatch(q, Aql::dispatch(object, 1, 1, args, done));
        assert_eq!(self.app.wait_zero(done), 0, "the dispatch completed");
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch")
            .dispatch_id;
        let record = self.hooks.finished_record(id).outcome;
        let exit = self
            .hooks
            .events_of(id)
            .into_iter()
            .find_map(|e| match e {
                Event::ConfigExit { outcome, .. } => Some(outcome),
                _ => None,
            })
            .expect("CONFIG EXIT");
        let seen = SEEN[which].load(Ordering::SeqCst) - before;
        (seen, self.app.read(x, 1)[0], record, exit)
    }
}

/// The decline's detail, failing unless the outcome is an `untracked_memory` decline.
fn untracked(outcome: &ReplayOutcome) -> String {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => {
            assert_eq!(d.reason, DeclineReason::UntrackedMemory, "{d:?}");
            d.detail.clone()
        }
        other => panic!("expected an untracked_memory decline, got {other:?}"),
    }
}

fn replayed(outcome: &ReplayOutcome) {
    assert_eq!(
        outcome,
        &ReplayOutcome::Replayed {
            passes: PASSES,
            end: LoopEnd::LastPass
        }
    );
}

scenarios! {
    /// A kernel whose metadata declares a printf buffer, loaded from memory: it runs (prints)
    /// once, not once per pass, and the tool learns why at CONFIG EXIT.
    fn a_kernel_that_may_print_runs_once_and_the_tool_learns_why() {
        let env = setup();
        let gpu = env.app.gpus[0];
        let exe = env.app.hsa().load_executable_bytes(gpu, &code().to_elf()).unwrap();

        let (seen, x, record, exit) = env.dispatch(exe, PRINTER_NAME, PRINTER);

        assert_eq!(seen, 1, "printed once, not once per pass ({record:?})");
        assert_eq!(x, 11, "one run's result");
        let why = untracked(&exit);
        assert!(
            why.contains(&format!("kernel {PRINTER_NAME} may print (hidden_printf_buffer)"))
                && why.contains("every pass would print again"),
            "{why}"
        );
        assert_eq!(record, exit, "the run record says the same");
        let warnings = env.hooks.warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("may print (hidden_printf_buffer)")),
            "the log says why: {warnings:?}"
        );
        // Declined before any snapshot.
        let id = env.hooks.configured_dispatches().last().unwrap().dispatch_id;
        let labels = env.hooks.labels_of(id);
        assert_eq!(labels, ["config-enter", "config-exit"], "{labels:?}");
    }

    /// A kernel with a hostcall buffer and a device heap, loaded from a file: declined with
    /// both reasons; the kernel of the same code object without them still replays.
    fn a_kernel_that_may_call_the_host_is_declined_and_its_plain_sibling_replays() {
        let env = setup();
        let gpu = env.app.gpus[0];
        let path = std::env::temp_dir().join(format!("kreplay-devrt-{}.co", std::process::id()));
        std::fs::write(&path, code().to_elf()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let exe = env.app.hsa().load_executable_file(gpu, &file).unwrap();

        let (seen, x, _, exit) = env.dispatch(exe, CALLER_NAME, CALLER);
        assert_eq!((seen, x), (1, 11), "{exit:?}");
        let why = untracked(&exit);
        assert!(
            why.contains("hidden_hostcall_buffer") && why.contains("hidden_heap_v1"),
            "{why}"
        );
        assert!(why.contains(CALLER_NAME), "{why}");

        let (seen, x, _, exit) = env.dispatch(exe, PLAIN_NAME, PLAIN);
        replayed(&exit);
        assert_eq!(seen as u64, PASSES, "replayed: one run per pass");
        assert_eq!(x, 11, "restored between passes");
    }

    /// Without metadata (softhsa's own format) nothing is known: the same kernel replays. And
    /// once the executable whose metadata said so is destroyed, its kernel objects are
    /// forgotten (on ROCm another kernel may get the same object later).
    fn without_metadata_or_after_its_executable_is_destroyed_a_kernel_replays() {
        let env = setup();
        let gpu = env.app.gpus[0];
        let hsa = env.app.hsa();
        let elf = hsa.load_executable_bytes(gpu, &code().to_elf()).unwrap();
        let (seen, _, _, exit) = env.dispatch(elf, PRINTER_NAME, PRINTER);
        assert_eq!(seen, 1, "{exit:?}");
        hsa.destroy_executable(elf).unwrap();

        let own = hsa.load_executable(gpu, &code()).unwrap();
        let (seen, x, _, exit) = env.dispatch(own, PRINTER_NAME, PRINTER);
        replayed(&exit);
        assert_eq!((seen as u64, x), (PASSES, 11));
    }
}
