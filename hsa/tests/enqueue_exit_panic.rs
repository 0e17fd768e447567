//! A tool layer whose KERNEL_DISPATCH ENQUEUE panics (`ToolHooks::dispatch_enqueue`, after it
//! submitted the packets or before): the application's dispatches still run exactly once and
//! each completion fires once, whatever the write held.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Wrap, Wrapped};

/// Runs of `add_one` per tag.
static RUNS: [AtomicU32; 8] = [const { AtomicU32::new(0) }; 8];

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

/// `buf[i] += 1` for every work-item; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    let buf = args.buf as *mut u32;
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *buf.add(i as usize) += 1 };
        }
    }
}

/// Where the tool layer's ENQUEUE panics, once armed.
#[derive(Clone, Copy, PartialEq)]
enum PanicAt {
    /// After the packets were submitted (in what would deliver ENQUEUE EXIT).
    Exit,
    /// Before they were (in what would deliver ENQUEUE ENTER).
    Enter,
}

/// `dispatch_enqueue` panics once while armed.
struct Panicking {
    at: PanicAt,
    armed: AtomicBool,
}

impl Wrap for Panicking {
    fn dispatch_enqueue(&self, submit: &mut dyn FnMut()) {
        let panics = self.armed.swap(false, Ordering::SeqCst);
        if panics && self.at == PanicAt::Enter {
            panic!("the tool layer fails before ENQUEUE");
        }
        submit();
        if panics {
            panic!("the tool layer fails in ENQUEUE EXIT");
        }
    }
}

struct Env {
    app: App,
    hooks: Arc<Wrapped<Panicking>>,
    pools: Pools,
}

fn setup(at: PanicAt) -> Env {
    let hooks = Wrapped::new(
        1,
        Panicking {
            at,
            armed: AtomicBool::new(false),
        },
    );
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    fn add(&self, buf: Ptr, tag: u32, done: hsa_sys::hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len: 64,
                tag,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("enqueue_panic_add_one", add_one);
        Aql::dispatch(kernel, 64, 64, kernarg, done)
    }

    /// Three dispatches in one doorbell write, with the tool layer's ENQUEUE failing once:
    /// each must have run once, its completion fired once.
    fn three_in_one_write(&self) {
        let q = self.app.queue(self.app.gpus[0]);
        let bufs: Vec<Ptr> = (0..3)
            .map(|_| self.app.buffer(self.pools.coarse, &[5; 64]))
            .collect();
        let done: Vec<_> = (0..3).map(|_| self.app.signal(1)).collect();
        let packets: Vec<Aql> = (0..3)
            .map(|i| self.add(bufs[i], i as u32 + 1, done[i]))
            .collect();
        self.hooks.wrap.armed.store(true, Ordering::SeqCst);
        self.app.submit(q, &packets);
        for &d in &done {
            assert_eq!(self.app.wait_zero(d), 0, "each completion fires");
        }
        // A second run, were there one, would come in behind the first: wait for a marker
        // dispatch of the same queue before counting.
        let marker_done = self.app.signal(1);
        let marker_buf = self.app.buffer(self.pools.coarse, &[0; 64]);
        self.app
            .dispatch(q, self.add(marker_buf, 0, marker_done).with_barrier());
        assert_eq!(self.app.wait_zero(marker_done), 0);
        for (i, &d) in done.iter().enumerate() {
            assert_eq!(
                self.app.load(d),
                0,
                "dispatch {i}: its completion fired once"
            );
            assert_eq!(
                RUNS[i + 1].load(Ordering::SeqCst),
                1,
                "dispatch {i} ran exactly once"
            );
            assert_eq!(
                self.app.read(bufs[i], 64),
                vec![6; 64],
                "dispatch {i}: one run's result"
            );
        }
    }
}

scenarios! {
    /// The tool layer panics after the write of three dispatches was submitted: the dispatches
    /// after the first were written again by the recovery (run twice, their completions fired
    /// twice).
    fn a_panic_in_enqueue_exit_after_a_multi_packet_write_runs_each_dispatch_once() {
        let env = setup(PanicAt::Exit);
        env.three_in_one_write();
    }

    /// The tool layer panics before the write of three dispatches was submitted: they are
    /// forwarded as they were, each once.
    fn a_panic_in_enqueue_enter_of_a_multi_packet_write_runs_each_dispatch_once() {
        let env = setup(PanicAt::Enter);
        env.three_in_one_write();
    }
}
