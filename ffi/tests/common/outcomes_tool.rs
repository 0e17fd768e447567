//! tests/c/outcomes_tool.c, the C tool that records how each replay ended: built, opened again
//! beside the libkreplay.so that loaded it, told what to answer, and read.

use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};

use kreplay::abi::{Counters, Status};

/// Mirror of `outcomes_event_t` in tests/c/outcomes_tool.c: one EXIT record as the tool saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub operation: u32,
    pub record_decline_reason: u32,
    pub dispatch_id: u64,
    pub current_pass: u64,
    pub outcome: u32,
    pub end_reason: u32,
    pub status: i32,
    pub decline_reason: u32,
    pub passes_run: u64,
    pub bytes_lost: u64,
    pub bytes_moved: u64,
    pub chunks_restored: u64,
    pub chunks_repaired: u64,
    pub unverified: u32,
    pub strategy: u32,
}

/// Builds tests/c/outcomes_tool.c into the scratch folder of `test`; the library's path.
pub fn build(test: &str) -> PathBuf {
    let path = super::scratch_dir(test).join("liboutcomes_tool.so");
    super::build_c_library("outcomes_tool.c", &path);
    path
}

/// The tool library, opened by the test: the same library kreplay loads, sharing its state.
pub struct OutcomesTool(libloading::Library);

impl OutcomesTool {
    /// Opens the library at `path` (loaded by kreplay already, or loaded by it later).
    pub fn open(path: &Path) -> Self {
        // SAFETY: the tool's initializers do nothing; its kreplay_* references resolve to the
        // libkreplay.so loaded with its symbols global.
        Self(unsafe { libloading::Library::new(path) }.expect("tool library"))
    }

    /// What the tool answers at CONFIG ENTER from the next dispatch on: `passes` (0: an
    /// indefinite loop), asking after every pass whether to go on when `with_continue`.
    ///
    /// # Safety
    ///
    /// No dispatch may be in flight: the tool reads its answer without synchronization.
    pub unsafe fn answer(&self, passes: u64, with_continue: bool) {
        type Answer = unsafe extern "C" fn(u64, c_int);
        // SAFETY: the signature of outcomes_tool_answer; the caller keeps dispatches away.
        unsafe {
            self.0.get::<Answer>(b"outcomes_tool_answer\0").unwrap()(
                passes,
                c_int::from(with_continue),
            )
        }
    }

    /// How many times the tool's initialize ran.
    pub fn initialized(&self) -> c_int {
        type Initialized = unsafe extern "C" fn() -> c_int;
        // SAFETY: the signature of outcomes_tool_initialized, a plain accessor.
        unsafe {
            self.0
                .get::<Initialized>(b"outcomes_tool_initialized\0")
                .unwrap()()
        }
    }

    /// The records the tool kept, in the order it saw them.
    ///
    /// # Safety
    ///
    /// No replay may run any more: the tool appends to them without synchronization.
    pub unsafe fn events(&self) -> Vec<Event> {
        type Count = unsafe extern "C" fn() -> usize;
        type Events = unsafe extern "C" fn() -> *const Event;
        // SAFETY: the signatures of the two accessors; the array holds `count` records, which
        // the caller keeps from changing while they are copied.
        unsafe {
            let count = self.0.get::<Count>(b"outcomes_tool_event_count\0").unwrap()();
            std::slice::from_raw_parts(
                self.0.get::<Events>(b"outcomes_tool_events\0").unwrap()(),
                count,
            )
            .to_vec()
        }
    }

    /// How many of the tool's own checks failed, and the first failure's message.
    ///
    /// # Safety
    ///
    /// No replay may run any more: the tool writes these without synchronization.
    pub unsafe fn failures(&self) -> (c_int, String) {
        type Failures = unsafe extern "C" fn(*mut *const c_char) -> c_int;
        let mut first: *const c_char = std::ptr::null();
        // SAFETY: the signature of outcomes_tool_failures, which points `first` at its
        // NUL-terminated message buffer.
        unsafe {
            let failures = self.0.get::<Failures>(b"outcomes_tool_failures\0").unwrap()(&mut first);
            (
                failures,
                CStr::from_ptr(first).to_string_lossy().into_owned(),
            )
        }
    }

    /// The per-process counters as the tool reads them through `kreplay_get_counters` (the
    /// read is asserted to succeed).
    pub fn counters(&self) -> Counters {
        type GetCounters = unsafe extern "C" fn(*mut Counters) -> Status;
        // The tool sets `size` itself, as a C caller does.
        let mut counters = Counters {
            size: 0,
            ..Counters::default()
        };
        // SAFETY: the signature of outcomes_tool_counters; `counters` is writable.
        let status = unsafe {
            self.0
                .get::<GetCounters>(b"outcomes_tool_counters\0")
                .unwrap()(&mut counters)
        };
        assert_eq!(status, Status::SUCCESS);
        counters
    }
}
