//! What restores learn, kept across the dispatches of one kernel: which chunks the kernel writes,
//! how many it changed per pass, and what hashing and copying cost on this machine. Restores of
//! the next dispatch of the same kernel over the same regions start from it: the write set
//! restores those chunks straight from the store (no hash needed: they are overwritten with the
//! snapshotted bytes), and `auto` picks its strategy from the figures before its first restore.
//!
//! Nothing here weakens verification: a chunk a verified restore does not write from the store
//! is hashed and compared, so every pass still starts from the snapshotted bytes whatever was
//! learned (and whether it still holds).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::copy::STREAMING_MIN_BYTES;
use crate::inventory::Region;

/// Dispatches' learned states kept per snapshotter; the least recently used is dropped beyond.
pub(crate) const MAX_KEPT: usize = 256;
/// `auto` hashes again after this many restores in a row it chose to write in full, so a kernel
/// whose writes shrink is noticed.
pub(crate) const PROBE_EVERY: u32 = 16;
/// Copies and hash passes shorter than this are not used to estimate the machine's rates.
const RATE_MIN_BYTES: u64 = 4 << 20;
/// Before anything is measured, a hash pass is assumed to cost this fraction of a copy of the
/// same bytes (a read against a read and a write).
const DEFAULT_HASH_PER_COPY: f64 = 0.6;

/// Identifies a kernel's region set: the kernel, the chunk size and every region's base, size
/// and generation (a freed and reallocated buffer is a different region set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    kernel: u64,
    regions: u64,
}

impl Key {
    pub(crate) fn new(kernel: u64, regions: &[Region], chunk_size: u64) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        chunk_size.hash(&mut h);
        for r in regions {
            (r.base, r.size, r.generation).hash(&mut h);
        }
        Key {
            kernel,
            regions: h.finish(),
        }
    }
}

/// What one kernel's dispatches taught.
#[derive(Clone, Debug, Default)]
pub(crate) struct Learned {
    /// Chunks found changed by any verified restore (one flag per chunk of the layout).
    pub write_set: Vec<bool>,
    /// Chunks a restore that hashed everything found changed, most recently.
    pub dirty_chunks: Option<u64>,
    /// Chunks outside the write set a predicting restore found changed, most recently.
    pub missed_chunks: Option<u64>,
    /// Restores in a row `auto` wrote in full (no information on what changed).
    pub full_streak: u32,
    /// Restores of the latest dispatch.
    pub restores: u64,
    /// The share of what a restore found changed (chunks, or pages where writes were
    /// followed) that the restore before it found changed too, most recently: whether the
    /// kernel's passes write the same places each time.
    pub repeat: Option<f64>,
}

/// Measurements a rate is the median of.
const RATE_SAMPLES: usize = 8;

/// The latest [`RATE_SAMPLES`] measurements of one rate.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    values: [f64; RATE_SAMPLES],
    len: usize,
    next: usize,
}

impl Recent {
    /// Adds `value` (replacing the oldest once full) and returns the median of those kept.
    fn push(&mut self, value: f64) -> f64 {
        self.values[self.next] = value;
        self.next = (self.next + 1) % RATE_SAMPLES;
        self.len = (self.len + 1).min(RATE_SAMPLES);
        let mut kept = self.values;
        let kept = &mut kept[..self.len];
        kept.sort_by(f64::total_cmp);
        let n = kept.len();
        if n % 2 == 1 {
            kept[n / 2]
        } else {
            (kept[n / 2 - 1] + kept[n / 2]) / 2.0
        }
    }
}

/// Kinds of measurement behind [`Rates`].
const COPY: usize = 0;
const HASH: usize = 1;
/// Snapshot copies that hash each chunk as they copy it.
const HASHED_COPY: usize = 2;
/// Partial write-backs below the streaming threshold: ordinary stores, which read every
/// destination line first, so per byte dearer than a copy of everything.
const SCATTERED: usize = 3;
/// Partial write-backs of at least [`STREAMING_MIN_BYTES`]: streaming stores, per byte about a
/// full copy's cost.
const STREAMED: usize = 4;
/// Hash passes that leave out the chunks of a learned write set (a predicting restore): per
/// byte dearer than a pass over everything (in `kreplay bench`, 256 MiB with a tenth in the
/// set, about 1.15-1.4 times), so measured apart. Counted as [`HASH`], they raised the hash
/// rate a hash restore is priced at while write sets were being predicted.
const PARTIAL_HASH: usize = 5;
/// Kinds of measurement.
const KINDS: usize = 6;

/// Nanoseconds per byte of this machine's copies and hash passes, as restores and snapshots
/// measured them.
///
/// A shared machine's memory bandwidth drifts (by tens of percent over minutes), and `auto`
/// measures only what it does: a kernel it restores with hash passes never measures a copy,
/// one it restores in full never measures a hash pass. Rates kept apart would then compare a
/// copy measured minutes ago with a hash pass measured now. So each rate is split in two: the
/// kind's cost relative to the machine's current speed (`base`), and that speed (`level`),
/// which every measurement of any kind moves. A measurement of kind k divided by k's base says
/// how fast the machine is now; the level is the median of the latest [`RATE_SAMPLES`] of
/// those, and a kind's base the median of its latest measurements divided by the level of
/// their time, so one copy slowed by another process (or sped up by a quiet moment) moves
/// neither. A rate is its base times the current level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rates {
    /// Each kind's cost per byte at level 1 (copy, hash, hashed copy, scattered, streamed,
    /// partial hash).
    base: [Option<f64>; KINDS],
    /// The machine's speed now: a cost of kind k is `base[k] * level`.
    level: f64,
    /// The latest measurements of each kind divided by the level at their time.
    recent: [Recent; KINDS],
    /// The latest measurements of any kind divided by their kind's base.
    levels: Recent,
    /// Measurements of other kinds since the latest of each kind.
    since: [u32; KINDS],
}

