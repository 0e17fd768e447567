//! Restores that know what a pass wrote: where the device's memory is written only by this
//! process's CPU through the host windows it hands out (`Capabilities::cpu_writes`), its pages
//! are followed with `kreplay-wtrack` from the snapshot on, and a restore writes back exactly
//! the chunks of the pages written since the last one, reading nothing else. Pages the passes
//! keep writing are left writable between restores and written back at each (see
//! [`Tracking::rearm`]): a replay's passes run the same kernel on the same bytes, and a page's
//! write-back costs less than the fault its first store would pay every pass.

use std::ops::Range;
use std::time::{Duration, Instant};

use kreplay_wtrack::{PageCosts, WriteTracker};

use crate::device::HostWindow;
use crate::layout::{Layout, Piece};
use crate::learned::{Learned, Rates, estimate};

/// Following writes must cost less than restoring without by this share of the latter: the
/// estimates are medians of measurements that move by tens of percent on a shared machine.
const TRACK_MARGIN: f64 = 0.05;

/// Where following writes now is priced as paying only because the next snapshot of the same
/// footprint continues from it (see [`Outlook::continues`]), it must cost less than restoring
/// without by this share instead of [`TRACK_MARGIN`]: that next snapshot may not come, and then
/// what was counted on (a copy of the footprint, un-protecting it later) is not saved. On the
/// 2-core development machine, with only [`TRACK_MARGIN`], auto started following 256 MiB
/// footprints whose 8-pass replays wrote a tenth of their pages each pass, and lost a fifth to
/// hash restores in the replays that started it (measured while tracked write-backs were still
/// timed with their re-protecting, which also made the alternatives look dearer).
const BET_MARGIN: f64 = 0.15;

/// A fault in a footprint costs this many times the fault `kreplay-wtrack` measures on its
/// small scratch mapping, whose page tables stay cached: on the 2-core development machine a
/// pass writing 10% of a 256 MiB footprint paid 0.85-1.0 us a page, against 0.67-0.74 us
/// measured by the probe in the same process (1.2-1.45x); priced low, auto followed writes
/// where a tenth of the footprint changed per pass and lost a third to full restores.
const FAULT_IN_FOOTPRINT: f64 = 1.4;

/// What auto knows, when a snapshot is taken, of the replay ahead and of the kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outlook<'a> {
    /// Restores the replay plans (or expects from earlier dispatches).
    pub restores: Option<u64>,
    /// The share of its chunks the kernel's earlier dispatch found changed; for a kernel seen
    /// for the first time, or whose earlier dispatch restored in full, what the latest dispatch
    /// of any kernel found.
    pub dirty: Option<f64>,
    /// The share of what a pass writes that the pass before it wrote too, as the kernel's
    /// earlier dispatch measured it, else as the latest dispatch of any kernel did (see
    /// [`Learned::repeat`]); unknown counts as none.
    pub repeat: Option<f64>,
    /// What earlier dispatches of the kernel learned.
    pub earlier: Option<&'a Learned>,
    /// Bytes of the footprint.
    pub bytes: u64,
    /// Chunks of the footprint.
    pub chunks: u64,
    /// The chunk size.
    pub chunk_size: u64,
    /// Whether the footprint is still followed from an earlier replay (see [`Followed`]): then
    /// following it costs no protecting now, and its snapshot copies only the pages written
    /// since, while not following it costs un-protecting it now and a copy of all of it.
    pub followed: bool,
    /// Whether the footprint, if followed, is expected to stay followed after the replay for
    /// the next snapshot of it (this snapshot's store is kept, and it covers the same
    /// allocations as the snapshot before it): then un-protecting it is not this replay's cost,
    /// and following it saves the next snapshot a copy of all of it.
    pub continues: bool,
}

/// The estimated cost, in nanoseconds, of a replay (`outlook`) that follows writes, and of the
/// same replay restoring the cheapest way without (full restores, or verified ones with the
/// snapshot's hashes they need); `None` until a copy has been measured (nothing to price the
/// alternative by).
///
/// Following writes costs, per page of the footprint, protecting it when the snapshot is taken
/// and un-protecting it when it is dropped; per pass, the first and the last included, a fault
/// for each page it writes (taken as every page of the chunks `dirty` says change), except,
/// where the passes mostly write what the pass before wrote (`repeat`), the pages left open
/// from the second restore on; per
/// restore, a scan of the footprint's pages, the write-back of the chunks written, and
/// protecting their pages again (those two as earlier tracked restores measured them per page
/// written, where they did). Unknown `dirty` counts as nothing written: the best case,
/// which the first restore then measures (see `stop_tracking_if_dear` in the snapshot). A
/// footprint still followed (`followed`) is not protected again, its snapshot copies what was
/// written since, and not following it costs un-protecting it now and a copy of all of it; one
/// expected to stay followed for the next snapshot (`continues`) is not un-protected at the
/// end, and following it saves that snapshot a copy of all of it.
pub(crate) fn replay_costs(
    rates: &Rates,
    prices: &Prices,
    outlook: &Outlook<'_>,
) -> Option<(f64, f64)> {
    let copy = rates.copy_ns_per_byte()?;
    let restores = outlook.restores? as f64;
    let bytes = outlook.bytes as f64;
    let pages = bytes / kreplay_wtrack::page_size() as f64;
    let share = outlook.dirty.unwrap_or(0.0).clamp(0.0, 1.0);
    let (written, written_pages) = (share * bytes, share * pages);
    let write_back = rates.scattered_per_byte(written as u64) * written;
    let page = &prices.page;
    // Passes whose writes fault: every pass, unless the passes mostly write what the pass
    // before wrote; then those pages are left open from the second restore on (see
    // `Tracking::rearm`), and fault again only after every REVISIT_EVERYth restore (at
    // most: revisits are put off while the passes keep writing the open pages, which this
    // leaves out, so a long replay of the same writes is priced a little above its cost).
    // Restores whose write-back protects every page written again are, likewise, the first
    // and a share of the others.
    let fresh = outlook
        .repeat
        .and_then(faulting_share)
        .filter(|_| restores >= 2.0);
    let (faulting, protecting) = match fresh {
        Some(fresh) => (
            2.0 + (restores - 1.0) * fresh,
            1.0 + (restores - 1.0) * fresh,
        ),
        None => (restores + 1.0, restores),
    };
    // Per restore beyond the scan: the write-back of the pages written, as tracked restores
    // here measured it per page, else at the rate of write-backs that size; and protecting
    // again the pages not left open, as tracked restores measured it per page protected, else
    // as starting to follow a page costs.
    let back = prices
        .written_ns
        .at(written_pages.round() as u64)
        .map_or(write_back, |ns| ns * written_pages);
    let reprotect = prices.reprotect_ns.unwrap_or(page.protect_ns) * written_pages;
    let beyond_scan = back + reprotect * protecting / restores.max(1.0);
    let unprotect = prices.unprotect_ns.unwrap_or(page.protect_ns) * pages;
    let passes =
        faulting * page.fault_ns * written_pages + restores * (page.scan_ns * pages + beyond_scan);
    // A snapshot of a footprint still followed scans it and copies what was written since the
    // last one (about what a tracked restore's scan and write-back cost).
    let incremental = page.scan_ns * pages + back + reprotect;
    // Starting: still followed, that snapshot instead of a copy of everything, while not
    // following costs un-protecting it now; else protecting every page (both copy everything).
    let (start, stop_now) = if outlook.followed {
        (incremental, unprotect + copy * bytes)
    } else {
        (page.protect_ns * pages, 0.0)
    };
    // Ending: expected to stay followed for the next snapshot, which then copies what was
    // written since instead of everything; else un-protecting every page.
    let (end, next_copy) = if outlook.continues {
        (incremental, copy * bytes)
    } else {
        (unprotect, 0.0)
    };
    let tracked = start + passes + end;
    let hash = rates.per_byte().1;
    // `estimate` prices chunks at a byte's cost each: a chunk's bytes make nanoseconds of it.
    let verified = outlook
        .earlier
        .and_then(|e| {
            let set = e.write_set.iter().filter(|&&b| b).count() as u64;
            estimate(rates, e, outlook.chunks, set, outlook.chunk_size)
        })
        .map_or(hash * bytes + write_back, |c| {
            c.hash.min(c.writeset) * outlook.chunk_size as f64
        });
    let without = stop_now
        + next_copy
        + (restores * copy * bytes).min(rates.snapshot_hash_extra() * bytes + restores * verified);
    Some((tracked, without))
}

