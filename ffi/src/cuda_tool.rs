//! kreplay as a CUDA injection library: `InitializeInjection`, and the bridge between the CUDA
//! backend (`kreplay-cuda`) and the tools configured through the C ABI.
//!
//! `CUDA_INJECTION64_PATH=/path/to/libkreplay.so` makes the driver call [`InitializeInjection`]
//! during `cuInit`. kreplay reads the `KREPLAY_*` configuration, initializes every tool (their
//! `kreplay_configure` / initialize, as on HSA: `KREPLAY_TOOL_LIBRARIES`, the process, forced
//! configure functions) and installs the CUDA backend with [`CudaTools`] as its view of them:
//! the KERNEL_REPLAY owner decides each launch through the same adapter as on HSA, else the
//! built-in tool replays every launch `KREPLAY_PASSES` times. The backend delivers CONFIG ENTER,
//! the SNAPSHOT callbacks and PASS ENTER of pass 0 at the launch's API ENTER, before the
//! application's launch is submitted; PASS EXIT 0 and everything after at its API EXIT
//! (docs/cuda.md). While a KERNEL_DISPATCH service is configured, every pass of a replayed launch
//! and every launch run once is announced by ENQUEUE ENTER/EXIT records around its submission,
//! timed on the GPU and delivered as a COMPLETE record, each with its `replay_pass`, as on HSA.
//! At exit the tools are finalized and the run record is written.
//!
//! The driver and CUPTI are loaded at run time; without them `InitializeInjection` is never
//! called (or refuses with a printed reason), and nothing here needs CUDA to build.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::Enqueued;
use kreplay_cuda::inject::{DispatchRecord, Summary, Tools};
use kreplay_passloop::{DispatchInfo, ReplayRecord, ReplayTool};

use crate::config::Config;
use crate::hsa_tool;
use crate::logging;

/// The CUDA backend's view of the tools configured through the C ABI.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaTools;

impl Tools for CudaTools {
    fn replay_wanted(&self) -> bool {
        hsa_tool::replay_wanted()
    }

    fn replay_tool(&self) -> Option<Box<dyn ReplayTool>> {
        hsa_tool::tool_for_dispatch()
    }

    fn contexts(&self) -> &'static ContextRegistry {
        ContextRegistry::global()
    }

    fn replay_finished(&self, record: &ReplayRecord, kernel: &str) {
        crate::counters::record_dispatch(record);
        crate::run_record::add(record, kernel);
    }

    fn dispatch_tracing_configured(&self) -> bool {
        crate::services::dispatch_tracing_configured()
    }

    fn dispatch_completed(&self, record: &DispatchRecord) {
        hsa_tool::dispatch_completed(&record.info, record.pass, record.start_ns, record.end_ns);
    }

    fn dispatch_enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Enqueued> {
        let records = hsa_tool::EnqueueRecords::enter(std::slice::from_ref(info), pass);
        Some(Enqueued::new(move || records.exit()))
    }

    fn at_exit(&self, summary: &Summary) {
        crate::lifecycle::finalize_tools();
        crate::run_record::set_totals(crate::run_record::Totals {
            graph_launches: summary.graph_launches,
            managed_allocations: summary.managed_allocations,
            tool_work: summary.tool_work,
            tool_work_kept_bytes: summary.tool_work_kept_bytes,
            tool_work_lost: summary.tool_work_lost,
        });
        crate::run_record::write();
    }
}

static CUDA_BACKEND: AtomicBool = AtomicBool::new(false);

/// Whether kreplay's tool side was set up for the CUDA backend (whose launches have no counters).
pub(crate) fn cuda_backend() -> bool {
    CUDA_BACKEND.load(Ordering::Relaxed)
}

/// The tool side for an injection: configuration, logging, limits, tool initialization and the
/// run record, in that order (anything that can refuse comes before tool code runs).
pub fn make_tools() -> Result<Box<dyn Tools>, String> {
    let config = Config::from_env().map_err(|e| e.to_string())?;
    logging::install_stderr_logger();
    logging::set_level(config.log);
    hsa_tool::check_snapshot_config(&config)?;
    let record_dir = crate::run_record::dir_from_env()?;
    hsa_tool::apply_limits(&config);
    // From the tools' initialize on, the counter functions say there are no counters here.
    CUDA_BACKEND.store(true, Ordering::Relaxed);
    let report = crate::lifecycle::initialize_tools().map_err(|e| e.to_string())?;
    hsa_tool::start_recording(record_dir, "cuda", &report);
    Ok(Box::new(CudaTools))
}

/// The entry point the CUDA driver calls in the library named by `CUDA_INJECTION64_PATH`.
/// Returns 1 when kreplay is installed, 0 when it is not (the reason is printed; the
/// application then runs untouched).
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    kreplay_cuda::inject::initialize_injection(|_| make_tools())
}
