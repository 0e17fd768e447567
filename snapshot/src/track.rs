//! Restores that know what a pass wrote: where the device's memory is written only by this
//! process's CPU through the host windows it hands out (`Capabilities::cpu_writes`), its pages
//! are followed with `kreplay-wtrack` from the snapshot on, and a restore writes back exactly
//! the chunks of the pages written since the last one, reading nothing else.

use std::ops::Range;
use std::time::Duration;

use kreplay_wtrack::WriteTracker;

use crate::device::HostWindow;
use crate::layout::{Layout, Piece};

/// The writes to a snapshot's regions, followed.
pub(crate) struct Tracking {
    tracker: WriteTracker,
    /// Scratch for the written page ranges of a restore.
    written: Vec<Range<usize>>,
    /// What the first store to a followed page costs the pass making it.
    pub(crate) fault: Duration,
    /// Pages the latest restore found written.
    pub(crate) last_pages: Option<u64>,
}

impl Tracking {
    /// Follows the host windows of every region, or `None` when one has no window or the
    /// memory cannot be followed (the caller restores without).
    pub(crate) fn arm(wins: &[Option<HostWindow>]) -> Option<Tracking> {
        let ranges: Option<Vec<Range<usize>>> = wins
            .iter()
            .map(|w| w.map(|w| w.as_ptr() as usize..w.as_ptr() as usize + w.len()))
            .collect();
        let fault = kreplay_wtrack::fault_cost()?;
        let tracker = WriteTracker::new(&ranges?).ok()?;
        Some(Tracking {
            tracker,
            written: Vec::new(),
            fault,
            last_pages: None,
        })
    }

    /// Global indices, in order, of the chunks of live regions that share a byte with a page
    /// written since the last [`rearm`](Tracking::rearm); `None` when the tracker cannot say
    /// (everything must then be written back).
    pub(crate) fn changed(
        &mut self,
        layout: &Layout,
        live: &[bool],
        wins: &[Option<HostWindow>],
    ) -> Option<Vec<usize>> {
        self.written.clear();
        let pages = self.tracker.written(&mut self.written).ok()?;
        self.last_pages = Some(pages as u64);
        let mut changed = Vec::new();
        for (r, win) in wins.iter().enumerate() {
            if !live[r] {
                continue;
            }
            let win = (*win)?;
            let base = win.as_ptr() as usize;
            let size = layout.regions[r].size as usize;
            let end = base + size;
            let cs = layout.chunk_size as usize;
            let first = layout.first_chunk[r];
            let from = self.written.partition_point(|w| w.end <= base);
            let mut next = 0;
            for w in self.written[from..].iter().take_while(|w| w.start < end) {
                let lo = (w.start.max(base) - base) / cs;
                let hi = (w.end.min(end) - base).div_ceil(cs);
                for k in lo.max(next)..hi {
                    changed.push(first + k);
                }
                next = next.max(hi);
            }
        }
        Some(changed)
    }

    /// Follow the bytes of `pieces` again (after they were written back). False when the
    /// tracker refused: it can no longer be trusted.
    pub(crate) fn rearm(
        &self,
        layout: &Layout,
        wins: &[Option<HostWindow>],
        pieces: &[Piece],
    ) -> bool {
        let ranges: Vec<Range<usize>> = pieces
            .iter()
            .filter_map(|p| {
                let win = wins[p.region]?;
                let (off, len) = layout.piece_span(p);
                let start = win.as_ptr() as usize + off as usize;
                Some(start..start + len as usize)
            })
            .collect();
        self.tracker.protect(&ranges).is_ok()
    }

    /// Bytes of the pages the latest restore found written.
    pub(crate) fn last_written_bytes(&self) -> u64 {
        self.last_pages.unwrap_or(0) * self.tracker.page_size() as u64
    }

    /// What the latest restore's pass paid in faults.
    pub(crate) fn last_faults(&self) -> Duration {
        self.fault * self.last_pages.unwrap_or(0) as u32
    }
}