/// A copy rate is stale once this many measurements of other kinds came after the latest copy:
/// the machine's speed may have moved differently for copies than for hash passes since.
const COPY_STALE_AFTER: u32 = 16;
/// A rate is out of date once this many measurements of other kinds came after its latest: the
/// machine's speed has been followed without it for so long (and each kind's speed drifts
/// somewhat apart) that its next measurement replaces its earlier ones instead of being
/// outvoted by them, and a copy rate this old is measured again whatever the estimates say
/// (see [`refresh_copy_rate`]): a stale copy rate a quarter off made hashing look free and
/// verified restores look cheaper than full ones at 10% written, and nothing `auto` chose
/// afterwards measured a copy again. At twice [`COPY_STALE_AFTER`] (16 verified restores) such
/// a refresh costs a full restore's lead over the verified one once per 16 restores; at four
/// times (it was) a copy rate carried half again above what copies cost decided 32 restores.
const OUT_OF_DATE_AFTER: u32 = 2 * COPY_STALE_AFTER;
/// A verified restore estimated to save less than this share of a full one over it is too close
/// to call on a stale copy rate: a full restore is made instead, which measures the copy again.
/// Such a refresh costs at most this share of one restore, once per [`COPY_STALE_AFTER`]
/// measurements of other kinds (a verified restore makes two): well inside the 10% by which
/// `auto` may trail the best fixed strategy. A margin above that (it was 15%) made full
/// restores wherever a verified one led by less, so a replay whose write set led by 10-15%
/// paid a full restore every few restores.
const CLOSE_CALL: f64 = 0.05;
/// What hashing while snapshotting adds, at least, as a share of a hash pass over the same
/// bytes (see [`Rates::snapshot_hash_extra`]); on the 2-core host it measured 0.2-0.3 of one.
const MIN_HASH_EXTRA: f64 = 0.15;
/// What hashing while snapshotting adds, at most, as a share of a hash pass, once its latest
/// measurement is out of date (see [`OUT_OF_DATE_AFTER`]): only snapshots that hash measure
/// it, and one measured dear kept every later one from hashing. A usual share (the 2-core
/// host measured 0.2-0.45 of a hash pass), so the next replay whose hashes pay at that share
/// hashes, and measures it again.
const HASH_EXTRA_RETRY: f64 = 0.3;
/// A snapshot's hashes must save more than they cost by this share of a copy of the footprint
/// over the replay's restores: the estimates are medians of measurements that move by tens of
/// percent on a shared machine, so a thinner saving is a guess, and on the 2-core host the
/// 2-pass replays that hashed for one cost 1.06-1.23x of those that did not.
const HASH_MARGIN: f64 = 0.05;
/// The margin of [`HASH_MARGIN`] while the copy rate is stale (see [`COPY_STALE_AFTER`]): a
/// copy rate left unmeasured while the machine's speed moved differently for hash passes than
/// for copies was measured on the 2-core host at 1.5-1.7 times what full restores then cost,
/// which made a verified restore look a third cheaper than a full one. A snapshot taken
/// without hashes copies the footprint and so measures the copy again; it is taken unless the
/// hashes pay clearly (over a long replay they still do).
const STALE_HASH_MARGIN: f64 = 0.25;

impl Default for Rates {
    fn default() -> Self {
        Rates {
            base: [None; KINDS],
            level: 1.0,
            recent: Default::default(),
            levels: Recent::default(),
            since: [0; KINDS],
        }
    }
}

impl Rates {
    /// Add the rate of `bytes` in `elapsed` to the measurements of kind `which` (runs too short
    /// to say anything are left out).
    fn add_sample(&mut self, which: usize, bytes: u64, elapsed: Duration) {
        if bytes < RATE_MIN_BYTES {
            return;
        }
        let per_byte = elapsed.as_nanos() as f64 / bytes as f64;
        if !(per_byte > 0.0 && per_byte.is_finite()) {
            return;
        }
        match self.base[which] {
            // Out of date: its measurements describe another time, so this one replaces them,
            // on the speed the other kinds measured since (and says nothing about that speed).
            Some(_) if self.out_of_date(which) => {
                self.recent[which] = Recent::default();
            }
            Some(base) => self.level = self.levels.push(per_byte / base),
            None => {}
        }
        self.base[which] = Some(self.recent[which].push(per_byte / self.level));
        for (kind, since) in self.since.iter_mut().enumerate() {
            *since = if kind == which {
                0
            } else {
                since.saturating_add(1)
            };
        }
    }

    /// Rates with the given costs per byte at level 1 (tests inject what a machine measured).
    #[cfg(test)]
    pub(crate) fn with(
        copy: Option<f64>,
        hash: Option<f64>,
        hashed_copy: Option<f64>,
        scattered: Option<f64>,
    ) -> Self {
        Rates {
            base: [copy, hash, hashed_copy, scattered, None, None],
            ..Default::default()
        }
    }

    /// Whether the copy rate was measured, but not for [`COPY_STALE_AFTER`] measurements of
    /// other kinds.
    fn copy_stale(&self) -> bool {
        self.base[COPY].is_some() && self.since[COPY] >= COPY_STALE_AFTER
    }

    fn rate(&self, which: usize) -> Option<f64> {
        self.base[which].map(|b| b * self.level)
    }

    /// Nanoseconds per byte of a full copy, once one was measured.
    pub(crate) fn copy_ns_per_byte(&self) -> Option<f64> {
        self.rate(COPY)
    }

    pub(crate) fn record_copy(&mut self, bytes: u64, elapsed: Duration) {
        self.add_sample(COPY, bytes, elapsed);
    }

    pub(crate) fn record_hash(&mut self, bytes: u64, elapsed: Duration) {
        self.add_sample(HASH, bytes, elapsed);
    }

    /// A hash pass that left out the chunks of a learned write set hashed `bytes` in `elapsed`.
    pub(crate) fn record_partial_hash(&mut self, bytes: u64, elapsed: Duration) {
        self.add_sample(PARTIAL_HASH, bytes, elapsed);
    }

    /// Cost per byte of a hash pass that leaves out a learned write set, in the unit of
    /// [`Rates::per_byte`]: as such passes measured it, not below a whole pass's rate; else, or
    /// once out of date (see [`OUT_OF_DATE_AFTER`]), a whole pass's (the best case, so that a
    /// predicting restore that might pay is made, and measures it again).
    pub(crate) fn partial_hash_per_byte(&self) -> f64 {
        let hash = self.per_byte().1;
        match self.rate(PARTIAL_HASH) {
            Some(partial) if !self.out_of_date(PARTIAL_HASH) => partial.max(hash),
            _ => hash,
        }
    }

    /// A partial write-back of `bytes` (changed chunks, a write set) took `elapsed`.
    pub(crate) fn record_scattered(&mut self, bytes: u64, elapsed: Duration) {
        self.add_sample(Self::partial_kind(bytes), bytes, elapsed);
    }

    /// The kind a partial write-back of `bytes` is measured as: the copy streams at and above
    /// [`STREAMING_MIN_BYTES`] in all (see `copy::write_back`), and costs per byte what its
    /// stores cost.
    fn partial_kind(bytes: u64) -> usize {
        if bytes >= STREAMING_MIN_BYTES {
            STREAMED
        } else {
            SCATTERED
        }
    }

    /// Cost per byte of a partial write-back of `bytes` in all (changed chunks, a write set),
    /// in the unit of [`Rates::per_byte`]: as write-backs of its kind (streaming or not)
    /// measured, else a copy's.
    pub(crate) fn scattered_per_byte(&self, bytes: u64) -> f64 {
        self.rate(Self::partial_kind(bytes))
            .unwrap_or(self.per_byte().0)
    }

    pub(crate) fn record_hashed_copy(&mut self, bytes: u64, elapsed: Duration) {
        self.add_sample(HASHED_COPY, bytes, elapsed);
    }

    /// What hashing adds per byte to a snapshot copy: measured as a hashing snapshot against a
    /// plain copy, else (nothing measured yet) a whole hash pass. Never less than
    /// [`MIN_HASH_EXTRA`] of a hash pass: the difference of two rates measured at different
    /// times (each moved by the machine's drift since) can come out at nothing, or below, while
    /// a hashing snapshot still hashes every byte it copies. Measured, but out of date: no more
    /// than [`HASH_EXTRA_RETRY`] of a hash pass.
    pub(crate) fn snapshot_hash_extra(&self) -> f64 {
        let (copy, hash) = self.per_byte();
        match (self.rate(COPY), self.rate(HASHED_COPY)) {
            (Some(_), Some(hashed)) => {
                let extra = (hashed - copy).max(MIN_HASH_EXTRA * hash);
                if self.out_of_date(HASHED_COPY) {
                    extra.min(HASH_EXTRA_RETRY * hash)
                } else {
                    extra
                }
            }
            _ => hash,
        }
    }

