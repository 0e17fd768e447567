//! The counters the injected library keeps and the summary it prints at exit.

use super::*;

/// Counters printed in the exit summary.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) launches: AtomicU64,
    pub(super) replayed: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) graph_launches: AtomicU64,
    pub(super) auto_device: AtomicU64,
    pub(super) auto_full: AtomicU64,
    pub(super) allocations: AtomicU64,
    pub(super) frees: AtomicU64,
    pub(super) managed: AtomicU64,
    pub(super) bytes_snapshotted: AtomicU64,
    pub(super) bytes_restored: AtomicU64,
    pub(super) snapshot_ns: AtomicU64,
    pub(super) restore_ns: AtomicU64,
    pub(super) restores: AtomicU64,
    pub(super) relaunch_ns: AtomicU64,
    pub(super) drain_ns: AtomicU64,
    pub(super) replay_ns: AtomicU64,
    pub(super) callbacks: AtomicU64,
    pub(super) callback_ns: AtomicU64,
    pub(super) module_callbacks: AtomicU64,
    pub(super) module_ns: AtomicU64,
    pub(super) init_ns: AtomicU64,
    pub(super) declines: Mutex<BTreeMap<String, u64>>,
    /// Calls a tool made from its replay callbacks into memory a snapshot held.
    pub(super) tool_work: AtomicU64,
    /// Bytes of such work folded into snapshots.
    pub(super) tool_work_kept: AtomicU64,
    /// Such calls whose work a later restore may have undone (reported on stderr).
    pub(super) tool_work_lost: AtomicU64,
}

impl Stats {
    /// Counts one callback in `count` and, when the returned guard drops, adds the time since
    /// `start` to `ns`.
    pub(super) fn timed<'a>(
        &self,
        count: &'a AtomicU64,
        ns: &'a AtomicU64,
        start: Instant,
    ) -> Timed<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Timed { ns, start }
    }
}

/// Adds the time it lived to a counter when it drops (see [`Stats::timed`]).
pub(super) struct Timed<'a> {
    ns: &'a AtomicU64,
    start: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The backend's totals at exit (also the summary line on standard error).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Passes the built-in tool asks for (`KREPLAY_PASSES`; 1 when C tools decide).
    pub passes_per_launch: u64,
    /// Kernel launches seen.
    pub launches: u64,
    /// Launches replayed.
    pub replayed: u64,
    /// Passes run, the application's own launches included.
    pub passes_run: u64,
    /// Replays that failed (a pass or a restore).
    pub failed: u64,
    /// Declined launches by reason.
    pub declined: BTreeMap<String, u64>,
    /// Graph launches (run once).
    pub graph_launches: u64,
    /// Replays `auto` ran with detection on the device, and with full copies (see
    /// [`crate::choice`]).
    pub auto_device: u64,
    /// See `auto_device`.
    pub auto_full: u64,
    /// Allocations and mappings tracked.
    pub allocations: u64,
    /// Frees and unmaps of tracked memory.
    pub frees: u64,
    /// Managed allocations seen (never snapshotted: launches decline while one is live).
    pub managed_allocations: u64,
    /// Bytes copied into snapshots.
    pub bytes_snapshotted: u64,
    /// Bytes written back by restores.
    pub bytes_restored: u64,
    /// Restores.
    pub restores: u64,
    /// Time taking snapshots, ns.
    pub snapshot_ns: u64,
    /// Time restoring, ns.
    pub restore_ns: u64,
    /// Device shadow bytes still held.
    pub shadow_bytes_held: u64,
    /// Time of the passes after the application's own (re-launch, its wait, the tool's pass
    /// callbacks), ns: the kernels' repeated executions.
    pub relaunch_ns: u64,
    /// Time draining the device before snapshots, ns.
    pub drain_ns: u64,
    /// Time of whole replay windows (lock wait, drain, snapshot, every pass and restore; pass
    /// 0 includes the wait for the application's own launch), ns.
    pub replay_ns: u64,
    /// Host time of the device-memory calls under the snapshots and restores, every device
    /// summed (what part of `snapshot_ns` and `restore_ns` they are, and how much of them is
    /// waiting for the GPU).
    pub memory: MemoryTimes,
    /// Driver-API callbacks handled (API ENTER and EXIT each count; kreplay's own calls and
    /// calls made while kreplay is in the driver are not handled and not counted).
    pub callbacks: u64,
    /// Time inside those callbacks, ns: what interception adds to the application's driver
    /// calls, replay windows included (`callback_ns - replay_ns` is interception alone).
    pub callback_ns: u64,
    /// Module load and unload callbacks.
    pub module_callbacks: u64,
    /// Time inside them (reading a loaded module's image for its variables), ns.
    pub module_ns: u64,
    /// Time of the library's start-up in the injection entry point (loading CUPTI,
    /// subscribing, the configuration), ns.
    pub init_ns: u64,
    /// Calls a tool made from its callbacks inside replay windows that may write memory the
    /// window's snapshot held (see [`crate::toolwork`]).
    pub tool_work: u64,
    /// Bytes those calls wrote there, kept by the restores that followed.
    pub tool_work_kept_bytes: u64,
    /// Of those calls, the ones whose work may have been undone (each reported on stderr).
    pub tool_work_lost: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let declines: Vec<String> = self
            .declined
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        let m = &self.memory;
        let ms = |ns: u64| ns as f64 / 1e6;
        write!(
            f,
            "summary passes_per_launch={} launches={} replayed={} passes_run={} failed={} \
             declined=[{}] graph_launches={} allocations={} frees={} \
             managed_allocations={} bytes_snapshotted={} bytes_restored={} restores={} \
             snapshot_ms={:.3} restore_ms={:.3} shadow_bytes_held={} relaunch_ms={:.3} \
             drain_ms={:.3} replay_ms={:.3} copies={} copy_ms={:.3} copy_wait_ms={:.3} \
             verified={} verified_ms={:.3} verified_wait_ms={:.3} lists_uploaded={} hashes={} \
             hash_ms={:.3} hash_wait_ms={:.3} shadow_allocs={} shadow_alloc_ms={:.3} \
             auto_device={} auto_full={} callbacks={} callback_ms={:.3} intercept_ms={:.3} \
             module_callbacks={} module_ms={:.3} init_ms={:.3} tool_work={} \
             tool_work_kept_bytes={} tool_work_lost={}",
            self.passes_per_launch,
            self.launches,
            self.replayed,
            self.passes_run,
            self.failed,
            declines.join(","),
            self.graph_launches,
            self.allocations,
            self.frees,
            self.managed_allocations,
            self.bytes_snapshotted,
            self.bytes_restored,
            self.restores,
            self.snapshot_ns as f64 / 1e6,
            self.restore_ns as f64 / 1e6,
            self.shadow_bytes_held,
            self.relaunch_ns as f64 / 1e6,
            self.drain_ns as f64 / 1e6,
            self.replay_ns as f64 / 1e6,
            m.copies,
            ms(m.copy_ns),
            ms(m.copy_wait_ns),
            m.verified,
            ms(m.verified_ns),
            ms(m.verified_wait_ns),
            m.lists_uploaded,
            m.hashes,
            ms(m.hash_ns),
            ms(m.hash_wait_ns),
            m.shadow_allocs,
            ms(m.shadow_alloc_ns),
            self.auto_device,
            self.auto_full,
            self.callbacks,
            ms(self.callback_ns),
            ms(self.callback_ns.saturating_sub(self.replay_ns)),
            self.module_callbacks,
            ms(self.module_ns),
            ms(self.init_ns),
            self.tool_work,
            self.tool_work_kept_bytes,
            self.tool_work_lost,
        )
    }
}