/// Restores a replay is priced at when nothing says how many it plans (no plan, no earlier
/// dispatch): a replay may be long, as Nsight Compute's full metric set asks 38 passes.
const UNKNOWN_RESTORES: u64 = 37;

/// Whether auto follows a snapshot's writes: where [`replay_costs`] says following them costs
/// less than restoring without, by [`TRACK_MARGIN`] (by [`BET_MARGIN`] where that rests on the
/// next snapshot continuing to follow them). With no restore planned never: starting
/// and stopping cost about a copy of the footprint, repaid only over restores; with none known,
/// priced as a long replay ([`UNKNOWN_RESTORES`]). Before any copy was measured, for a replay
/// of two restores or more (the first restore measures what the passes write, and auto stops
/// following writes when that was dear).
pub(crate) fn tracking_pays(rates: &Rates, prices: &Prices, outlook: &Outlook<'_>) -> bool {
    let outlook = Outlook {
        restores: Some(outlook.restores.unwrap_or(UNKNOWN_RESTORES)),
        ..*outlook
    };
    match (outlook.restores, replay_costs(rates, prices, &outlook)) {
        (None | Some(0), _) => false,
        (Some(r), None) => r >= 2,
        (Some(_), Some((tracked, without))) => {
            let margin = if outlook.continues && !outlook.followed {
                BET_MARGIN
            } else {
                TRACK_MARGIN
            };
            tracked * (1.0 + margin) < without
        }
    }
}

/// Where a kernel's passes write, each, a share `repeat` of what the pass before wrote: the
/// share of the pages they write that faults, in a pass after the second, once what they
/// repeat is left open (see [`Tracking::rearm`]). `None` below [`OPEN_SHARE`], where nothing
/// is left open and every page written faults.
pub(crate) fn faulting_share(repeat: f64) -> Option<f64> {
    let repeat = repeat.clamp(0.0, 1.0);
    (repeat >= OPEN_SHARE).then(|| (1.0 - repeat) + repeat / f64::from(REVISIT_EVERY))
}

/// Write-backs in a row that may leave pages open (see [`Tracking::rearm`]): the next one
/// protects every page it writes back, so that pages the passes stopped writing are followed
/// again and the share of repeated writes is measured afresh. A replay whose passes all write
/// the same pages pays their faults in at most one pass of this many, after the first two:
/// where a revisit finds the passes still writing [`REVISIT_KEPT`] of the pages that were
/// open, the next comes after twice as many write-backs (up to [`REVISIT_MOST`]).
const REVISIT_EVERY: u32 = 8;

/// The longest run of write-backs leaving pages open between two revisits. A page left open
/// that the passes no longer write costs a copy of it at every restore until the next revisit
/// (a fault costs several), so a revisit is put off only while nearly every open page is
/// written again.
const REVISIT_MOST: u32 = 32;

/// The share of the pages open before a revisit that the pass after it must write again for
/// the next revisit to be put off.
const REVISIT_KEPT: f64 = 0.9;

/// Pages written at two scans in a row are left open only where they are at least this share
/// of the pages the latest scan found written: a page left open is written back at every
/// restore whether the pass wrote it or not, which is cheaper than its fault only where the
/// passes mostly write it again.
const OPEN_SHARE: f64 = 0.5;

/// The writes to a snapshot's regions, followed.
pub(crate) struct Tracking {
    tracker: WriteTracker,
    /// Scratch for the written page ranges of a restore.
    written: Vec<Range<usize>>,
    /// The pages the scan before the latest found written (sorted, merged).
    before: Vec<Range<usize>>,
    /// The pages the latest scan found written that the scan before it found too.
    repeated: Vec<Range<usize>>,
    /// Write-backs in a row that left pages open.
    open_streak: u32,
    /// The pages the latest write-back left open: not protected again, so the next pass writes
    /// them without a fault and the next scan reports them written whatever the pass did.
    open: Vec<Range<usize>>,
    /// Write-backs in a row that may leave pages open before the next revisit (see
    /// [`REVISIT_EVERY`]).
    revisit_every: u32,
    /// After a revisit, until the scan that follows it: the pages that were open before it.
    revisited: Option<Vec<Range<usize>>>,
    /// Pages the latest scan found written that were protected when its pass began: the
    /// pass's faults.
    fresh_pages: u64,
    /// What the latest [`rearm`](Tracking::rearm) took, and the pages it protected.
    last_rearm: Option<(Duration, u64)>,
    /// What the first store to a followed page costs the pass making it.
    pub(crate) fault: Duration,
    /// Pages the latest restore found written.
    pub(crate) last_pages: Option<u64>,
    /// The share of the pages the latest scan found written that the scan before it found
    /// written too, where nothing was left open between the two (else unknown: open pages
    /// are reported written whatever the pass did).
    pub(crate) last_repeat: Option<f64>,
    /// What starting to follow the pages took (reading the process's mappings, registering,
    /// protecting every page).
    armed: Duration,
    /// What the latest scan for written pages took.
    last_scan: Option<Duration>,
}