    /// Whether the rate of kind `kind` was measured, but not for [`OUT_OF_DATE_AFTER`]
    /// measurements of other kinds (a run of full restores and plain snapshots, for instance,
    /// measures only copies).
    fn out_of_date(&self, kind: usize) -> bool {
        self.base[kind].is_some() && self.since[kind] >= OUT_OF_DATE_AFTER
    }

    /// (copy, hash) cost per byte in a common unit.
    ///
    /// A hash rate out of date (see [`Rates::out_of_date`]) counts for no more than
    /// [`DEFAULT_HASH_PER_COPY`] of the current copy rate. Only hash passes measure it, and
    /// `auto` makes them only where hashing looks paid: a hash rate left above what hashing now
    /// costs (the machine's speed moved differently for copies than for hash passes while
    /// only copies were measured) kept every later choice on full restores, and nothing
    /// measured a hash pass again (on the 2-core host, 1% written, 8 passes: 0 of 14 snapshots
    /// hashed, a hash rate of 19-23 ms per 256 MiB against 16 ms that hash restores then
    /// took). Priced at the prior instead, the next replay that would hash at that price does
    /// hash, and its first hash pass replaces the old rate (see [`Rates::add_sample`]). When
    /// hashing really costs what the old rate said, that costs one hashing snapshot and one
    /// verified restore once per [`OUT_OF_DATE_AFTER`] measurements.
    pub(crate) fn per_byte(&self) -> (f64, f64) {
        match (self.rate(COPY), self.rate(HASH)) {
            (Some(c), Some(h)) if self.out_of_date(HASH) => (c, h.min(c * DEFAULT_HASH_PER_COPY)),
            (Some(c), Some(h)) => (c, h),
            (Some(c), None) => (c, c * DEFAULT_HASH_PER_COPY),
            // A copy is not assumed dearer than a hash pass until one is measured: otherwise
            // hashing looks as if it paid, auto keeps hashing, and no plain copy ever measures
            // what a copy costs.
            (None, Some(h)) => (h, h),
            (None, None) => (1.0, DEFAULT_HASH_PER_COPY),
        }
    }
}

/// The learned states of one snapshotter's kernels, and the machine's rates.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    entries: HashMap<Key, (u64, Learned)>,
    clock: u64,
    pub rates: Rates,
    /// Restores of the latest dispatch of any kernel: what a kernel seen for the first time is
    /// expected to need when its replay does not say (a tool usually asks every kernel for the
    /// same passes).
    pub typical_restores: Option<u64>,
    /// The share of its chunks the latest dispatch of any kernel found changed (at a restore
    /// that hashed everything): what a kernel seen for the first time may change.
    pub typical_dirty: Option<f64>,
    /// The latest dispatch's [`Learned::repeat`] that measured one, of any kernel: whether a
    /// kernel seen for the first time is taken to write the same places each pass.
    pub typical_repeat: Option<f64>,
    /// What following writes costs per page, as measured on this snapshotter's footprints.
    pub track: crate::track::TrackPrices,
    /// A digest of the regions (allocations and chunk size) the latest snapshot covered: a
    /// snapshot of the same footprint as the one before it is expected to be followed by
    /// another (see `Outlook::continues`).
    pub last_footprint: Option<u64>,
}

pub(crate) type SharedMemory = Arc<Mutex<Memory>>;

impl Memory {
    /// The state learned for `key` whose write set has `chunks` flags, if any.
    pub(crate) fn get(&mut self, key: &Key, chunks: usize) -> Option<Learned> {
        self.clock += 1;
        let clock = self.clock;
        let (used, learned) = self.entries.get_mut(key)?;
        *used = clock;
        (learned.write_set.len() == chunks).then(|| learned.clone())
    }

