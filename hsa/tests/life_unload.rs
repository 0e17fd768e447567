//! kreplay is finalized (what `OnUnload` does, from `hsa_shut_down`) while one of the
//! application's dispatches is still being replayed on another thread: the replay goes on to its
//! end, and work the application submits meanwhile on the same agent must not be undone by the
//! restores still to come.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kreplay_hsa::InstallOptions;
use support::app::{self, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

static HELD: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

const PASSES: u64 = 3;
const LEN: u32 = 1024;

fn values(len: u32, k: u32) -> Vec<u32> {
    (0..len).map(|i| i * k + 1).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

/// How the application writes a buffer of the replayed agent after finalization.
#[derive(Clone, Copy)]
enum Late {
    /// A kernel dispatch on a second queue (`x += 1`).
    Dispatch,
    /// An async copy of the buffer's values plus one from host memory.
    Copy,
}

/// Holds a replay at pass 1, finalizes kreplay, makes another thread write a second buffer of
/// the same agent (one the replay's snapshot holds) as `late` says, releases the replay and
/// checks that both buffers end as one run of each leaves them.
fn late_write_survives(late: Late) {
    let hooks = TestHooks::new(0);
    let app = app::install(hooks.clone(), InstallOptions::default());
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(PASSES).on_pass_enter(|_, _, pass, _| {
        if pass == 1 && !HELD.swap(true, Ordering::SeqCst) {
            assert!(
                support::wait_flag(&RELEASE),
                "the scenario never released the replay"
            );
        }
    }));
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("life_unload_add_one", add_one);
    let packet = move |buf: app::Ptr, done| {
        let kernarg = app.kernargs(
            &pools,
            AddOneArgs {
                buf: buf.0,
                len: LEN,
                pad: 0,
            },
        );
        Aql::dispatch(kernel, LEN, 64, kernarg, done)
    };
    let replayed_init = values(LEN, 3);
    let replayed = app.buffer(pools.coarse, &replayed_init);
    let other_init = values(LEN, 5);
    let other = app.buffer(pools.coarse, &other_init);
    let source = app.buffer(app.host_pool(), &plus_one(&other_init));
    let queue = app.queue(app.gpus[0]);
    let second = app.queue(app.gpus[0]);
    let done = app.signal(1);
    let held = packet(replayed, done);
    let submitter = std::thread::spawn(move || app.dispatch(queue, held));
    assert!(support::wait_flag(&HELD), "the replay never reached pass 1");

    kreplay_hsa::finalize();
    let other_done = app.signal(1);
    let writer = std::thread::spawn(move || match late {
        Late::Dispatch => app.dispatch(second, packet(other, other_done)),
        Late::Copy => app.async_copy(
            other,
            app.gpus[0],
            source,
            app.cpu,
            LEN as usize * 4,
            other_done,
        ),
    });
    // Give the late write every chance to land before the replay goes on (one that waits for
    // the replay's end waits here too, which is fine).
    let _ = app.wait_zero_within(other_done, Duration::from_millis(300));
    RELEASE.store(true, Ordering::SeqCst);
    let joined = support::bounded(
        Duration::from_secs(20),
        vec![
            Box::new(move || submitter.join().is_ok()),
            Box::new(move || writer.join().is_ok()),
        ],
    );
    assert_eq!(joined, vec![true, true]);
    assert_eq!(app.wait_zero(done), 0);
    assert_eq!(app.wait_zero(other_done), 0);
    assert_eq!(app.read(replayed, LEN as usize), plus_one(&replayed_init));
    let now = app.read(other, LEN as usize);
    let want = plus_one(&other_init);
    let lost = now.iter().zip(&want).filter(|(n, w)| n != w).count();
    assert_eq!(lost, 0, "the late write was undone in {lost} elements");
}

scenarios! {
    /// Another thread's dispatch on a second queue of the replayed agent, submitted after
    /// finalization while the replay is held at pass 1, over a buffer the replay's snapshot
    /// holds: its one increment survives the replay's remaining restores.
    fn a_dispatch_submitted_after_finalize_during_a_replay_is_not_undone_by_its_restores() {
        late_write_survives(Late::Dispatch);
    }

    /// The same with an async copy into that buffer.
    fn an_async_copy_submitted_after_finalize_during_a_replay_is_not_undone_by_its_restores() {
        late_write_survives(Late::Copy);
    }
}