/// A footprint still followed after the replay that followed it ended, with the store that
/// holds its bytes as of the latest snapshot: every page whose bytes differ from the store's is
/// one the tracker reports written (the store is written only by snapshots, each page from the
/// moment it was protected, and every write since marks its page). The next snapshot of the
/// same regions (the same allocations, by generation) copies only those pages, and its
/// replay's restores keep following them; any other snapshot stops following it first. Only a
/// snapshot whose regions all have a generation is kept followed (see `Snapshot`'s drop): a
/// region vouched for (generation 0) could be freed and allocated again unseen.
pub(crate) struct Followed {
    /// The regions followed, as the snapshot that started following them laid them out.
    pub regions: Vec<crate::inventory::Region>,
    /// That snapshot's chunk size.
    pub chunk_size: u64,
    /// The tracker, still armed.
    pub tracking: Tracking,
    /// The store holding the regions' bytes (laid out as that snapshot's layout lays them).
    pub store: crate::store::Store,
}

impl Followed {
    /// Whether a snapshot laid out as `layout` into a store of tier `tier` may continue from it.
    pub(crate) fn fits(&self, layout: &Layout, tier: crate::config::StoreTier) -> bool {
        use crate::config::StoreTier;
        self.regions == layout.regions
            && self.chunk_size == layout.chunk_size
            && self.store.capacity >= layout.store_len
            && (tier == StoreTier::Auto || tier == self.store.tier())
    }
}

impl std::fmt::Debug for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("regions", &self.regions.len())
            .field("chunk_size", &self.chunk_size)
            .finish_non_exhaustive()
    }
}

/// Nanoseconds per page of `elapsed` spent on `pages` pages.
fn per_page(elapsed: Duration, pages: usize) -> f64 {
    elapsed.as_nanos() as f64 / pages.max(1) as f64
}

/// What a fault costs in a footprint, by the probe's measurement (see [`FAULT_IN_FOOTPRINT`]).
fn fault_in_footprint(probe: &PageCosts) -> f64 {
    probe.fault_ns * FAULT_IN_FOOTPRINT
}

/// The prices a decision to follow writes is made by (see [`TrackPrices::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Prices {
    /// Per page: a fault, a scan, protecting.
    pub page: PageCosts,
    /// Per page, stopping following it, where measured (else as much as protecting it).
    pub unprotect_ns: Option<f64>,
    /// Per page found written, what a tracked restore spends beyond its scan and protecting
    /// pages again, where measured on restores of about as many pages (see [`BySize`]).
    pub written_ns: BySize,
    /// Per page protected again after a write-back, where measured.
    pub reprotect_ns: Option<f64>,
}

/// The latest [`Recent::KEPT`] measurements of one price, decided by their median: one
/// measurement slowed down by the machine (a preempted thread, another process's burst) cannot
/// price following writes out of auto's choices. That would last: auto measures these prices
/// only on restores that follow writes, so a price it stopped following writes over is never
/// measured again (in a full run of `kreplay bench` priced by the latest measurement, auto
/// stopped following writes part way through and never started again in that process).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Recent {
    samples: [f64; Recent::KEPT],
    len: usize,
    next: usize,
}

impl Recent {
    /// Measurements kept.
    const KEPT: usize = 5;

    /// Take in a measurement, forgetting the oldest beyond [`Recent::KEPT`].
    pub(crate) fn push(&mut self, value: f64) {
        self.samples[self.next] = value;
        self.next = (self.next + 1) % Self::KEPT;
        self.len = (self.len + 1).min(Self::KEPT);
    }

    /// The median of the measurements kept (of two, the lower); `None` before the first.
    pub(crate) fn median(&self) -> Option<f64> {
        if self.len == 0 {
            return None;
        }
        let mut kept = self.samples;
        let kept = &mut kept[..self.len];
        kept.sort_by(f64::total_cmp);
        Some(kept[(self.len - 1) / 2])
    }
}

/// A per-page price measured on restores of different sizes, kept apart by the pages each
/// covered (a bucket per factor of four) and read back for restores of about as many pages: a
/// tracked restore's costs that do not grow with the pages it writes back (handing the work to
/// the copy threads, the bookkeeping of the ranges) make a page of a small restore dearer than
/// one of a large, and a large write-back runs on more threads. Priced by one median over
/// every size, on a 16-CPU machine the pages of restores writing a tenth of 256 MiB were priced
/// at the 294 ns a page that restores writing 1% had measured, where a page of theirs cost
/// about 100: auto priced following writes at twice its cost and restored by hashing, at twice
/// the cost of following them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct BySize {
    buckets: [Recent; BySize::BUCKETS],
}

impl BySize {
    /// Buckets: restores of up to 4^16 pages (16 GiB of 4 KiB pages) are told apart, larger
    /// ones share the last.
    const BUCKETS: usize = 16;

    fn bucket(pages: u64) -> usize {
        ((pages.max(1).ilog2() / 2) as usize).min(Self::BUCKETS - 1)
    }

    /// Take in `price`, measured on a restore of `pages` pages.
    pub(crate) fn push(&mut self, pages: u64, price: f64) {
        self.buckets[Self::bucket(pages)].push(price);
    }

    /// The price for a restore of `pages` pages: the median of those measured on restores of
    /// about as many; `None` where none was.
    pub(crate) fn at(&self, pages: u64) -> Option<f64> {
        self.buckets[Self::bucket(pages)].median()
    }
}

/// What following writes costs per page, as this process measured it on its own footprints
/// where it has (starting and ending, scanning, tracked restores), else as `kreplay-wtrack`'s
/// scratch probe measured it; each the median of its recent measurements ([`Recent`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TrackPrices {
    /// Starting to follow a page (protecting it again after a write-back costs about as much).
    pub protect_ns: Recent,
    /// Stopping following a page (the kernel un-protects it when the tracker is dropped).
    pub unprotect_ns: Recent,
    /// Scanning a page for writes.
    pub scan_ns: Recent,
    /// What a tracked restore spent beyond its scan and protecting pages again, per page found
    /// written (writing back the chunks, the bookkeeping), from restores that found at least
    /// [`MIN_PRICED_PAGES`] pages written, kept by how many (see [`BySize`]).
    pub written_ns: BySize,
    /// What protecting pages again after a write-back took, per page protected, from restores
    /// that protected at least [`MIN_PRICED_PAGES`] (scattered pages cost more than a run of
    /// them: a range each).
    pub reprotect_ns: Recent,
    /// What a fault cost the passes of replays here, per page (see [`PassClock`]); until one
    /// was measured, the probe's times [`FAULT_IN_FOOTPRINT`].
    pub fault_ns: Recent,
}

