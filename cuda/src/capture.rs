//! Stream captures in progress, and why a replay must not drain a device while one is.
//!
//! A replay drains the launch's device with `cuCtxSynchronize` before its snapshot. While any
//! stream of that context is being captured into a graph (`cuStreamBeginCapture` until
//! `cuStreamEndCapture`), synchronizing the context conflicts with the capture whatever the
//! calling thread's capture interaction mode: the call fails and the capture is invalidated, so
//! the application's `cuStreamEndCapture` fails. Captured work does not execute, so there would
//! be nothing of it to wait for, but the driver offers no way to wait for "every stream but the
//! capturing ones" of a context, and a snapshot taken without the device drained could see
//! kernels of other streams still writing.
//!
//! So kreplay follows the captures itself ([`Captures`], from the API callbacks of the calls
//! that begin and end one) and declines a replay on a device where one is in progress
//! (`batch_or_graph`: the launch runs once, as a launch captured into a graph does). A capture
//! cannot begin while a replay window holds the device: the calls that begin one take the
//! reader side of the device's lock, like copies, so the check made under the writer lock
//! stays true until the window closes.

use std::thread::ThreadId;

use kreplay_locks::AgentLocks;
use parking_lot::Mutex;

/// Which stream a capture is on. The per-thread default stream has one handle for every thread
/// (`CU_STREAM_PER_THREAD`, or null in a `_ptsz` call), so its captures are told apart by thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureStream {
    /// The stream handle (`CU_STREAM_PER_THREAD` for a per-thread default stream, however the
    /// call named it).
    pub handle: usize,
    /// The thread whose per-thread default stream it is (`None` for any other stream).
    pub thread: Option<ThreadId>,
}

impl CaptureStream {
    /// The stream a capture call on the calling thread names: `handle`, from a `_ptsz` entry
    /// point when `per_thread_call`.
    pub fn named(handle: usize, per_thread_call: bool) -> CaptureStream {
        let per_thread_default =
            handle == crate::driver::CU_STREAM_PER_THREAD || (per_thread_call && handle == 0);
        if per_thread_default {
            CaptureStream {
                handle: crate::driver::CU_STREAM_PER_THREAD,
                thread: Some(std::thread::current().id()),
            }
        } else {
            CaptureStream {
                handle,
                thread: None,
            }
        }
    }
}

#[derive(Debug)]
struct Capture {
    stream: CaptureStream,
    /// The device of the context the capture began in (`None`: unknown, so it counts on every
    /// device).
    device: Option<u64>,
}

/// The stream captures in progress in the process.
#[derive(Debug, Default)]
pub struct Captures {
    active: Mutex<Vec<Capture>>,
}

impl Captures {
    /// No capture in progress.
    pub fn new() -> Captures {
        Captures::default()
    }

    /// API ENTER of a call that begins a capture in a context of `device`: waits while a
    /// replay window holds the device (it drains and snapshots it), then holds the reader side
    /// of the device's lock until [`begin_exit`](Self::begin_exit), like a copy
    /// ([`crate::fence`]). Where the device is not known the capture counts on every device
    /// (see `on_device`), so it waits for the windows of all of `known` (every device kreplay
    /// has state for).
    pub fn begin_enter(&self, locks: &AgentLocks, device: Option<u64>, known: &[u64]) {
        match device {
            Some(device) => crate::fence::enter(locks, &[device]),
            None => {
                let mut all = known.to_vec();
                all.sort_unstable();
                all.dedup();
                crate::fence::enter(locks, &all);
            }
        }
    }

    /// API EXIT of that call: `begun` names the stream and device when it succeeded; the
    /// reader side is given back after the capture is recorded, so a replay window that opens
    /// next sees it.
    pub fn begin_exit(&self, begun: Option<(CaptureStream, Option<u64>)>) {
        if let Some((stream, device)) = begun {
            self.begun(stream, device);
        }
        crate::fence::exit();
    }

    /// A capture began (its call succeeded) on `stream`, in a context of `device`.
    pub fn begun(&self, stream: CaptureStream, device: Option<u64>) {
        self.active.lock().push(Capture { stream, device });
    }

    /// The capture on `stream` ended (`cuStreamEndCapture` left the stream not capturing,
    /// whether it returned a graph or reported the capture invalidated). Returns whether a
    /// capture on that stream was being followed.
    pub fn ended(&self, stream: CaptureStream) -> bool {
        let mut active = self.active.lock();
        match active.iter().position(|c| c.stream == stream) {
            Some(i) => {
                active.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// How many captures are in progress on `device` (those of an unknown device included).
    pub fn on_device(&self, device: u64) -> usize {
        self.active
            .lock()
            .iter()
            .filter(|c| c.device.is_none_or(|d| d == device))
            .count()
    }

    /// Whether any capture is in progress, on any device.
    pub fn any(&self) -> bool {
        !self.active.lock().is_empty()
    }

    /// `Err` with the reason when a replay on `device` must not drain it (a capture is in
    /// progress there).
    pub fn check_drainable(&self, device: u64) -> Result<(), String> {
        match self.on_device(device) {
            0 => Ok(()),
            n => Err(format!(
                "{n} stream capture(s) in progress on device {device}: synchronizing its \
                 context would invalidate them, so the launch runs once"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(handle: usize) -> CaptureStream {
        CaptureStream::named(handle, false)
    }

    #[test]
    fn a_capture_blocks_the_drain_of_its_device_until_it_ends() {
        let c = Captures::new();
        assert!(c.check_drainable(0).is_ok());
        c.begun(stream(0x100), Some(0));
        let why = c.check_drainable(0).unwrap_err();
        assert!(why.contains("capture"), "{why}");
        assert!(
            c.check_drainable(1).is_ok(),
            "another device is not concerned"
        );
        assert!(c.ended(stream(0x100)));
        assert!(c.check_drainable(0).is_ok());
        assert!(!c.ended(stream(0x100)), "ended once");
    }

    #[test]
    fn captures_on_several_streams_are_counted_one_by_one() {
        let c = Captures::new();
        c.begun(stream(0x100), Some(0));
        c.begun(stream(0x200), Some(0));
        assert_eq!(c.on_device(0), 2);
        assert!(!c.ended(stream(0x300)), "a stream that never captured");
        assert!(c.ended(stream(0x100)));
        assert_eq!(c.on_device(0), 1);
        assert!(c.check_drainable(0).is_err());
        assert!(c.ended(stream(0x200)));
        assert_eq!(c.on_device(0), 0);
    }

    #[test]
    fn a_capture_of_an_unknown_device_blocks_every_device() {
        let c = Captures::new();
        c.begun(stream(0x100), None);
        assert!(c.check_drainable(0).is_err());
        assert!(c.check_drainable(7).is_err());
    }

    #[test]
    fn per_thread_default_streams_of_two_threads_are_different_streams() {
        let c = std::sync::Arc::new(Captures::new());
        let here = CaptureStream::named(crate::driver::CU_STREAM_PER_THREAD, false);
        assert_eq!(here, CaptureStream::named(0, true), "null in a _ptsz call");
        assert_ne!(
            here,
            CaptureStream::named(0, false),
            "null: the legacy stream"
        );
        let there = {
            let c = c.clone();
            std::thread::spawn(move || {
                let s = CaptureStream::named(0, true);
                c.begun(s, Some(0));
                s
            })
            .join()
            .unwrap()
        };
        assert_ne!(here, there);
        assert!(!c.ended(here), "this thread's stream never captured");
        assert_eq!(c.on_device(0), 1);
        assert!(c.ended(there));
    }
}
