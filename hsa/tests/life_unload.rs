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

/// Replays `rounds` dispatches one after another on a thread of its own, finalizing kreplay
/// from this thread once `at` of them completed; every dispatch adds exactly one.
fn finalize_during_a_stream(rounds: u32, at: u32) {
    let hooks = TestHooks::new(1);
    let app = app::install(hooks.clone(), InstallOptions::default());
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(PASSES));
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("life_unload_stream", add_one);
    let init = values(LEN, 11);
    let buf = app.buffer(pools.coarse, &init);
    let queue = app.queue(app.gpus[0]);
    let done_count = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = done_count.clone();
    let stream = std::thread::spawn(move || {
        for _ in 0..rounds {
            let done = app.signal(1);
            let kernarg = app.kernargs(
                &pools,
                AddOneArgs {
                    buf: buf.0,
                    len: LEN,
                    pad: 0,
                },
            );
            app.dispatch(queue, Aql::dispatch(kernel, LEN, 64, kernarg, done));
            assert_eq!(app.wait_zero(done), 0, "a completion did not fire");
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while done_count.load(Ordering::SeqCst) < at {
        assert!(std::time::Instant::now() < until, "the stream stalled");
        std::thread::yield_now();
    }
    kreplay_hsa::finalize();
    let joined = support::bounded(
        Duration::from_secs(60),
        vec![Box::new(move || stream.join().is_ok())],
    );
    assert_eq!(joined, vec![true]);
    let want: Vec<u32> = init.iter().map(|x| x + rounds).collect();
    let now = app.read(buf, LEN as usize);
    let wrong = now.iter().zip(&want).filter(|(n, w)| n != w).count();
    assert_eq!(
        wrong,
        0,
        "{wrong} elements are not initial + {rounds}: {:?}",
        &now[..4]
    );
}

scenarios! {
    /// Finalization lands somewhere in a stream of replayed dispatches (between two, or in the
    /// middle of one): each dispatch still adds exactly one, and none hangs.
    fn finalizing_during_a_stream_of_replays_keeps_every_result() {
        finalize_during_a_stream(60, 5);
    }
}