impl Backend {
    pub(super) fn summary(&self) -> Summary {
        // One look at the devices (their lock is not reentrant).
        let (shadow_bytes_held, memory) = self.devices.lock().iter().fold(
            (0, MemoryTimes::default()),
            |(bytes, times), (_, d)| {
                (
                    bytes + d.memory.shadow_bytes(),
                    times.add(&d.memory.times()),
                )
            },
        );
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Summary {
            passes_per_launch: self.config.passes,
            launches: l(&s.launches),
            replayed: l(&s.replayed),
            passes_run: l(&s.passes),
            failed: l(&s.failed),
            declined: s.declines.lock().clone(),
            graph_launches: l(&s.graph_launches),
            auto_device: l(&s.auto_device),
            auto_full: l(&s.auto_full),
            allocations: l(&s.allocations),
            frees: l(&s.frees),
            managed_allocations: l(&s.managed),
            bytes_snapshotted: l(&s.bytes_snapshotted),
            bytes_restored: l(&s.bytes_restored),
            restores: l(&s.restores),
            snapshot_ns: l(&s.snapshot_ns),
            restore_ns: l(&s.restore_ns),
            relaunch_ns: l(&s.relaunch_ns),
            drain_ns: l(&s.drain_ns),
            replay_ns: l(&s.replay_ns),
            shadow_bytes_held,
            memory,
            callbacks: l(&s.callbacks),
            callback_ns: l(&s.callback_ns),
            module_callbacks: l(&s.module_callbacks),
            module_ns: l(&s.module_ns),
            init_ns: l(&s.init_ns),
            tool_work: l(&s.tool_work),
            tool_work_kept_bytes: l(&s.tool_work_kept),
            tool_work_lost: l(&s.tool_work_lost),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_reports_interception_time_apart_from_the_replays() {
        let summary = Summary {
            callbacks: 12,
            callback_ns: 5_000_000,
            replay_ns: 3_000_000,
            module_callbacks: 4,
            module_ns: 250_000,
            init_ns: 1_500_000,
            ..Summary::default()
        };
        let line = summary.to_string();
        for part in [
            " callbacks=12 ",
            " callback_ms=5.000 ",
            " intercept_ms=2.000 ",
            " module_callbacks=4 ",
            " module_ms=0.250 ",
            " init_ms=1.500",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
    }

    #[test]
    fn a_timed_callback_is_counted_and_its_time_added_when_it_ends() {
        let stats = Stats::default();
        let start = Instant::now() - Duration::from_millis(2);
        {
            let _t = stats.timed(&stats.callbacks, &stats.callback_ns, start);
            assert_eq!(stats.callbacks.load(Ordering::Relaxed), 1);
            assert_eq!(
                stats.callback_ns.load(Ordering::Relaxed),
                0,
                "added at the end"
            );
        }
        assert!(stats.callback_ns.load(Ordering::Relaxed) >= 2_000_000);
    }
}
