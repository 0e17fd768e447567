//! The times a tool and the application see for replayed and traced dispatches
//! (`hsa_amd_profiling_get_dispatch_time` and the dispatch records), when the application
//! turned the runtime's dispatch timestamps off on its queue.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use support::app::{self, WAIT};
use support::tool::{Script, TestHooks};

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Args {
    spin_us: u64,
}

/// Busy for `spin_us` microseconds (so a run has a measurable duration).
fn busy(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    let until = std::time::Instant::now() + std::time::Duration::from_micros(args.spin_us);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

scenarios! {
    /// The application turns dispatch timestamps off on its queue
    /// (`hsa_amd_profiling_set_profiler_enabled(queue, 0)`), then a dispatch is replayed
    /// (3 passes) and another traced once. Every record the tool gets carries that run's own
    /// start and end (each pass its own, later passes later), and the application's signal
    /// reports pass 0's. Before, the passes and the traced dispatch ran on a queue without
    /// timestamps: every record said 0 to 0.
    fn dispatch_records_keep_their_times_when_the_application_turns_timestamps_off() {
        let hooks = TestHooks::new(1);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(3) } else { ToolAnswer::OPT_OUT }
        }));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let q = app.queue(gpu);
        let off = app.amd().hsa_amd_profiling_set_profiler_enabled_fn.expect("set_profiler_enabled");
        // SAFETY: a live queue of this application.
        assert_eq!(unsafe { off(q.0, 0) }, HSA_STATUS_SUCCESS);
        let kernel = kreplay_softhsa::register_kernel("time_stamps_busy", busy);
        let args = app.kernargs(&pools, Args { spin_us: 200 });
        let mut apps = Vec::new();
        for workgroup in [64u16, 32] {
            let done = app.signal(1);
            app.dispatch(q, support::app::Aql::dispatch(kernel, 1, workgroup, args, done));
            assert_eq!(app.wait_zero(done), 0);
            apps.push(app.dispatch_time(gpu, done));
        }
        let ids: Vec<u64> = hooks.configured_dispatches().iter().map(|i| i.dispatch_id).collect();
        assert_eq!(hooks.finished_record(ids[0]).outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        let records: Vec<(u64, Option<u64>, u64, u64)> = hooks
            .records()
            .iter()
            .map(|(_, r)| (r.info.dispatch_id, r.pass, r.start_ns, r.end_ns))
            .collect();
        assert_eq!(records.len(), 4, "three passes and the traced dispatch: {records:?}");
        for &(id, pass, start, end) in &records {
            assert!(start > 0 && end > start, "dispatch {id} pass {pass:?} has its times: {records:?}");
        }
        let passes: Vec<(u64, u64)> = (0..3)
            .map(|p| {
                let r = records.iter().find(|r| r.0 == ids[0] && r.1 == Some(p)).expect("each pass's record");
                (r.2, r.3)
            })
            .collect();
        assert!(passes[0].1 <= passes[1].0 && passes[1].1 <= passes[2].0, "each pass ran after the one before: {passes:?}");
        // softhsa's timestamps are nanoseconds, so the records' times compare directly.
        assert_eq!(apps[0], passes[0], "the replayed dispatch reports pass 0's timestamps");
    }
}
