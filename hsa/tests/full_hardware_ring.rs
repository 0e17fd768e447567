//! An application that fills its queue's ring (a barrier it opens later, then dispatches) under
//! kreplay: kreplay adds packets of its own to the hardware queue behind the application's ring
//! (markers around a barrier whose condition does not hold), so the hardware ring fills before
//! the application's does. On ROCm the doorbell store then returns and the packets follow once
//! there is room; the application must reach the point where it opens the barrier.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use support::app::{self, Aql, Queue};
use support::counted::{AddArgs, add};
use support::tool::{Script, TestHooks};

fn small_queue(app: &app::App, agent: hsa_agent_t, size: u32) -> Queue {
    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
    let create = app.core().hsa_queue_create_fn.unwrap();
    // SAFETY: a valid agent and out pointer, no callback.
    let status = unsafe {
        create(
            agent,
            size,
            HSA_QUEUE_TYPE_MULTI,
            None,
            std::ptr::null_mut(),
            0,
            0,
            &raw mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    Queue(queue)
}

scenarios! {
    /// A ring of 4: a barrier on a signal the application sets after its next three dispatches.
    fn an_application_filling_its_ring_behind_a_closed_barrier_reaches_the_point_where_it_opens_it() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(Duration::from_millis(200)),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let queue = small_queue(&app, gpu, 4);
        let buf = app.buffer(pools.coarse, &[0; 64]);
        let kernel = kreplay_softhsa::register_kernel("full_ring_add", add);
        let gate = app.signal(1);
        let opened = app.signal(1);
        let done = app.signal(3);
        let packets: Vec<Aql> = (0..3)
            .map(|_| {
                let kernarg = app.kernargs(
                    &pools,
                    AddArgs {
                        buf: buf.0,
                        len: 64,
                        tag: 1,
                        amount: 1,
                    },
                );
                Aql::dispatch(kernel, 64, 64, kernarg, done)
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            app.dispatch(queue, Aql::barrier_and(&[gate], opened));
            for packet in packets {
                app.dispatch(queue, packet);
            }
            let _ = tx.send(());
        });
        let returned = rx.recv_timeout(Duration::from_secs(20)).is_ok();
        // Opened either way: a store that did not return then ends.
        app.store(gate, 0);
        assert!(returned, "a doorbell store waited for the full hardware ring");
        assert_eq!(app.wait_zero_within(opened, Duration::from_secs(10)), 0);
        assert_eq!(app.wait_zero_within(done, Duration::from_secs(10)), 0);
        assert_eq!(app.read(buf, 64), vec![3; 64], "each dispatch ran once in effect");
    }
}