/// A tracked restore prices the pages it found written only when they were at least this many:
/// below, its fixed costs would be spread over too few.
const MIN_PRICED_PAGES: u64 = 64;

impl TrackPrices {
    /// The prices to decide by: what was measured here, else the probe's; `None` where writes
    /// cannot be followed at all.
    pub(crate) fn resolve(&self) -> Option<Prices> {
        let probe = kreplay_wtrack::page_costs()?;
        Some(Prices {
            page: PageCosts {
                fault_ns: self
                    .fault_ns
                    .median()
                    .unwrap_or_else(|| fault_in_footprint(&probe)),
                scan_ns: self.scan_ns.median().unwrap_or(probe.scan_ns),
                protect_ns: self.protect_ns.median().unwrap_or(probe.protect_ns),
            },
            unprotect_ns: self.unprotect_ns.median(),
            written_ns: self.written_ns,
            reprotect_ns: self.reprotect_ns.median(),
        })
    }

    /// Take in what a fault cost a replay's passes, per page (see [`PassClock`]).
    pub(crate) fn record_fault(&mut self, ns_per_page: f64) {
        self.fault_ns.push(ns_per_page);
    }

    /// Take in what starting to follow a footprint cost.
    pub(crate) fn record(&mut self, tracking: &Tracking) {
        self.protect_ns
            .push(per_page(tracking.armed, tracking.followed_pages()));
    }

    /// Take in what stopping following `pages` pages took.
    pub(crate) fn record_end(&mut self, pages: usize, elapsed: Duration) {
        self.unprotect_ns.push(per_page(elapsed, pages));
    }

    /// Take in what a tracked restore (`elapsed` in all) measured.
    pub(crate) fn record_restore(&mut self, tracking: &Tracking, elapsed: Duration) {
        let Some(scan) = tracking.last_scan else {
            return;
        };
        self.scan_ns.push(per_page(scan, tracking.followed_pages()));
        let written = tracking.last_pages.unwrap_or(0);
        // Protecting apart: a restore that left pages open protected fewer than it wrote back,
        // and priced together, the pages of kernels whose passes write other places each time
        // looked cheaper to follow than they are, and those that repeat dearer.
        let (protecting, protected) = tracking.last_rearm.unwrap_or_default();
        if protected >= MIN_PRICED_PAGES {
            self.reprotect_ns
                .push(per_page(protecting, protected as usize));
        }
        if written >= MIN_PRICED_PAGES {
            let beyond = elapsed.saturating_sub(scan).saturating_sub(protecting);
            self.written_ns
                .push(written, per_page(beyond, written as usize));
        }
    }
}

/// The pieces `kreplay-wtrack` works on `bytes` in, in parallel from two on.
fn scan_pieces(bytes: usize) -> usize {
    bytes.div_ceil(kreplay_wtrack::SCAN_PIECE)
}

/// The most ranges a footprint kept followed between replays may have: each range followed
/// may split a mapping of the process in two or three, and the mappings a process may have are
/// few (`vm.max_map_count`, 65,530 by default), so many small allocations are not kept.
const KEPT_RANGES_MAX: usize = 1024;

/// Whether what a tracker saw between replays can be relied on now, and a footprint followed
/// with `tracking` kept followed: no memory of the process is pinned for I/O (the kernel
/// writes such pages past any tracker, `kreplay_wtrack::pinned_bytes`) and its ranges are few
/// enough not to crowd the process's mappings.
pub(crate) fn may_stay_followed(tracking: Option<&Tracking>) -> bool {
    tracking.is_none_or(|t| t.tracker.ranges().len() <= KEPT_RANGES_MAX)
        && kreplay_wtrack::pinned_bytes() == 0
}

