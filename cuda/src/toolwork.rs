//! Work a tool issues from its own callbacks inside a replay window, kept across the restores
//! that follow (docs/abi.md §3 rule 10).
//!
//! A launch, copy or memset a tool makes from a callback runs once, at once (kreplay's re-entry
//! guard keeps it out of the window). From SNAPSHOT EXIT to the last pass the window's snapshot
//! is held, and its next restore would write the snapshot back over what that work changed. So
//! while a window is open on a thread (`open`, from the moment its snapshot is taken), a call
//! of the tool's on that thread is bracketed:
//!
//! * **[`before`]**, at the call's API ENTER, notes what of the snapshot's memory the call may
//!   write (its [`Target`]). A 1D copy or memset names its destination range: nothing is read
//!   now. For anything else (the regions a launch's arguments point into, or the whole
//!   snapshot) that memory is captured to the host once the device is idle. A call into memory
//!   the snapshot does not hold (a buffer the tool allocated inside its callbacks, never
//!   tracked) costs nothing.
//! * **[`after`]**, at its API EXIT, once the device is idle again, keeps for the window what the
//!   call wrote (a [`Delta`]): the current bytes of a named range, every one of them (a byte
//!   written with the value it held is still written), or what differs from the capture, byte
//!   for byte; memory freed meanwhile (by another thread: frees take no device lock) is not
//!   read. A capture cannot tell a byte written with the value it already held from one not
//!   written: a launch from PASS EXIT that writes, into bytes the pass changed, the values the
//!   pass left there leaves those bytes to be restored.
//! * **The window's next restore** folds the kept deltas into the snapshot first
//!   (`fold_into`, `kreplay_snapshot::Snapshot::fold`), so that restore and every later one
//!   brings the work's bytes back. The launched kernel's own writes are still undone: a capture
//!   is taken after them and only the tool's changes are listed.
//!
//! Failures (no host memory for a capture, a device that does not go idle) are reported through
//! [`ToolWorkIo::lost`]: the work then still ran, but a later restore may undo it.

use kreplay_late::Late;
use std::cell::RefCell;

use kreplay_snapshot::{Capture, Delta, Footprint, Snapshot};

/// How a window's memory is read around a tool's work, for the device the window replays on.
pub trait ToolWorkIo {
    /// Waits until the device finished everything submitted to it.
    fn quiesce(&self) -> Result<(), String>;
    /// The current bytes of `footprint` (see `kreplay_snapshot::Snapshotter::capture`).
    fn capture(&self, footprint: &Footprint) -> Result<Capture, String>;
    /// The current bytes of the parts of the `len` bytes at `addr` that lie in `footprint`'s
    /// regions still allocated, all of them written (see
    /// `kreplay_snapshot::Snapshotter::written_within`): memory another thread freed during the
    /// call (frees take no device lock) may be unmapped already, and is not read; a free waits
    /// for the read.
    fn written(&self, footprint: &Footprint, addr: u64, len: u64) -> Result<Delta, String>;
    /// What differs in memory from `since` (see `kreplay_snapshot::Snapshotter::changes`).
    fn changes(&self, since: &Capture) -> Result<Delta, String>;
    /// The tool's work `call` may be undone by a later restore, because of `why`.
    fn lost(&self, call: &str, why: &str);
}

/// What a tool's call may write.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// `len` bytes at `addr`, every one of them written: the destination of a 1D copy or
    /// memset.
    Range {
        /// First byte.
        addr: u64,
        /// Bytes written.
        len: u64,
    },
    /// The regions these addresses point into or end at (an end pointer, which a kernel may
    /// walk back from): a 2D memset's destination (it writes inside
    /// that allocation), or a launch's argument values where they are trusted to name
    /// everything the kernel reaches (`KREPLAY_SNAPSHOT_SCOPE=referenced`).
    Reached(&'a [u64]),
    /// Any memory of the snapshot (2D, 3D, peer, batched and array copies, stream writes,
    /// graph launches, launches whose arguments are not trusted or not known).
    Anything,
}

/// What [`before`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    /// No replay window's callback is running on this thread: the work is the tool's own
    /// business (CONFIG ENTER, CONFIG EXIT, outside any window).
    Outside,
    /// Inside a replay callback, but the window keeps no tool work (a window over a device
    /// without [`ToolWorkIo`]): the work may be undone.
    NotKept,
    /// The call writes none of the snapshot's memory: nothing captured.
    Untouched,
    /// The call may write this many bytes of the snapshot's memory (a range to read at
    /// [`after`], or bytes captured now).
    Watching(u64),
    /// The capture failed (reported through [`ToolWorkIo::lost`]).
    Failed,
}

/// What [`before`] noted of the call in progress.
enum Watch {
    /// Pieces (address, length) of the snapshot's memory the call writes whole.
    Ranges(Vec<(u64, u64)>),
    /// What the memory it may write held before it.
    Captured(Capture),
}

struct Open {
    footprint: Footprint,
    io: Box<dyn ToolWorkIo>,
    /// The call in progress, with its name.
    call: Option<(Watch, String)>,
    /// What the tool's calls changed since the last fold.
    pending: Vec<Delta>,
}

