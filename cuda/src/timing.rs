//! GPU begin/end timestamps of a launch's passes, for KERNEL_DISPATCH records.
//!
//! Three CUDA events per traced launch, on the launch's stream: `start` recorded right before a
//! pass's launch is submitted, `end` right after, and `anchor`, recorded once `end` completed
//! and waited for, whose completion is read on the host's `CLOCK_MONOTONIC`. A pass's times are
//! then the anchor's host time minus the GPU intervals `start → anchor` and `end → anchor`
//! (`cuEventElapsedTime`, about 0.5 µs resolution): nanoseconds of `CLOCK_MONOTONIC`, the same
//! clock for every record of the process. The anchor's host time is read when the wait for it
//! returns, a few microseconds after the GPU passed it, so every timestamp may sit that much
//! late; intervals (end − start) carry only the events' own resolution.

use std::ffi::c_int;

use crate::driver::{CuEvent, CuStream, Driver};

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
}

/// `CLOCK_MONOTONIC` (Linux).
const CLOCK_MONOTONIC: c_int = 1;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The host time of an anchor minus a GPU interval that ended at it, in nanoseconds.
pub fn before_anchor(anchor_ns: u64, interval_ms: f32) -> u64 {
    let back = (f64::from(interval_ms.max(0.0)) * 1e6).round() as u64;
    anchor_ns.saturating_sub(back)
}

/// The events of one traced launch (see the module docs).
pub struct PassTimer {
    driver: &'static Driver,
    stream: CuStream,
    start: CuEvent,
    end: CuEvent,
    anchor: CuEvent,
}

impl std::fmt::Debug for PassTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassTimer").finish_non_exhaustive()
    }
}

impl PassTimer {
    /// Three events for launches on `stream` (in the calling thread's current context, the
    /// launch's).
    pub fn new(driver: &'static Driver, stream: CuStream) -> Result<PassTimer, String> {
        let mut events = [std::ptr::null_mut(); 3];
        for i in 0..3 {
            // SAFETY: writes one event handle; flags 0 = default events, which record time.
            let rc = unsafe { (driver.event_create)(&mut events[i], 0) };
            if let Err(e) = driver.check("cuEventCreate", rc) {
                for made in &events[..i] {
                    // SAFETY: an event created just above and never used.
                    unsafe { (driver.event_destroy)(*made) };
                }
                return Err(e.to_string());
            }
        }
        Ok(PassTimer {
            driver,
            stream,
            start: events[0],
            end: events[1],
            anchor: events[2],
        })
    }

    fn record(&self, event: CuEvent) -> Result<(), String> {
        // SAFETY: an event of ours and the launch's stream, alive during the launch's call.
        let rc = unsafe { (self.driver.event_record)(event, self.stream) };
        self.driver
            .check("cuEventRecord", rc)
            .map_err(|e| e.to_string())
    }

    /// Right before a pass's launch is submitted.
    pub fn mark_start(&self) -> Result<(), String> {
        self.record(self.start)
    }

    /// Right after it was submitted.
    pub fn mark_end(&self) -> Result<(), String> {
        self.record(self.end)
    }

    fn elapsed_ms(&self, from: CuEvent, to: CuEvent) -> Result<f32, String> {
        let mut ms = 0f32;
        // SAFETY: two completed events of ours; writes one float.
        let rc = unsafe { (self.driver.event_elapsed_time)(&mut ms, from, to) };
        self.driver
            .check("cuEventElapsedTime", rc)
            .map_err(|e| e.to_string())?;
        Ok(ms)
    }

    /// Begin and end of the last marked pass in nanoseconds of `CLOCK_MONOTONIC`, once it
    /// completed (waits for it).
    pub fn times(&self) -> Result<(u64, u64), String> {
        let sync = |event: CuEvent| {
            // SAFETY: an event of ours that was recorded.
            let rc = unsafe { (self.driver.event_synchronize)(event) };
            self.driver
                .check("cuEventSynchronize", rc)
                .map_err(|e| e.to_string())
        };
        sync(self.end)?;
        self.record(self.anchor)?;
        sync(self.anchor)?;
        let anchor_ns = monotonic_ns();
        let start = before_anchor(anchor_ns, self.elapsed_ms(self.start, self.anchor)?);
        let end = before_anchor(anchor_ns, self.elapsed_ms(self.end, self.anchor)?);
        Ok((start, end.max(start)))
    }
}

impl Drop for PassTimer {
    fn drop(&mut self) {
        for event in [self.start, self.end, self.anchor] {
            // SAFETY: events created by `new`; the driver defers the release of an event still
            // pending on a stream.
            unsafe { (self.driver.event_destroy)(event) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_clock_is_monotonic_nanoseconds() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn times_are_the_anchor_minus_the_gpu_interval_never_below_zero() {
        assert_eq!(before_anchor(10_000_000, 0.002), 9_998_000);
        assert_eq!(before_anchor(10_000_000, 0.0), 10_000_000);
        assert_eq!(before_anchor(1_000, 5.0), 0, "saturates");
        assert_eq!(
            before_anchor(1_000, -1.0),
            1_000,
            "a negative interval is none"
        );
    }
}
