//! `hsa_amd_profiling_get_async_copy_time` of a signal answers for the copies that signal
//! completed, never for those of a destroyed signal whose handle the runtime gave to it.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use support::app::{self, WAIT};
use support::tool::TestHooks;

/// The most signals created looking for one at the destroyed signal's handle.
const TRIES: usize = 4096;

scenarios! {
    /// An async copy while replay is configured (kreplay completes it through a signal of its
    /// own and keeps its times for the application's signal); the signal is destroyed and a
    /// new one created at its handle, which no copy completed: asking the copy time of the new
    /// one is refused, as the runtime refuses it, rather than answered with the old copy's.
    fn a_new_signal_at_a_destroyed_signals_handle_has_no_copy_time() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        app.enable_copy_timestamps();
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let src = app.buffer(pools.coarse, &[7; 1024]);
        let dst = app.buffer(pools.coarse, &[0; 1024]);
        let done = app.signal(1);
        app.async_copy(dst, gpu, src, gpu, 4 * 1024, done);
        assert_eq!(app.wait_zero(done), 0);
        let (start, end) = app.copy_time(done);
        assert!(start > 0 && end >= start, "the copy's times: ({start}, {end})");

        let destroy = app.core().hsa_signal_destroy_fn.expect("signal destroy");
        // SAFETY: a signal of this process, no longer used by anything.
        assert_eq!(unsafe { destroy(done) }, HSA_STATUS_SUCCESS);
        let mut kept = Vec::new();
        let reused = loop {
            let signal = app.signal(1);
            if signal.handle == done.handle {
                break signal;
            }
            kept.push(signal);
            assert!(kept.len() < TRIES, "the runtime gave the destroyed signal's handle to none of {TRIES} new signals");
        };
        let get = app.amd().hsa_amd_profiling_get_async_copy_time_fn.expect("async copy time");
        let mut time = hsa_amd_profiling_async_copy_time_t { start: 0, end: 0 };
        // SAFETY: a live signal and an out pointer valid for the call.
        let status = unsafe { get(reused, &mut time) };
        assert_ne!(
            status, HSA_STATUS_SUCCESS,
            "a signal no copy completed has no copy time, yet got ({}, {})", time.start, time.end
        );
    }
}