thread_local! {
    static OPEN: RefCell<Option<Open>> = const { RefCell::new(None) };
    /// [`OPEN`] once it is destroyed: a window opened from a thread-local destructor at thread
    /// exit (see `kreplay_late`).
    static OPEN_LATE: Late<Option<Open>> = const { Late::new() };
}

/// Runs `f` on this thread's open window state (see `kreplay_late`).
fn with_open<R>(f: impl FnOnce(&RefCell<Option<Open>>) -> R) -> R {
    kreplay_late::with(&OPEN, &OPEN_LATE, f)
}

/// A window's snapshot of `footprint` was taken on this thread: from now until [`close`], the
/// tool's work is captured and kept through `io` (`None`: the window cannot keep it).
pub(crate) fn open(footprint: Footprint, io: Option<Box<dyn ToolWorkIo>>) {
    with_open(|o| {
        *o.borrow_mut() = io.map(|io| Open {
            footprint,
            io,
            call: None,
            pending: Vec::new(),
        })
    });
}

/// The window on this thread ended: what is still pending stays in memory (no restore follows).
pub(crate) fn close() {
    with_open(|o| o.borrow_mut().take());
}

/// API ENTER of the tool's call `call` that may write `target`: captures the part of the
/// window's snapshot it may write.
pub fn before(call: &str, target: Target<'_>) -> Before {
    if !crate::window::in_replay_callback() {
        return Before::Outside;
    }
    with_open(|o| {
        // Busy: this is kreplay's own copy or synchronization inside a capture, not the tool's.
        let Ok(mut o) = o.try_borrow_mut() else {
            return Before::Untouched;
        };
        let Some(open) = o.as_mut() else {
            return Before::NotKept;
        };
        let within = |a: u64, r: &kreplay_snapshot::Region| a >= r.base && a - r.base < r.size;
        open.call = None;
        let call = call.to_string();
        let part = match target {
            Target::Range { addr, len } => {
                let pieces: Vec<(u64, u64)> = open.footprint.pieces(addr, len).collect();
                if pieces.is_empty() {
                    return Before::Untouched;
                }
                let bytes = pieces.iter().map(|p| p.1).sum();
                open.call = Some((Watch::Ranges(pieces), call));
                return Before::Watching(bytes);
            }
            // A value one past a region's end is an end pointer, which a kernel may walk back
            // from (the application's launches are scanned so too).
            Target::Reached(values) => open.footprint.only(|r| {
                values
                    .iter()
                    .any(|&v| within(v, r) || v.checked_sub(1).is_some_and(|l| within(l, r)))
            }),
            Target::Anything => open.footprint.clone(),
        };
        if part.is_empty() {
            return Before::Untouched;
        }
        let captured = open.io.quiesce().and_then(|()| open.io.capture(&part));
        match captured {
            Ok(capture) => {
                let bytes = capture.bytes();
                open.call = Some((Watch::Captured(capture), call));
                Before::Watching(bytes)
            }
            Err(why) => {
                open.io.lost(&call, &format!("no capture before it: {why}"));
                Before::Failed
            }
        }
    })
}

/// API EXIT of the tool's call that [`before`] watched: keeps what it wrote for the window's
/// next restore. Returns the bytes kept (0 when nothing was watched). A call that failed
/// (`succeeded` false) wrote nothing into a named range: reading the range then would take what
/// the pass left there for the tool's work, so it is dropped (a comparison is still made).
pub fn after(succeeded: bool) -> u64 {
    with_open(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return 0;
        };
        let Some(open) = o.as_mut() else { return 0 };
        let Some((watch, call)) = open.call.take() else {
            return 0;
        };
        if !succeeded && matches!(watch, Watch::Ranges(_)) {
            return 0;
        }
        let io = &open.io;
        let footprint = &open.footprint;
        // Both readings leave out what was freed since `before`: the memory may be gone.
        let delta = io.quiesce().and_then(|()| match &watch {
            Watch::Captured(capture) => io.changes(capture),
            Watch::Ranges(pieces) => pieces.iter().try_fold(Delta::default(), |mut d, &(a, n)| {
                d.append(io.written(footprint, a, n)?);
                Ok(d)
            }),
        });
        match delta {
            Ok(delta) if delta.is_empty() => 0,
            Ok(delta) => {
                let bytes = delta.bytes();
                open.pending.push(delta);
                bytes
            }
            Err(why) => {
                open.io
                    .lost(&call, &format!("its changes could not be read: {why}"));
                0
            }
        }
    })
}

/// Folds what the tool's work changed since the last call into `snapshot` (before a restore).
/// Returns the bytes folded in.
pub(crate) fn fold_into(snapshot: &mut Snapshot) -> u64 {
    with_open(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return 0;
        };
        let Some(open) = o.as_mut() else { return 0 };
        let mut folded = 0;
        for delta in std::mem::take(&mut open.pending) {
            match snapshot.fold(&delta) {
                Ok(n) => folded += n,
                Err(e) => open.io.lost(
                    "work issued from a replay callback",
                    &format!("folding it into the snapshot failed: {e}"),
                ),
            }
        }
        folded
    })
}
