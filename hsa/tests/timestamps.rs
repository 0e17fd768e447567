//! The application's own completion signal carries the dispatch timestamps an ordinary run
//! would have given it (`hsa_amd_profiling_get_dispatch_time`), whether kreplay replayed the
//! dispatch (those of pass 0) or traced it through a signal of its own.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql, WAIT};
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
    /// A replayed dispatch (3 passes) and an opted-out dispatch traced through kreplay's own
    /// completion signal: after each completes, the application's signal reports a start and
    /// an end; the replayed one reports those of pass 0 (as its dispatch record says).
    fn the_applications_signal_carries_its_dispatch_timestamps() {
        let hooks = TestHooks::new(1);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(3) } else { ToolAnswer::OPT_OUT }
        }));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let q = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("timestamps_busy", busy);
        let args = app.kernargs(&pools, Args { spin_us: 200 });
        let mut times = Vec::new();
        for (workgroup, what) in [(64u16, "replayed"), (32, "traced")] {
            let done = app.signal(1);
            app.dispatch(q, Aql::dispatch(kernel, 1, workgroup, args, done));
            assert_eq!(app.wait_zero(done), 0);
            let (start, end) = app.dispatch_time(gpu, done);
            assert!(start > 0 && end > start, "{what}: the application's signal has timestamps: ({start}, {end})");
            times.push((start, end));
        }
        let first = times[0];
        let replayed = hooks.configured_dispatches()[0];
        assert_eq!(hooks.finished_record(replayed.dispatch_id).outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        // softhsa's timestamps are nanoseconds, so the records' times compare directly.
        let passes: Vec<(Option<u64>, u64, u64)> = hooks
            .records()
            .iter()
            .filter(|(_, r)| r.info.dispatch_id == replayed.dispatch_id)
            .map(|(_, r)| (r.pass, r.start_ns, r.end_ns))
            .collect();
        assert_eq!(passes.len(), 3, "{passes:?}");
        let (_, start0, end0) = passes.iter().copied().find(|p| p.0 == Some(0)).expect("pass 0's record");
        assert_eq!(first, (start0, end0), "the replayed dispatch reports pass 0's timestamps");
        assert_ne!(passes[2].1, start0, "a later pass ran at another time");
    }

    /// An async copy while replay is configured (kreplay completes it through a signal of its
    /// own): the application's signal reports the copy's start and end.
    fn an_async_copy_reports_its_timestamps_on_the_applications_signal() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        app.enable_copy_timestamps();
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let src = app.buffer(pools.coarse, &[7; 4096]);
        let dst = app.buffer(pools.coarse, &[0; 4096]);
        let done = app.signal(1);
        app.async_copy(dst, gpu, src, gpu, 4 * 4096, done);
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(dst, 4096), vec![7; 4096]);
        let (start, end) = app.copy_time(done);
        assert!(start > 0 && end >= start, "the application's signal has the copy's timestamps: ({start}, {end})");
    }
}