impl Tracking {
    /// Follows the host windows of every region, or `None` when one has no window or the
    /// memory cannot be followed (the caller restores without).
    /// `prices`: what following costs now (see [`TrackPrices::resolve`]), `None` where it
    /// cannot be followed.
    pub(crate) fn arm(wins: &[Option<HostWindow>], prices: Option<Prices>) -> Option<Tracking> {
        let ranges: Option<Vec<Range<usize>>> = wins
            .iter()
            .map(|w| w.map(|w| w.as_ptr() as usize..w.as_ptr() as usize + w.len()))
            .collect();
        let fault = Duration::from_nanos(prices?.page.fault_ns.round() as u64);
        let start = Instant::now();
        let ranges = ranges?;
        let pieces = scan_pieces(ranges.iter().map(|r| r.len()).sum());
        let tracker = crate::pool::install_for(pieces, || WriteTracker::new(&ranges)).ok()?;
        Some(Tracking {
            armed: start.elapsed(),
            tracker,
            written: Vec::new(),
            before: Vec::new(),
            repeated: Vec::new(),
            open_streak: 0,
            open: Vec::new(),
            revisit_every: REVISIT_EVERY,
            revisited: None,
            fresh_pages: 0,
            last_rearm: None,
            fault,
            last_pages: None,
            last_repeat: None,
            last_scan: None,
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
        let start = Instant::now();
        let (tracker, written) = (&self.tracker, &mut self.written);
        let pieces = scan_pieces(tracker.bytes());
        let pages = crate::pool::install_for(pieces, || tracker.written(written)).ok()?;
        self.last_scan = Some(start.elapsed());
        self.last_pages = Some(pages as u64);
        // Pages left open are reported written whatever the pass did: only the others cost it
        // a fault, and only a scan after a pass that began with nothing open says how many of
        // its pages the pass before wrote too.
        let open_pages = self.pages_of(&self.open) as u64;
        self.fresh_pages = (pages as u64).saturating_sub(open_pages);
        self.repeated = intersect(&self.written, &self.before);
        let repeated = self.pages_of(&self.repeated) as u64;
        self.last_repeat = (open_pages == 0 && !self.before.is_empty() && pages > 0)
            .then(|| repeated as f64 / pages as f64);
        self.before.clone_from(&self.written);
        // The scan after a revisit: the passes still write (nearly) all the pages that were
        // open, so the next revisit is put off; else revisits come at the first pace again.
        if let Some(open) = self.revisited.take() {
            let kept = self.pages_of(&intersect(&self.written, &open)) as f64;
            self.revisit_every = if kept >= REVISIT_KEPT * self.pages_of(&open) as f64 {
                (self.revisit_every * 2).min(REVISIT_MOST)
            } else {
                REVISIT_EVERY
            };
        }
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
    ///
    /// With `keep_open` (a restore's write-back), pages the latest scan and the one before it
    /// both found written are left open where they are at least [`OPEN_SHARE`] of the pages
    /// the latest found: a replay runs the same kernel on the same bytes each pass, so it
    /// mostly writes them again, and writing such a page back at every restore (a copy of a
    /// page) costs less than its fault each pass (several copies). The [`REVISIT_EVERY`]th
    /// write-back in a row that left pages open protects them all again (a revisit), and where
    /// the pass after a revisit writes [`REVISIT_KEPT`] of the pages that were open again, the
    /// next revisit comes after twice as many (up to [`REVISIT_MOST`]). Nothing is lost either
    /// way: a page not protected is reported written by every scan,
    /// and its chunks written back.
    pub(crate) fn rearm(
        &mut self,
        layout: &Layout,
        wins: &[Option<HostWindow>],
        pieces: &[Piece],
        keep_open: bool,
    ) -> bool {
        let page = self.tracker.page_size();
        let ranges: Vec<Range<usize>> = pieces
            .iter()
            .filter_map(|p| {
                let win = wins[p.region]?;
                let (off, len) = layout.piece_span(p);
                let start = win.as_ptr() as usize + off as usize;
                Some(start..start + len as usize)
            })
            .collect();
        let ranges = kreplay_wtrack::widen_and_merge(&ranges, page);
        let found = self.last_pages.unwrap_or(0);
        let repeats = keep_open
            && self.open_streak < self.revisit_every
            && found > 0
            && self.pages_of(&self.repeated) as f64 >= OPEN_SHARE * found as f64;
        let open = if repeats {
            intersect(&self.repeated, &ranges)
        } else {
            Vec::new()
        };
        let protect = subtract(&ranges, &open);
        let start = Instant::now();
        let tracker = &self.tracker;
        let pieces = scan_pieces(protect.iter().map(|r| r.len()).sum());
        let ok = crate::pool::install_for(pieces, || tracker.protect(&protect)).is_ok();
        self.last_rearm = Some((start.elapsed(), self.pages_of(&protect) as u64));
        let revisit = keep_open && self.open_streak >= self.revisit_every;
        let was_open = std::mem::replace(&mut self.open, open);
        if revisit {
            self.revisited = Some(was_open);
        }
        self.open_streak = if !self.open.is_empty() {
            self.open_streak + 1
        } else {
            0
        };
        ok
    }

    /// Whole pages in `ranges` (page-aligned ones).
    fn pages_of(&self, ranges: &[Range<usize>]) -> usize {
        ranges.iter().map(|r| r.len()).sum::<usize>() / self.tracker.page_size()
    }

    /// Bytes of the pages the latest write-back left open (see [`rearm`](Tracking::rearm)).
    pub(crate) fn open_bytes(&self) -> u64 {
        (self.pages_of(&self.open) * self.tracker.page_size()) as u64
    }

    /// Pages followed.
    pub(crate) fn followed_pages(&self) -> usize {
        (self.tracker.bytes() / self.tracker.page_size()).max(1)
    }

    /// Bytes of the pages the latest restore found written.
    pub(crate) fn last_written_bytes(&self) -> u64 {
        self.last_pages.unwrap_or(0) * self.tracker.page_size() as u64
    }

    /// What the latest restore's pass paid in faults (pages left open before it cost none).
    pub(crate) fn last_faults(&self) -> Duration {
        self.fault * self.fresh_pages as u32
    }

    /// Pages the latest restore's pass faulted on (written while protected).
    pub(crate) fn last_fresh_pages(&self) -> u64 {
        self.fresh_pages
    }
}

/// The passes of one replay whose writes are followed, timed between restores, to measure what
/// a fault costs them (see [`TrackPrices::fault_ns`]). They run the same kernel on the same
/// bytes, so where one pass faulted on many pages and a later one on few (a kernel whose passes
/// write the same places: from the third pass on its pages are left open, see
/// [`Tracking::rearm`]), the difference of their times per page of the difference is what a
/// fault costs the replay, as its own threads paid it: whatever else a pass does (the kernel,
/// the tool's callbacks between passes) is in both. The first pass is the one compared: its
/// faults are on pages nothing touched since the snapshot, as every fault of a kernel whose
/// passes write other places each time is. Until then faults are priced by the probe
/// `kreplay-wtrack` runs once per process on a small mapping of its own, one reading that
/// decides every choice of the process: on the 2-core host it read 1.08 and 1.33 us in two
/// processes (priced 1.5 and 1.9 us), while the first passes of `kreplay bench`'s 256 MiB replays
/// paid 1.07-1.59 us a fault (medians of five 1.14-1.54 us).
#[derive(Debug, Default)]
pub(crate) struct PassClock {
    /// When the snapshot was taken or the latest restore ended (the next pass started after).
    since: Option<Instant>,
    /// The first pass: its time and the pages it faulted on.
    first: Option<(Duration, u64)>,
    /// Whether this replay measured a fault already (one measurement per replay).
    measured: bool,
}

impl PassClock {
    /// A pass starts now: timed where `followed` (writes are followed), else not (timing
    /// stops).
    pub(crate) fn restart(&mut self, followed: bool) {
        self.since = followed.then(Instant::now);
    }

    /// The time of the pass that ended at `now` (a restore's start), if passes are timed.
    pub(crate) fn pass_time(&self, now: Instant) -> Option<Duration> {
        self.since.map(|since| now.saturating_duration_since(since))
    }

    /// A pass took `time` and faulted on `pages`: what a fault cost, per page, when this pass
    /// and the first differ by enough pages to tell (see [`fault_per_page`]); once per replay.
    pub(crate) fn pass(&mut self, time: Duration, pages: u64) -> Option<f64> {
        let Some(first) = self.first else {
            self.first = Some((time, pages));
            return None;
        };
        if self.measured {
            return None;
        }
        let fault = fault_per_page(first, (time, pages))?;
        self.measured = true;
        Some(fault)
    }
}

/// What a fault costs per page, from two passes of one replay, each (time, pages faulted on):
/// the difference of their times over the difference of their pages, where those differ by at
/// least [`MIN_PRICED_PAGES`] and by half of the larger (else the difference is mostly noise).
/// `None` where the pass with more faults was not the slower one.
pub(crate) fn fault_per_page(a: (Duration, u64), b: (Duration, u64)) -> Option<f64> {
    let (more, fewer) = if a.1 >= b.1 { (a, b) } else { (b, a) };
    let pages = more.1 - fewer.1;
    if pages < MIN_PRICED_PAGES || 2 * pages < more.1 {
        return None;
    }
    let extra = more.0.checked_sub(fewer.0)?;
    (!extra.is_zero()).then(|| per_page(extra, pages as usize))
}

/// The bytes in both `a` and `b` (each sorted and disjoint), sorted and disjoint.
fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Range<usize>> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let (lo, hi) = (a[i].start.max(b[j].start), a[i].end.min(b[j].end));
        if lo < hi {
            out.push(lo..hi);
        }
        if a[i].end <= b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The bytes of `a` not in `b` (each sorted and disjoint), sorted and disjoint.
fn subtract(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in a {
        let mut start = r.start;
        while j < b.len() && b[j].end <= start {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].start < r.end {
            if b[k].start > start {
                out.push(start..b[k].start);
            }
            start = start.max(b[k].end);
            k += 1;
        }
        if start < r.end {
            out.push(start..r.end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const CHUNK: u64 = 64 << 10;

    /// Rates and prices as the 2-core development machine measured them: copies at 33 GB/s,
    /// hash passes at 45 GB/s, a fault 0.75 us, protecting a page 70 ns, scanning one 2 ns.
    fn machine() -> (Rates, Prices) {
        (
            Rates::with(Some(0.030), Some(0.022), Some(0.037), Some(0.040)),
            Prices {
                page: PageCosts {
                    fault_ns: 750.0,
                    scan_ns: 2.0,
                    protect_ns: 70.0,
                },
                unprotect_ns: None,
                written_ns: BySize::default(),
                reprotect_ns: None,
            },
        )
    }

    fn outlook(restores: Option<u64>, dirty: Option<f64>) -> Outlook<'static> {
        let bytes = 256 * MIB;
        Outlook {
            restores,
            dirty,
            repeat: None,
            earlier: None,
            bytes,
            chunks: bytes / CHUNK,
            chunk_size: CHUNK,
            followed: false,
            continues: false,
        }
    }

    fn pays(restores: Option<u64>, dirty: Option<f64>) -> bool {
        let (rates, prices) = machine();
        tracking_pays(&rates, &prices, &outlook(restores, dirty))
    }

    #[test]
    fn a_footprint_still_followed_is_followed_on_where_starting_afresh_would_not_pay() {
        // One restore at 1% written: starting to follow costs more than it saves, but a
        // footprint already followed is snapshotted by copying what was written since, and
        // stopping would un-protect it and copy all of it.
        let (rates, prices) = machine();
        for dirty in [Some(0.0), Some(0.01)] {
            let fresh = outlook(Some(1), dirty);
            assert!(!tracking_pays(&rates, &prices, &fresh), "{dirty:?}");
            let followed = Outlook {
                followed: true,
                ..fresh
            };
            assert!(tracking_pays(&rates, &prices, &followed), "{dirty:?}");
        }
        // Where every pass writes the whole footprint, faults outweigh that: stop.
        let all = Outlook {
            followed: true,
            ..outlook(Some(1), Some(1.0))
        };
        assert!(!tracking_pays(&rates, &prices, &all));
    }

    #[test]
    fn a_footprint_snapshotted_again_and_again_is_worth_starting_to_follow_for_one_restore() {
        // Expected to stay followed for the next snapshot of it: un-protecting is not this
        // replay's, and the next snapshot copies what was written since instead of everything.
        let (rates, prices) = machine();
        let fresh = outlook(Some(1), Some(0.01));
        let again = Outlook {
            continues: true,
            ..fresh
        };
        assert!(!tracking_pays(&rates, &prices, &fresh));
        assert!(tracking_pays(&rates, &prices, &again));
        let (tracked, without) = replay_costs(&rates, &prices, &again).unwrap();
        let (fresh_tracked, fresh_without) = replay_costs(&rates, &prices, &fresh).unwrap();
        assert!(tracked < fresh_tracked, "no un-protecting at the end");
        let copy = rates.copy_ns_per_byte().unwrap() * fresh.bytes as f64;
        assert!(
            (without - fresh_without - copy).abs() < 1.0,
            "the next snapshot's copy"
        );
        // A tenth written by every pass still faults more than it saves.
        let tenth = Outlook {
            continues: true,
            ..outlook(Some(1), Some(0.1))
        };
        assert!(!tracking_pays(&rates, &prices, &tenth));
    }

    #[test]
    fn one_restore_never_repays_protecting_and_unprotecting_the_footprint() {
        // Starting and stopping cost 140 ns a page, more than a copy of it (123 ns): even a
        // replay whose passes write nothing restores cheaper without.
        for dirty in [None, Some(0.0), Some(0.01), Some(0.1)] {
            assert!(!pays(Some(1), dirty), "{dirty:?}");
        }
    }

    #[test]
    fn a_few_restores_of_a_small_share_are_cheaper_followed() {
        for restores in [3, 7, 37] {
            assert!(pays(Some(restores), Some(0.01)), "{restores}");
        }
        // Nothing known of what the kernel writes: the best case decides.
        assert!(pays(Some(3), None));
    }

    #[test]
    fn passes_that_write_a_tenth_fault_more_than_restoring_without_costs() {
        // Per pass 0.1 x 0.75 us a page of faults (75 ns) plus the write-back, against a hash
        // pass of 90 ns a page: short replays must not follow writes, and long ones gain too
        // little to call.
        for restores in [1, 3, 7, 37] {
            assert!(!pays(Some(restores), Some(0.1)), "{restores}");
        }
        assert!(!pays(Some(37), Some(1.0)));
    }

    #[test]
    fn passes_that_write_the_same_tenth_each_time_are_followed_where_faults_every_pass_are_not() {
        // A replay runs the same kernel on the same bytes: where its passes write what the pass
        // before wrote, those pages are left open after the second restore, so only the first
        // two passes (and one in REVISIT_EVERY after) pay their faults.
        let (rates, prices) = machine();
        for restores in [7, 37] {
            let o = outlook(Some(restores), Some(0.1));
            assert!(!tracking_pays(&rates, &prices, &o), "{restores}");
            let same = Outlook {
                repeat: Some(1.0),
                ..o
            };
            assert!(tracking_pays(&rates, &prices, &same), "{restores}");
            // Writes that mostly move are priced as faulting every pass.
            let moving = Outlook {
                repeat: Some(0.1),
                ..o
            };
            assert_eq!(
                replay_costs(&rates, &prices, &moving),
                replay_costs(&rates, &prices, &o)
            );
        }
        // One restore: nothing is left open before the second, so repeats change nothing.
        let one = outlook(Some(1), Some(0.1));
        assert_eq!(
            replay_costs(
                &rates,
                &prices,
                &Outlook {
                    repeat: Some(1.0),
                    ..one
                }
            ),
            replay_costs(&rates, &prices, &one)
        );
    }

    #[test]
    fn left_open_pages_fault_in_the_first_two_passes_and_once_per_revisit() {
        let (rates, prices) = machine();
        let o = Outlook {
            repeat: Some(1.0),
            ..outlook(Some(17), Some(0.01))
        };
        let (tracked, _) = replay_costs(&rates, &prices, &o).unwrap();
        let pages = (256 * MIB / kreplay_wtrack::page_size() as u64) as f64;
        let written = 0.01 * (256 * MIB) as f64;
        let fresh = 1.0 / f64::from(REVISIT_EVERY);
        let expected = 2.0 * 70.0 * pages
            + (2.0 + 16.0 * fresh) * 750.0 * 0.01 * pages
            + 17.0
                * (2.0 * pages
                    + rates.scattered_per_byte(written as u64) * written
                    + 70.0 * 0.01 * pages * (1.0 + 16.0 * fresh) / 17.0);
        assert!(
            (tracked - expected).abs() < 1.0,
            "{tracked} against {expected}"
        );
    }

    #[test]
    fn page_ranges_intersect_and_subtract_as_sets_of_bytes() {
        let a = vec![0..10, 20..30, 40..50];
        let b = vec![5..25, 28..42, 60..70];
        assert_eq!(intersect(&a, &b), vec![5..10, 20..25, 28..30, 40..42]);
        assert_eq!(subtract(&a, &b), vec![0..5, 25..28, 42..50]);
        assert_eq!(subtract(&b, &a), vec![10..20, 30..40, 60..70]);
        assert_eq!(subtract(&a, &[]), a);
        assert!(intersect(&a, &[]).is_empty());
        // A range of `a` split by several of `b`, and one of `b` spanning two of `a`.
        let whole = vec![0..100, 200..210];
        assert_eq!(
            subtract(&whole, &[10..20, 30..40]),
            vec![0..10, 20..30, 40..100, 200..210]
        );
        let across = vec![5..25, 300..301];
        assert_eq!(subtract(&[0..10, 20..30], &across), vec![0..5, 25..30]);
        assert_eq!(
            kreplay_wtrack::widen_and_merge(&[9000..9001, 0..1, 4095..4097], 4096),
            vec![0..12288]
        );
    }

    #[test]
    fn the_costs_count_both_ends_every_pass_fault_and_every_restore() {
        let (rates, prices) = machine();
        let o = outlook(Some(3), Some(0.01));
        let (tracked, without) = replay_costs(&rates, &prices, &o).unwrap();
        let pages = (256 * MIB / kreplay_wtrack::page_size() as u64) as f64;
        let written = 0.01 * (256 * MIB) as f64;
        let expected = 2.0 * 70.0 * pages
            + 4.0 * 750.0 * 0.01 * pages
            + 3.0
                * (2.0 * pages
                    + rates.scattered_per_byte(written as u64) * written
                    + 70.0 * 0.01 * pages);
        assert!(
            (tracked - expected).abs() < 1.0,
            "{tracked} against {expected}"
        );
        // Where stopping was timed, and tracked restores measured what a written page costs
        // them beyond the scan (protecting apart), those replace the prices taken from
        // protecting and the rates; protecting a page again is priced as starting to follow it
        // until a restore measured it.
        let mut written_ns = BySize::default();
        written_ns.push((0.01 * pages) as u64, 500.0);
        let measured = Prices {
            unprotect_ns: Some(90.0),
            written_ns,
            ..prices
        };
        let (tracked_measured, _) = replay_costs(&rates, &measured, &o).unwrap();
        let expected = (70.0 + 90.0) * pages
            + 4.0 * 750.0 * 0.01 * pages
            + 3.0 * (2.0 * pages + (500.0 + 70.0) * 0.01 * pages);
        assert!(
            (tracked_measured - expected).abs() < 1.0,
            "{tracked_measured} against {expected}"
        );
        // Protecting pages again, once measured, is priced by itself.
        let reprotecting = Prices {
            reprotect_ns: Some(300.0),
            ..measured
        };
        let (tracked_reprotect, _) = replay_costs(&rates, &reprotecting, &o).unwrap();
        assert!(
            (tracked_reprotect - expected - 3.0 * 230.0 * 0.01 * pages).abs() < 1.0,
            "{tracked_reprotect} against {expected}"
        );
        // Without: the cheaper of three full copies and hashes plus three verified restores.
        let full = 3.0 * 0.030 * (256 * MIB) as f64;
        assert!(without <= full + 1.0, "{without} against {full}");
    }

    #[test]
    fn a_page_price_measured_on_small_restores_does_not_price_large_ones() {
        let (rates, prices) = machine();
        // Tracked restores that wrote back 1% of a 256 MiB footprint (655 pages) measured
        // their fixed costs spread over few pages.
        let mut written_ns = BySize::default();
        for _ in 0..5 {
            written_ns.push(655, 294.0);
        }
        assert_eq!(written_ns.at(700), Some(294.0), "about as many pages");
        assert_eq!(written_ns.at(6554), None, "ten times as many");
        let measured = Prices {
            written_ns,
            ..prices
        };
        // A replay writing a tenth each pass is priced by the rate of write-backs that size,
        // as before any tracked restore was measured, not at 294 ns a page.
        let tenth = Outlook {
            bytes: 256 << 20,
            chunks: 4096,
            ..outlook(Some(37), Some(0.1))
        };
        assert_eq!(
            replay_costs(&rates, &measured, &tenth),
            replay_costs(&rates, &prices, &tenth)
        );
        let hundredth = Outlook {
            dirty: Some(0.01),
            ..tenth
        };
        let (priced, _) = replay_costs(&rates, &measured, &hundredth).unwrap();
        let (unpriced, _) = replay_costs(&rates, &prices, &hundredth).unwrap();
        assert!(
            priced != unpriced,
            "a 1% replay is priced by what 1% restores measured"
        );
    }

    #[test]
    fn what_earlier_dispatches_learned_prices_the_restores_without_in_nanoseconds() {
        let (rates, prices) = machine();
        let chunks = 256 * MIB / CHUNK;
        let dirty = chunks / 100;
        // An earlier dispatch that followed writes: what changed is known, no write set.
        let followed = Learned {
            write_set: vec![false; chunks as usize],
            dirty_chunks: Some(dirty),
            restores: 7,
            ..Default::default()
        };
        // One that learned its write set: restores hash only what lies outside it.
        let mut set = vec![false; chunks as usize];
        set[..dirty as usize].iter_mut().for_each(|b| *b = true);
        let learned = Learned {
            write_set: set,
            dirty_chunks: Some(dirty),
            restores: 7,
            ..Default::default()
        };
        for earlier in [&followed, &learned] {
            let o = Outlook {
                earlier: Some(earlier),
                ..outlook(Some(7), Some(0.01))
            };
            let (tracked, without) = replay_costs(&rates, &prices, &o).unwrap();
            let (_, unknown) =
                replay_costs(&rates, &prices, &outlook(Some(7), Some(0.01))).unwrap();
            // Seven verified restores each hash (nearly) the whole footprint.
            assert!(
                without > 0.9 * unknown && without < 1.1 * unknown,
                "{without} against {unknown}"
            );
            assert!(tracked < without);
            assert!(tracking_pays(&rates, &prices, &o));
        }
    }

    #[test]
    fn without_a_restore_ahead_nothing_is_followed_and_unknown_replays_count_as_long() {
        assert!(!pays(Some(0), Some(0.0)));
        // Nothing says how long the replay is: priced as 37 restores.
        assert!(pays(None, Some(0.01)));
        assert!(!pays(None, Some(0.1)));
        let (_, prices) = machine();
        let fresh = Rates::default();
        assert!(!tracking_pays(
            &fresh,
            &prices,
            &outlook(Some(1), Some(0.0))
        ));
        assert!(tracking_pays(&fresh, &prices, &outlook(Some(2), Some(0.0))));
    }

    #[test]
    fn prices_measured_here_replace_the_probes() {
        let Some(probe) = kreplay_wtrack::page_costs() else {
            eprintln!("skipped: writes cannot be followed here");
            return;
        };
        let mut prices = TrackPrices::default();
        let unmeasured = prices.resolve().unwrap().page;
        assert_eq!(
            (unmeasured.protect_ns, unmeasured.scan_ns),
            (probe.protect_ns, probe.scan_ns)
        );
        prices.protect_ns.push(123.0);
        prices.scan_ns.push(4.5);
        let resolved = prices.resolve().unwrap();
        assert_eq!(
            (resolved.page.protect_ns, resolved.page.scan_ns),
            (123.0, 4.5)
        );
        assert_eq!(resolved.page.fault_ns, probe.fault_ns * FAULT_IN_FOOTPRINT);
        assert_eq!(
            (resolved.unprotect_ns, resolved.written_ns),
            (None, BySize::default())
        );
    }

    #[test]
    fn a_fault_is_priced_from_two_passes_that_faulted_on_clearly_different_pages() {
        let ms = Duration::from_millis;
        // 1,000 pages more took 1.2 ms more: 1,200 ns a fault, whichever pass came first.
        assert_eq!(
            fault_per_page((ms(5), 1000), (ms(3) + ms(4) / 5, 0)),
            Some(1200.0)
        );
        assert_eq!(
            fault_per_page((ms(3) + ms(4) / 5, 0), (ms(5), 1000)),
            Some(1200.0)
        );
        // Pages too close to tell (the same count, a tenth apart, or under the least priced).
        assert_eq!(fault_per_page((ms(5), 1000), (ms(3), 1000)), None);
        assert_eq!(fault_per_page((ms(5), 1000), (ms(3), 900)), None);
        assert_eq!(fault_per_page((ms(5), 40), (ms(3), 0)), None);
        // The pass with more faults was not the slower (preempted, say): nothing to say.
        assert_eq!(fault_per_page((ms(3), 1000), (ms(5), 0)), None);
        assert_eq!(fault_per_page((ms(3), 1000), (ms(3), 0)), None);
    }

    #[test]
    fn a_replay_measures_a_fault_once_against_its_first_pass() {
        let ms = Duration::from_millis;
        let mut clock = PassClock::default();
        assert_eq!(clock.pass_time(Instant::now()), None, "not started");
        clock.restart(true);
        assert!(clock.pass_time(Instant::now()).is_some());
        // The first pass is the reference; the second faulted alike: nothing yet.
        assert_eq!(clock.pass(ms(6), 2000), None);
        assert_eq!(clock.pass(ms(6), 2000), None);
        // The third faulted on none: 2 ms over 2,000 pages.
        assert_eq!(clock.pass(ms(4), 0), Some(1000.0));
        // Once per replay.
        assert_eq!(clock.pass(ms(2), 0), None);
        clock.restart(false);
        assert_eq!(clock.pass_time(Instant::now()), None);
    }

    #[test]
    fn a_fault_price_measured_on_passes_replaces_the_probes() {
        let Some(probe) = kreplay_wtrack::page_costs() else {
            eprintln!("skipped: writes cannot be followed here");
            return;
        };
        let mut prices = TrackPrices::default();
        assert_eq!(
            prices.resolve().unwrap().page.fault_ns,
            probe.fault_ns * FAULT_IN_FOOTPRINT
        );
        for ns in [950.0, 5000.0, 1010.0] {
            prices.record_fault(ns);
        }
        // The median: one slow measurement does not decide.
        assert_eq!(prices.resolve().unwrap().page.fault_ns, 1010.0);
    }

    #[test]
    fn one_slow_scan_does_not_price_following_writes_out() {
        if kreplay_wtrack::page_costs().is_none() {
            eprintln!("skipped: writes cannot be followed here");
            return;
        }
        let (rates, _) = machine();
        // A 256 MiB footprint, 1% written per pass, 8 passes: worth following at the scan
        // prices measured so far.
        let mut prices = TrackPrices::default();
        for ns in [2.1, 1.9, 2.0] {
            prices.scan_ns.push(ns);
        }
        let long = Outlook {
            bytes: 256 * MIB,
            chunks: 256 * MIB / CHUNK,
            ..outlook(Some(7), Some(0.01))
        };
        // Faults and protecting priced as `machine` does, not by this process's probe (measured
        // while other tests load the machine): only the scans decide.
        prices.protect_ns.push(70.0);
        let pays = |prices: &TrackPrices| {
            let mut resolved = prices.resolve().unwrap();
            resolved.page.fault_ns = 750.0;
            tracking_pays(&rates, &resolved, &long)
        };
        assert!(pays(&prices));
        // One scan that waited 13 ms for a preempted thread: 200 ns a page.
        prices.scan_ns.push(200.0);
        assert!(pays(&prices), "one slow scan priced following writes out");
        // Scans that are slow every time do.
        for _ in 0..3 {
            prices.scan_ns.push(200.0);
        }
        assert!(!pays(&prices));
        // The median of what is kept, the oldest forgotten first.
        let mut recent = Recent::default();
        assert_eq!(recent.median(), None);
        for v in [5.0, 1.0, 9.0, 7.0, 3.0, 100.0, 100.0] {
            recent.push(v);
        }
        assert_eq!(recent.median(), Some(9.0));
    }
}
