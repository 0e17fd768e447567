//! A stream capture that begins while a replay window holds a device waits for the window,
//! whether or not kreplay can tell the capturing context's device (where it could not, the
//! capture began mid-window).

use std::sync::mpsc;
use std::time::Duration;

use kreplay_cuda::capture::{CaptureStream, Captures};
use kreplay_locks::AgentLocks;

/// A capture call whose context's device kreplay cannot tell (`device` None) counts on every
/// device (`on_device`), so it must not begin while a replay window holds any device either:
/// otherwise the window's "no capture on the device" check, made under the writer lock before
/// the drain, stops holding mid-window (the tool-work quiesce drains the device mid-window).
#[test]
fn capture_of_unknown_device_waits_for_an_open_window() {
    let locks = std::sync::Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let captures = std::sync::Arc::new(Captures::new());
    // A replay window on device 0 (its writer side), having checked: no capture there.
    let window = locks.write(0).unwrap();
    assert!(captures.check_drainable(0).is_ok());
    let (tx, rx) = mpsc::channel();
    let t = {
        let locks = locks.clone();
        let captures = captures.clone();
        std::thread::spawn(move || {
            captures.begin_enter(&locks, None, &[0, 1]);
            tx.send(()).unwrap();
            captures.begin_exit(Some((CaptureStream::named(0x1234, false), None)));
        })
    };
    let began_mid_window = rx.recv_timeout(Duration::from_millis(300)).is_ok();
    // Mid-window, the device the window drains now has a capture in progress.
    let drainable_mid_window = captures.check_drainable(0).is_ok();
    drop(window);
    if !began_mid_window {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("begins once the window closed");
    }
    t.join().unwrap();
    assert!(
        !began_mid_window,
        "a capture of an unknown device began inside device 0's replay window \
         (drainable mid-window: {drainable_mid_window})"
    );
}

/// Same, with the device known: it waits (the documented rule), as a control.
#[test]
fn capture_of_known_device_waits_for_an_open_window() {
    let locks = std::sync::Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let captures = std::sync::Arc::new(Captures::new());
    let window = locks.write(0).unwrap();
    let (tx, rx) = mpsc::channel();
    let t = {
        let locks = locks.clone();
        let captures = captures.clone();
        std::thread::spawn(move || {
            captures.begin_enter(&locks, Some(0), &[0, 1]);
            tx.send(()).unwrap();
            captures.begin_exit(Some((CaptureStream::named(0x1234, false), Some(0))));
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    drop(window);
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    t.join().unwrap();
    assert!(captures.check_drainable(0).is_err());
}