    pub(crate) fn put(&mut self, key: Key, learned: Learned) {
        self.clock += 1;
        self.entries.insert(key, (self.clock, learned));
        if self.entries.len() > MAX_KEPT
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The estimated cost of one restore of `all` chunks under each verified choice, from the
/// rates and what was learned (`set`: chunks in the write set).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Costs {
    pub full: f64,
    pub hash: f64,
    pub writeset: f64,
}

pub(crate) fn estimate(
    rates: &Rates,
    learned: &Learned,
    all: u64,
    set: u64,
    chunk_size: u64,
) -> Option<Costs> {
    let (c, h) = rates.per_byte();
    let partial = rates.partial_hash_per_byte();
    let dirty = learned.dirty_chunks? as f64;
    // A predicting restore sees only the changes outside the set: at least that many change.
    let missed = learned
        .missed_chunks
        .map_or((dirty - set as f64).max(0.0), |m| m as f64);
    let all = all as f64;
    let set = set as f64;
    // Each restore writes back its chunks in one go, at the rate of a write-back that size.
    let written =
        |chunks: f64| chunks * rates.scattered_per_byte((chunks as u64).saturating_mul(chunk_size));
    Some(Costs {
        full: all * c,
        hash: all * h + written(dirty.max(missed)),
        writeset: (all - set) * if set > 0.0 { partial } else { h } + written(set + missed),
    })
}

/// Whether a restore estimated to cost `costs` should copy everything although a verified
/// restore looks cheaper: when the copy rate is stale (see [`COPY_STALE_AFTER`]) and the verified
/// restore's lead is within [`CLOSE_CALL`] of a full one, or whatever the lead when the copy rate
/// is out of date (see [`OUT_OF_DATE_AFTER`]). Otherwise a copy rate measured at another time
/// would decide every later restore, none of which would measure a copy again.
pub(crate) fn refresh_copy_rate(rates: &Rates, costs: &Costs) -> bool {
    rates.out_of_date(COPY)
        || (rates.copy_stale() && costs.full <= costs.hash.min(costs.writeset) * (1.0 + CLOSE_CALL))
}

/// Whether a full restore is the cheapest by the estimates `costs`. After a verified restore
/// (`after_verified`) it must win by more than [`CLOSE_CALL`]: estimates of restores within a
/// few percent of each other are medians of measurements that move by more than that, and
/// switching on every such move made full restores in a third of the restores of replays where
/// the write set led full ones by 15% (the 2-core host, 10% written, the same chunks every
/// pass). Staying with the verified restore costs at most that share of one restore.
pub(crate) fn full_is_cheaper(costs: &Costs, after_verified: bool) -> bool {
    let verified = costs.hash.min(costs.writeset);
    if after_verified {
        costs.full * (1.0 + CLOSE_CALL) < verified
    } else {
        costs.full < verified
    }
}

/// What one restore is expected to save, in the unit of [`Rates::per_byte`], by restoring the
/// cheapest verified way instead of writing everything: from what `learned` says changes (with
/// `set` chunks in the write set), or when it says nothing (or nothing is known), the best case
/// (nothing changes: a restore is a hash pass).
fn saved_per_restore(
    rates: &Rates,
    learned: Option<(&Learned, u64)>,
    chunks: u64,
    chunk_size: u64,
) -> f64 {
    let (copy, hash) = rates.per_byte();
    match learned.and_then(|(l, set)| estimate(rates, l, chunks, set, chunk_size)) {
        Some(c) => c.full - c.hash.min(c.writeset),
        None => chunks as f64 * (copy - hash),
    }
}

/// Whether hashing a snapshot (what it adds to the copy, see [`Rates::snapshot_hash_extra`]) is
/// repaid over `restores` restores, each restoring the cheapest verified way instead of writing
/// everything. `earlier`: what earlier dispatches of the kernel learned; when they say nothing
/// about what changes, the best case is assumed (nothing changes: a restore is a hash pass).
pub(crate) fn snapshot_hashes_pay(
    rates: &Rates,
    earlier: Option<&Learned>,
    restores: u64,
    chunks: u64,
    chunk_size: u64,
) -> bool {
    let known = earlier.map(|e| (e, e.write_set.iter().filter(|&&b| b).count() as u64));
    let copy = rates.per_byte().0;
    let margin = if rates.copy_stale() {
        STALE_HASH_MARGIN
    } else {
        HASH_MARGIN
    };
    restores as f64 * saved_per_restore(rates, known, chunks, chunk_size)
        > chunks as f64 * (rates.snapshot_hash_extra() + margin * copy)
}

/// Whether hashing the snapshot of a kernel nothing is known about pays over `restores` restores.
/// The best case (nothing changes) must repay the hashes. When the kernels replayed before
/// changed a share `typical` of their chunks and at that share the hashes would not pay, the
/// guess that costs less when it is wrong is taken: hashing wrongly costs the hashes and one
/// restore that hashes everything to learn what changes (full restores follow); not hashing
/// wrongly costs what the restores would have saved in the best case, less the hashes. So a
/// short replay after kernels that rewrote a tenth of memory copies, and a long one hashes.
pub(crate) fn new_kernel_hashes_pay(
    rates: &Rates,
    restores: u64,
    chunks: u64,
    chunk_size: u64,
    typical: Option<f64>,
) -> bool {
    if !snapshot_hashes_pay(rates, None, restores, chunks, chunk_size) {
        return false;
    }
    let Some(share) = typical else {
        return true;
    };
    let dirty = (share.clamp(0.0, 1.0) * chunks as f64).round();
    let guess = Learned {
        dirty_chunks: Some(dirty as u64),
        ..Default::default()
    };
    if snapshot_hashes_pay(rates, Some(&guess), restores, chunks, chunk_size) {
        return true;
    }
    let (copy, hash) = rates.per_byte();
    let all = chunks as f64;
    let hashes = all * rates.snapshot_hash_extra();
    let not_hashing_wrongly =
        restores as f64 * saved_per_restore(rates, None, chunks, chunk_size) - hashes;
    let learning = (all * hash + dirty * rates.scattered_per_byte(dirty as u64 * chunk_size)
        - all * copy)
        .max(0.0);
    not_hashing_wrongly > hashes + learning
}

/// A restore that hashes must be estimated to cost less than following writes by this share
/// before following is stopped for it: the estimate is made of rates measured at other times,
/// while what following costs was measured on this replay's own restore.
const STOP_FOLLOWING_MARGIN: f64 = 0.1;

/// What one restore would cost, in nanoseconds, if a replay stopped following writes now: a
/// full restore at the measured copy rate, or (where the store can be hashed, `left` restores
/// remain and `learned` says what the passes change, with `set` chunks in its write set) the
/// cheapest verified restore plus hashing the store spread over the restores left, whichever
/// is cheaper, the latter raised by [`STOP_FOLLOWING_MARGIN`]. `None` before any copy was
/// measured.
pub(crate) fn restore_unfollowed_ns(
    rates: &Rates,
    learned: &Learned,
    set: u64,
    layout: (u64, u64, u64),
    left: Option<u64>,
) -> Option<f64> {
    let (bytes, chunks, chunk_size) = layout;
    let full = rates.copy_ns_per_byte()? * bytes as f64;
    let hashing = left.filter(|&l| l > 0).and_then(|left| {
        let c = estimate(rates, learned, chunks, set, chunk_size)?;
        let store_hash = chunks as f64 * rates.per_byte().1 / left as f64;
        Some((c.hash.min(c.writeset) + store_hash) * chunk_size as f64)
    });
    Some(hashing.map_or(full, |h| full.min(h * (1.0 + STOP_FOLLOWING_MARGIN))))
}

/// Whether hashing the store of a snapshot taken without hashes (a whole hash pass over its
/// bytes) is repaid over `restores` more restores, each restoring the cheapest verified way
/// instead of writing everything. `learned`: what this dispatch (and the kernel's earlier ones)
/// learned, with `set` chunks in its write set.
pub(crate) fn store_hashes_pay(
    rates: &Rates,
    learned: &Learned,
    set: u64,
    restores: u64,
    chunks: u64,
    chunk_size: u64,
) -> bool {
    let (_, hash) = rates.per_byte();
    restores as f64 * saved_per_restore(rates, Some((learned, set)), chunks, chunk_size)
        > chunks as f64 * hash
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunk size of the estimates below: 64 KiB, kreplay's default.
    const CS: u64 = 64 << 10;

    fn region(base: u64, size: u64, generation: u64) -> Region {
        Region {
            base,
            size,
            generation,
        }
    }

    #[test]
    fn following_writes_is_weighed_against_hashing_the_store_for_the_restores_left() {
        // Copies at 0.05 ns per byte, hash passes at 0.03, partial write-backs at 0.08; a
        // tenth of 4096 chunks changes each pass, other chunks than the pass before.
        let rates = Rates::with(Some(0.05), Some(0.03), None, Some(0.08));
        let chunks = 4096;
        let layout = (chunks * CS, chunks, CS);
        let tenth = Learned {
            dirty_chunks: Some(chunks / 10),
            missed_chunks: Some(chunks / 10),
            ..Default::default()
        };
        let full = 0.05 * (chunks * CS) as f64;
        let at = |left| restore_unfollowed_ns(&rates, &tenth, 0, layout, left).unwrap();
        // 30 restores left: a hash pass and a tenth written back (0.038 of a byte's worth per
        // byte) plus hashing the store over 30 (0.001), with the margin: 0.0429, below a copy.
        let thirty = at(Some(30));
        assert!(
            (thirty / full - 0.0429 / 0.05).abs() < 1e-3,
            "{}",
            thirty / full
        );
        // One restore left: hashing the store is not repaid, nor with no plan.
        assert_eq!(at(Some(1)), full);
        assert_eq!(at(None), full);
        assert_eq!(at(Some(0)), full);
        // Nothing known about what changes: only a full restore is priced.
        let unknown = Learned::default();
        assert_eq!(
            restore_unfollowed_ns(&rates, &unknown, 0, layout, Some(30)),
            Some(full)
        );
        // No copy measured yet: nothing to weigh against.
        let unmeasured = Rates::with(None, Some(0.03), None, Some(0.08));
        assert_eq!(
            restore_unfollowed_ns(&unmeasured, &tenth, 0, layout, Some(30)),
            None
        );
    }

    #[test]
    fn keys_differ_by_kernel_region_generation_and_chunk_size() {
        let r = [region(0, 4096, 1), region(8192, 4096, 2)];
        let k = Key::new(7, &r, 1024);
        assert_eq!(k, Key::new(7, &r, 1024));
        assert_ne!(k, Key::new(8, &r, 1024));
        assert_ne!(k, Key::new(7, &r, 2048));
        assert_ne!(k, Key::new(7, &[r[0], region(8192, 4096, 3)], 1024));
        assert_ne!(k, Key::new(7, &r[..1], 1024));
    }

    #[test]
    fn the_least_recently_used_state_is_dropped_beyond_the_limit() {
        let mut m = Memory::default();
        let key = |i: u64| Key::new(i, &[], 1024);
        for i in 0..MAX_KEPT as u64 {
            m.put(key(i), Learned::default());
        }
        assert!(m.get(&key(0), 0).is_some());
        m.put(key(1000), Learned::default());
        assert_eq!(m.len(), MAX_KEPT);
        assert!(m.get(&key(0), 0).is_some(), "recently used: kept");
        assert!(m.get(&key(1), 0).is_none(), "least recently used: dropped");
        assert!(
            m.get(&key(0), 5).is_none(),
            "a set of another length is not reused"
        );
    }

    /// Rates of a machine where a hash pass costs almost a copy and hashing while snapshotting
    /// adds about half a copy (what a 2-core host measures).
    fn host_like_rates() -> Rates {
        Rates::with(Some(1.0), Some(0.9), Some(1.45), None)
    }

    #[test]
    fn snapshot_hashes_do_not_pay_for_replays_too_short_to_repay_them() {
        let rates = host_like_rates();
        // A new kernel after replays of one restore each (2 passes): 1 x 0.1 < 0.45.
        assert!(!snapshot_hashes_pay(&rates, None, 1, 1000, CS));
        // After replays of 37 restores (38 passes): 37 x 0.1 > 0.45.
        assert!(snapshot_hashes_pay(&rates, None, 37, 1000, CS));
        // A kernel whose one earlier dispatch wrote in full (nothing known about its changes)
        // and restored once: still not worth it.
        let full_once = Learned {
            write_set: vec![false; 1000],
            full_streak: 1,
            restores: 1,
            ..Default::default()
        };
        assert!(!snapshot_hashes_pay(&rates, Some(&full_once), 1, 1000, CS));
        // No restores at all: never.
        assert!(!snapshot_hashes_pay(&rates, None, 0, 1000, CS));
    }

    #[test]
    fn a_new_kernel_after_kernels_that_rewrote_a_tenth_hashes_only_when_not_hashing_risks_more() {
        // A hash pass at 0.8 of a copy, hashing adds 0.3 of one to a snapshot, changed chunks
        // cost 2.5 copies each: a restore saves 0.2 of a copy at best, nothing at 10% changed.
        let rates = Rates::with(Some(1.0), Some(0.8), Some(1.3), Some(2.5));
        // Nothing known about what kernels change: the best case decides.
        assert!(new_kernel_hashes_pay(&rates, 3, 1000, CS, None));
        assert!(!new_kernel_hashes_pay(&rates, 1, 1000, CS, None));
        // Kernels rewrote a tenth: 3 restores would save at most 0.6 - 0.3 = 0.3 of a copy
        // when the guess is wrong, hashing wrongly costs 0.3 + 0.05: not hashed.
        assert!(!new_kernel_hashes_pay(&rates, 3, 1000, CS, Some(0.1)));
        // 7 restores risk 1.4 - 0.3 = 1.1 unhashed: hashed.
        assert!(new_kernel_hashes_pay(&rates, 7, 1000, CS, Some(0.1)));
        // Kernels rewrote 1%: the guess itself says the hashes pay.
        assert!(new_kernel_hashes_pay(&rates, 3, 1000, CS, Some(0.01)));
    }

    #[test]
    fn one_outlying_measurement_does_not_move_a_rate_and_a_lasting_change_does() {
        let mut rates = Rates::default();
        let ms = Duration::from_millis;
        let bytes = 16 << 20;
        for _ in 0..8 {
            rates.record_copy(bytes, ms(2));
        }
        let steady = rates.per_byte().0;
        // Another process held the CPU through one copy: three times as long.
        rates.record_copy(bytes, ms(6));
        assert_eq!(rates.per_byte().0, steady);
        // The machine really got slower: the rate follows once most measurements say so.
        for _ in 0..4 {
            rates.record_copy(bytes, ms(4));
        }
        assert!(rates.per_byte().0 > 1.5 * steady, "{rates:?}");
        // Too short to say anything: left out.
        rates.record_hash(1 << 20, ms(100));
        assert_eq!(rates.rate(HASH), None);
    }

    /// `auto` measures what hashing a snapshot adds only on snapshots it hashes. One measured
    /// in a slow moment (in `kreplay bench`, 256 MiB: a first hashing snapshot at 0.091 ns/B
    /// against plain copies at 0.052, later ones at 0.063-0.077) priced the hashes of every
    /// later short replay above what they save, no snapshot hashed again, and 4-pass replays
    /// writing a tenth of the footprint made full restores at 1.2-1.3 times the cost of hash
    /// restores. Once out of date it counts for no more than a usual share of a hash pass, so
    /// the next replay where that pays hashes and measures it again.
    #[test]
    fn a_hashing_snapshot_measured_dear_long_ago_is_tried_again() {
        let mut rates = Rates::default();
        let bytes = 256 << 20;
        let chunks = bytes / CS;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        rates.record_copy(bytes, at(0.052));
        rates.record_hash(bytes, at(0.040));
        rates.record_hashed_copy(bytes, at(0.091));
        let dear = rates.snapshot_hash_extra();
        assert!((dear - 0.039).abs() < 0.002, "{rates:?}");
        // Three restores of a tenth written: the hashes look dearer than what they save.
        assert!(!new_kernel_hashes_pay(&rates, 3, chunks, CS, Some(0.1)));
        // Then only full restores and plain snapshots, at the same speed.
        for _ in 0..OUT_OF_DATE_AFTER {
            rates.record_copy(bytes, at(0.052));
        }
        let retried = rates.snapshot_hash_extra();
        assert!(
            retried <= HASH_EXTRA_RETRY * rates.per_byte().1 + 1e-12,
            "{retried} {rates:?}"
        );
        assert!(new_kernel_hashes_pay(&rates, 3, chunks, CS, Some(0.1)));
        // The snapshot that hashed measures it again, and that measurement is what counts (its
        // restores measure hash passes again too).
        rates.record_hashed_copy(bytes, at(0.091));
        rates.record_hash(bytes, at(0.040));
        assert!(
            (rates.snapshot_hash_extra() - dear).abs() < 0.002,
            "{rates:?}"
        );
        assert!(!new_kernel_hashes_pay(&rates, 3, chunks, CS, Some(0.1)));
    }

    /// A predicting restore hashes every chunk but those of its write set, in the runs between
    /// them: per byte dearer than a pass over everything. Measured as one kind, the hash passes
    /// of predicting restores raised the rate a hash restore is priced at (and the write set
    /// looked cheaper than it was); apart, each is priced at what it costs.
    #[test]
    fn hash_passes_that_leave_out_a_write_set_are_priced_apart_from_whole_ones() {
        let mut rates = Rates::default();
        let bytes = 256 << 20;
        let at = |bytes: u64, per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        rates.record_copy(bytes, at(bytes, 0.052));
        for _ in 0..4 {
            rates.record_hash(bytes, at(bytes, 0.027));
            rates.record_partial_hash(bytes / 10 * 9, at(bytes / 10 * 9, 0.036));
        }
        let (_, hash) = rates.per_byte();
        assert!((hash - 0.027).abs() < 0.001, "{rates:?}");
        assert!(
            (rates.partial_hash_per_byte() - 0.036).abs() < 0.001,
            "{rates:?}"
        );
        // A tenth changes, always the same tenth, learned as the write set.
        let learned = Learned {
            dirty_chunks: Some(100),
            missed_chunks: Some(0),
            ..Default::default()
        };
        let c = estimate(&rates, &learned, 1000, 100, CS).unwrap();
        let write_back = 100.0 * rates.scattered_per_byte(100 * CS);
        assert!(
            (c.hash - (1000.0 * 0.027 + write_back)).abs() < 1.0,
            "{c:?}"
        );
        assert!(
            (c.writeset - (900.0 * 0.036 + write_back)).abs() < 1.0,
            "{c:?}"
        );
        // Out of date, a partial pass is priced as a whole one again, until measured anew.
        for _ in 0..OUT_OF_DATE_AFTER {
            rates.record_hash(bytes, at(bytes, 0.027));
        }
        assert_eq!(rates.partial_hash_per_byte(), rates.per_byte().1);
        rates.record_partial_hash(bytes / 10 * 9, at(bytes / 10 * 9, 0.040));
        assert!(
            (rates.partial_hash_per_byte() - 0.040).abs() < 0.001,
            "{rates:?}"
        );
    }

    #[test]
    fn a_copy_rate_measured_on_a_slower_machine_follows_the_hash_passes_measured_since() {
        // Measured while the machine was slow: copies 0.30 ns/B, hash passes 0.27, hashing
        // snapshots 0.39, scattered write-backs 0.45.
        let mut rates = Rates::default();
        let bytes = 256 << 20;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        for _ in 0..3 {
            rates.record_copy(bytes, at(0.30));
            rates.record_hash(bytes, at(0.27));
            rates.record_hashed_copy(bytes, at(0.39));
            rates.record_scattered(bytes / 10, at(0.45));
        }
        // Then only verified restores (auto chose them): hash passes and scattered write-backs
        // at two thirds of the time they took before. No copy is measured, yet a copy costs two
        // thirds of what it did too.
        for _ in 0..8 {
            rates.record_hash(bytes, at(0.18));
            rates.record_scattered(bytes / 10, at(0.30));
        }
        let (copy, hash) = rates.per_byte();
        assert!((copy - 0.20).abs() < 0.01, "copy {copy}");
        assert!((hash - 0.18).abs() < 0.01, "hash {hash}");
        assert!(
            (rates.snapshot_hash_extra() - 0.06).abs() < 0.01,
            "{rates:?}"
        );
        // 10% of the chunks change: a hash restore (0.18 + 0.1 x 0.30 = 0.21 per byte) costs
        // more than a full one (0.20). Against the stale copy rate (0.30) it looked cheaper.
        let learned = Learned {
            dirty_chunks: Some(100),
            missed_chunks: Some(100),
            ..Default::default()
        };
        let c = estimate(&rates, &learned, 1000, 0, CS).unwrap();
        assert!(c.full < c.hash && c.full < c.writeset, "{c:?}");
    }

    #[test]
    fn a_close_call_on_a_stale_copy_rate_copies_everything_to_measure_it_again() {
        let bytes = 256 << 20;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let mut rates = Rates::default();
        rates.record_copy(bytes, at(0.20));
        rates.record_hash(bytes, at(0.16));
        let close = Costs {
            full: 1.0,
            hash: 0.97,
            writeset: 0.98,
        };
        let clear = Costs {
            full: 1.0,
            hash: 0.5,
            writeset: 0.6,
        };
        // A copy measured recently: the estimates decide.
        assert!(!refresh_copy_rate(&rates, &close));
        // Then only hash passes and write-backs, as when auto keeps choosing verified restores.
        for _ in 0..COPY_STALE_AFTER / 2 {
            rates.record_hash(bytes, at(0.16));
            rates.record_scattered(bytes / 10, at(0.3));
        }
        // A close call is no longer trusted; a clear one still is.
        assert!(refresh_copy_rate(&rates, &close));
        assert!(!refresh_copy_rate(&rates, &clear));
        // The full restore measures a copy: fresh again.
        rates.record_copy(bytes, at(0.18));
        assert!(!refresh_copy_rate(&rates, &close));
        // No copy ever measured: nothing to refresh (the per-byte fallback already takes a copy
        // to cost what a hash pass does).
        let mut never = Rates::default();
        for _ in 0..COPY_STALE_AFTER {
            never.record_hash(bytes, at(0.16));
        }
        assert!(!refresh_copy_rate(&never, &close));
    }

    /// A copy rate measured during a slow spell, then left unmeasured while auto hashed (its
    /// own choices measure only hash passes and hashing snapshots), must not keep making copies
    /// look dearer than they are and hashing look free: once stale long enough it is measured
    /// again whatever the estimates say, and that measurement replaces the stale ones, based
    /// on the machine's speed the fresh measurements of the other kinds say.
    #[test]
    fn a_copy_rate_left_stale_is_measured_again_and_replaces_the_stale_one() {
        let bytes = 256 << 20;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let mut rates = Rates::default();
        // A steady machine: a hash pass costs 0.82 of a copy, hashing adds 0.29 of one to a
        // snapshot.
        for _ in 0..8 {
            rates.record_copy(bytes, at(0.140));
            rates.record_hash(bytes, at(0.115));
            rates.record_hashed_copy(bytes, at(0.180));
        }
        // A slow spell (another process) while only copies are measured (a replay restored in
        // full), then the machine is as before and auto hashes: only hash passes and hashing
        // snapshots are measured for a long while.
        for _ in 0..4 {
            rates.record_copy(bytes, at(0.210));
        }
        for _ in 0..40 {
            rates.record_hash(bytes, at(0.115));
            rates.record_hashed_copy(bytes, at(0.180));
        }
        let clear_lead = Costs {
            full: 1.0,
            hash: 0.5,
            writeset: 0.6,
        };
        let (copy, hash) = rates.per_byte();
        assert!(
            hash / copy < 0.78 && rates.snapshot_hash_extra() / copy < 0.2,
            "the stale copy rate makes copies look dearer: hash/copy {}",
            hash / copy
        );
        assert!(
            refresh_copy_rate(&rates, &clear_lead),
            "a long-stale copy rate is measured again even against a clear lead"
        );
        rates.record_copy(bytes, at(0.140));
        assert!(!refresh_copy_rate(&rates, &clear_lead));
        let (copy, hash) = rates.per_byte();
        let extra = rates.snapshot_hash_extra();
        assert!(
            (hash / copy - 0.82).abs() < 0.04,
            "hash/copy {}",
            hash / copy
        );
        assert!(
            (extra / copy - 0.29).abs() < 0.04,
            "extra/copy {}",
            extra / copy
        );
    }

    /// The traced miss of the 2-core host: a hash rate measured during a slow spell for hash
    /// passes (above the copy rate), then only copies for a long while (auto restored in full,
    /// so nothing measured a hash pass). A kernel that rewrites the same 1% over 8 passes must
    /// hash its snapshot again once that rate is out of date, or no later choice ever measures
    /// hashing. When the fresh measurement confirms that hashing is dear, auto goes back to
    /// plain snapshots, and probes again only after as many measurements once more.
    #[test]
    fn a_hash_rate_out_of_date_is_measured_again_where_hashing_would_pay_at_its_usual_cost() {
        let bytes = 256 << 20;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let chunks = 4096;
        let same_percent = Learned {
            write_set: (0..chunks).map(|c| c < 41).collect(),
            dirty_chunks: Some(41),
            missed_chunks: Some(0),
            restores: 7,
            ..Default::default()
        };
        let mut rates = Rates::default();
        for _ in 0..4 {
            rates.record_copy(bytes, at(0.060));
            rates.record_hashed_copy(bytes, at(0.095));
            rates.record_hash(bytes, at(0.086));
        }
        let hashes_pay = |rates: &Rates| {
            (
                snapshot_hashes_pay(rates, Some(&same_percent), 7, chunks, CS),
                new_kernel_hashes_pay(rates, 7, chunks, CS, Some(0.01)),
            )
        };
        assert_eq!(hashes_pay(&rates), (false, false), "hashing is dear now");
        for _ in 0..OUT_OF_DATE_AFTER - 1 {
            rates.record_copy(bytes, at(0.060));
        }
        assert_eq!(hashes_pay(&rates), (false, false), "not out of date yet");
        rates.record_copy(bytes, at(0.060));
        assert_eq!(
            hashes_pay(&rates),
            (true, true),
            "an out-of-date hash rate is measured again: {rates:?}"
        );
        // The probe finds hashing as dear as before: its measurement replaces the old ones
        // and the next snapshots are plain again, until the rate is out of date once more.
        rates.record_hash(bytes, at(0.086));
        assert_eq!(hashes_pay(&rates), (false, false), "{rates:?}");
        for _ in 0..OUT_OF_DATE_AFTER - 1 {
            rates.record_copy(bytes, at(0.060));
            assert!(!hashes_pay(&rates).0);
        }
        // A probe that finds hashing cheap keeps auto hashing.
        rates.record_copy(bytes, at(0.060));
        assert!(hashes_pay(&rates).0);
        rates.record_hash(bytes, at(0.040));
        assert_eq!(hashes_pay(&rates), (true, true), "{rates:?}");
    }

    /// A copy rate gone stale while auto kept choosing write-set restores is re-measured only
    /// where a full restore costs less than the target leaves: a verified restore that leads by
    /// a tenth is kept (copying everything instead would cost that tenth of a restore each
    /// time), one that leads by a few percent is a close call and copies everything, and a copy
    /// rate out of date is measured again whatever the lead.
    #[test]
    fn a_stale_copy_rate_is_refreshed_only_on_calls_closer_than_the_target_allows() {
        let bytes = 256 << 20;
        let at = |per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let mut rates = Rates::default();
        rates.record_copy(bytes, at(0.20));
        for _ in 0..COPY_STALE_AFTER / 2 {
            rates.record_hash(bytes, at(0.16));
            rates.record_scattered(bytes / 10, at(0.3));
        }
        assert!(rates.since[COPY] >= COPY_STALE_AFTER);
        assert!(rates.since[COPY] < OUT_OF_DATE_AFTER);
        let costs = |verified: f64| Costs {
            full: 1.0,
            hash: 1.2,
            writeset: verified,
        };
        assert!(
            !refresh_copy_rate(&rates, &costs(0.9)),
            "a lead of a tenth is not a close call"
        );
        assert!(!refresh_copy_rate(&rates, &costs(0.93)), "nor one of 7%");
        assert!(refresh_copy_rate(&rates, &costs(0.97)), "3% is");
        assert!(!refresh_copy_rate(&rates, &costs(0.5)));
        // Out of date after 16 verified restores (32 measurements): re-measured whatever the
        // lead, so a drifted copy rate decides no more than 16 restores.
        for _ in 0..COPY_STALE_AFTER / 2 {
            rates.record_hash(bytes, at(0.16));
            rates.record_scattered(bytes / 10, at(0.3));
        }
        assert!(refresh_copy_rate(&rates, &costs(0.5)), "out of date");
    }

    /// Writing back part of the footprint costs per byte what its size makes it: below the
    /// streaming threshold ordinary stores read every destination line first (on the 2-core
    /// host a scattered tenth of 256 MiB cost 1.4-1.7 copies per byte), at or above it
    /// streaming stores write like a full restore (0.85-1.0 copies). One rate for both let a
    /// kernel whose write set grew past the threshold make every scattered tenth look as cheap
    /// as a copy, and hashing look as if it paid.
    #[test]
    fn partial_write_backs_are_costed_by_whether_they_stream() {
        let footprint = 256u64 << 20;
        let at = |bytes: u64, per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let mut rates = Rates::default();
        let tenth = footprint / 10;
        let half = footprint / 2;
        for _ in 0..4 {
            rates.record_copy(footprint, at(footprint, 0.20));
            rates.record_hash(footprint, at(footprint, 0.16));
            rates.record_scattered(tenth, at(tenth, 0.30));
            rates.record_scattered(half, at(half, 0.18));
            rates.record_scattered(half, at(half, 0.18));
        }
        let small = rates.scattered_per_byte(tenth);
        let large = rates.scattered_per_byte(half);
        assert!((small - 0.30).abs() < 0.02, "a scattered tenth: {small}");
        assert!((large - 0.18).abs() < 0.02, "half the footprint: {large}");
        // A tenth of the chunks changed, nothing learned to predict them: a hash restore writes
        // the tenth with ordinary stores, 0.16 + 0.1 x 0.30 = 0.19 per byte of the footprint,
        // against 0.20 for a full one.
        let chunks = footprint / CS;
        let learned = Learned {
            dirty_chunks: Some(chunks / 10),
            missed_chunks: Some(chunks / 10),
            ..Default::default()
        };
        let c = estimate(&rates, &learned, chunks, 0, CS).unwrap();
        let per_byte = c.hash / chunks as f64;
        assert!((per_byte - 0.19).abs() < 0.005, "{c:?}");
    }

    /// The hashes of a snapshot are the difference of two rates measured at different times,
    /// one of which may have drifted: a copy rate that came out above the hashing snapshot's
    /// made hashing look free, and a 2-pass replay hashed its snapshot for one restore that
    /// could not repay it. Hashing every byte while copying is never free: at least a share of
    /// a hash pass is counted (on the 2-core host it measured 0.2-0.3 of one).
    #[test]
    fn a_drifted_copy_rate_never_makes_hashing_a_snapshot_look_free() {
        let rates = Rates::with(Some(1.0), Some(0.8), Some(0.98), Some(1.2));
        let extra = rates.snapshot_hash_extra();
        assert!(extra >= 0.1, "{extra}");
        // A kernel nothing is known about, after kernels that rewrote a tenth, in a 2-pass
        // replay: one restore saves at most 0.2 of a copy, less than the hashes and the learning
        // restore risk.
        assert!(!new_kernel_hashes_pay(&rates, 1, 4096, CS, Some(0.1)));
        // Measured without drift the extra is the difference.
        let rates = Rates::with(Some(1.0), Some(0.8), Some(1.25), Some(1.2));
        assert!((rates.snapshot_hash_extra() - 0.25).abs() < 1e-9);
    }

    /// A later dispatch of a kernel that rewrites the same tenth of its chunks, in a 2-pass
    /// replay: its one restore, a verified write set, is estimated to save 0.16 of a copy over a
    /// full one, against hashes of 0.13 of a copy. A saving that thin is within what the
    /// estimates can tell apart (they are medians of measurements that move by tens of percent
    /// on a shared machine; on the 2-core host such replays hashed cost 1.06-1.23x of the
    /// plain ones), so the snapshot is not hashed; over 3 restores the same saving is clear.
    #[test]
    fn a_snapshot_is_hashed_only_for_a_saving_the_estimates_can_tell_apart() {
        let rates = Rates::with(Some(1.0), Some(0.8), Some(1.13), Some(1.2));
        let chunks = 4096;
        let same_tenth = Learned {
            write_set: (0..chunks).map(|c| c % 10 == 0).collect(),
            dirty_chunks: Some(410),
            missed_chunks: Some(0),
            restores: 1,
            ..Default::default()
        };
        assert!(!snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            1,
            chunks,
            CS
        ));
        assert!(snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            3,
            chunks,
            CS
        ));
    }

    /// A later dispatch of a kernel that rewrites the same tenth, in a 2-pass replay, on rates
    /// where its one verified restore saves 0.31 of a copy against hashes of 0.15: hashed while
    /// the copy rate is fresh. Once it is stale (auto kept restoring verified, measuring no
    /// copy), the same thin saving is not trusted: the snapshot is taken plain, which measures
    /// the copy again. A 38-pass replay still hashes on the stale rate.
    #[test]
    fn a_snapshot_on_a_stale_copy_rate_is_hashed_only_for_a_clear_saving() {
        let footprint = 256u64 << 20;
        let tenth = footprint / 10;
        let at = |bytes: u64, per_byte: f64| Duration::from_nanos((per_byte * bytes as f64) as u64);
        let mut rates = Rates::default();
        rates.record_copy(footprint, at(footprint, 0.20));
        let others = |rates: &mut Rates, times: u32| {
            for _ in 0..times {
                rates.record_hash(footprint, at(footprint, 0.12));
                rates.record_hashed_copy(footprint, at(footprint, 0.23));
                rates.record_scattered(tenth, at(tenth, 0.30));
            }
        };
        others(&mut rates, 2);
        let chunks = footprint / CS;
        let same_tenth = Learned {
            write_set: (0..chunks).map(|c| c % 10 == 0).collect(),
            dirty_chunks: Some(chunks / 10 + 1),
            missed_chunks: Some(0),
            restores: 1,
            ..Default::default()
        };
        assert!(!rates.copy_stale());
        assert!(snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            1,
            chunks,
            CS
        ));
        others(&mut rates, 4);
        assert!(rates.copy_stale());
        assert!(!snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            1,
            chunks,
            CS
        ));
        assert!(snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            37,
            chunks,
            CS
        ));
        // The plain snapshot's copy makes the rate fresh again.
        rates.record_copy(footprint, at(footprint, 0.20));
        assert!(snapshot_hashes_pay(
            &rates,
            Some(&same_tenth),
            1,
            chunks,
            CS
        ));
    }

    #[test]
    fn a_verified_restore_is_kept_unless_a_full_one_is_clearly_cheaper() {
        let costs = |full: f64| Costs {
            full,
            hash: 1.2,
            writeset: 1.0,
        };
        // After a verified restore: a full one estimated 3% cheaper is within what the
        // estimates tell apart, one 10% cheaper is not.
        assert!(!full_is_cheaper(&costs(0.97), true));
        assert!(full_is_cheaper(&costs(0.90), true));
        // After a full restore (or before any), the cheapest by the estimates.
        assert!(full_is_cheaper(&costs(0.97), false));
        assert!(!full_is_cheaper(&costs(1.01), false));
    }

    #[test]
    fn hashing_the_store_late_pays_only_over_enough_restores_that_save() {
        // A whole hash pass (0.9 of a copy) against 0.1 of a copy saved per restore at best.
        let rates = host_like_rates();
        let nothing_known = Learned::default();
        assert!(!store_hashes_pay(&rates, &nothing_known, 0, 8, 1000, CS));
        assert!(store_hashes_pay(&rates, &nothing_known, 0, 10, 1000, CS));
        // Known to rewrite most of memory: a verified restore saves nothing over a full one.
        let most = Learned {
            dirty_chunks: Some(900),
            ..Default::default()
        };
        assert!(!store_hashes_pay(&rates, &most, 0, 1000, 1000, CS));
    }

    #[test]
    fn without_a_measured_copy_hashing_is_not_assumed_to_pay() {
        // Only hashing snapshots and hash passes measured so far (auto always hashed): a copy
        // must not be assumed to cost more than the hash pass, or auto keeps hashing a 2-pass
        // replay's snapshot and never measures the plain copy that would stop it.
        let rates = Rates::with(None, Some(0.9), Some(1.4), None);
        assert!(!snapshot_hashes_pay(&rates, None, 1, 1000, CS));
        let (copy, hash) = rates.per_byte();
        assert_eq!((copy, hash), (0.9, 0.9));
        // So the next restore with a known dirty share is a full one, which measures the copy.
        let learned = Learned {
            dirty_chunks: Some(100),
            ..Default::default()
        };
        let c = estimate(&rates, &learned, 1000, 0, CS).unwrap();
        assert!(c.full < c.hash && c.full < c.writeset, "{c:?}");
    }

    #[test]
    fn changed_chunks_cost_what_partial_write_backs_measured() {
        // A hash pass at 0.85 of a copy and 10% changed: counted at the copy's rate a hash
        // restore looks cheaper than a full one (0.95 < 1), at the measured rate of scattered
        // write-backs (2x a copy) it is not (1.05 > 1).
        let learned = Learned {
            dirty_chunks: Some(100),
            missed_chunks: Some(100),
            ..Default::default()
        };
        let mut rates = Rates::with(Some(1.0), Some(0.85), Some(1.4), None);
        let c = estimate(&rates, &learned, 1000, 0, CS).unwrap();
        assert!(c.hash < c.full, "{c:?}");
        rates.base[SCATTERED] = Some(2.0);
        let c = estimate(&rates, &learned, 1000, 0, CS).unwrap();
        assert!(c.full < c.hash && c.full < c.writeset, "{c:?}");
    }

    #[test]
    fn snapshot_hashes_pay_at_once_where_hashing_is_much_cheaper_than_copying() {
        // A device that hashes at several times its copy rate.
        let rates = Rates::with(Some(1.0), Some(0.2), Some(1.1), None);
        assert!(snapshot_hashes_pay(&rates, None, 1, 1000, CS));
        // What changes decides: a kernel that rewrites all of memory gains nothing from hashes.
        let all_written = Learned {
            write_set: vec![true; 1000],
            dirty_chunks: Some(1000),
            missed_chunks: Some(0),
            restores: 3,
            ..Default::default()
        };
        assert!(!snapshot_hashes_pay(
            &rates,
            Some(&all_written),
            3,
            1000,
            CS
        ));
        // Before anything is measured, the extra cost is taken as a whole hash pass.
        assert_eq!(
            Rates::default().snapshot_hash_extra(),
            DEFAULT_HASH_PER_COPY
        );
    }

    #[test]
    fn estimates_prefer_full_when_most_chunks_change_and_the_write_set_when_it_predicts() {
        let rates = Rates::default();
        let mut learned = Learned {
            dirty_chunks: Some(900),
            ..Default::default()
        };
        let c = estimate(&rates, &learned, 1000, 0, CS).unwrap();
        assert!(c.full < c.hash && c.full < c.writeset, "{c:?}");
        learned.dirty_chunks = Some(10);
        learned.missed_chunks = Some(0);
        let c = estimate(&rates, &learned, 1000, 10, CS).unwrap();
        assert!(c.writeset < c.hash && c.hash < c.full, "{c:?}");
        // The set predicted nothing: every change was outside it, so writing it is waste, and
        // most of memory changing outside it makes full restores cheapest.
        learned.missed_chunks = Some(10);
        let c = estimate(&rates, &learned, 1000, 10, CS).unwrap();
        assert!(c.hash < c.writeset, "{c:?}");
        learned.missed_chunks = Some(800);
        let c = estimate(&rates, &learned, 1000, 10, CS).unwrap();
        assert!(c.full < c.hash && c.full < c.writeset, "{c:?}");
        learned.dirty_chunks = None;
        assert_eq!(estimate(&rates, &learned, 1000, 10, CS), None);
    }
}
