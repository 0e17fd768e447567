//! Folding changes into a snapshot: work that ran while a snapshot was held, and whose effects
//! must survive the restores that follow, is written into the store as well as left in memory.
//!
//! The owner of a [`Snapshot`] cannot tell such work's writes from its own kernel's by looking at
//! memory afterwards, so whoever issues the work first takes a [`Capture`] of the snapshot's
//! [`Footprint`] (the bytes as they are just before the work runs), and once the work finished
//! [`Snapshotter::changes`] lists, byte for byte, what differs from the capture: a [`Delta`].
//! [`Snapshot::fold`] writes a delta into the store (and refreshes the hashes of the chunks it
//! touches), so every later restore brings those bytes back with the work's values, whatever
//! the restore strategy and store tier.

use smallvec::SmallVec;

use crate::copy::read_device;
use crate::device::{CopyError, DeviceMemory};
use crate::hash::chunk_hash;
use crate::inventory::Region;
use crate::snapshot::{Snapshot, SnapshotPlan, Snapshotter, try_vec};
use crate::store::Backing;

/// The memory a snapshot holds, as a [`Capture`] reads it: its regions and the agents whose copy
/// fences the reads hold.
#[derive(Clone, Debug)]
pub struct Footprint {
    pub(crate) regions: Vec<Region>,
    pub(crate) fence: Option<SmallVec<[u64; 2]>>,
}

impl Footprint {
    /// The regions, sorted by base.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The agents whose memory it holds (`None`: any agent's).
    pub fn agents(&self) -> Option<&[u64]> {
        self.fence.as_deref()
    }

    /// Bytes a capture copies.
    pub fn bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    /// Whether it holds no memory.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The pieces (address, length) of the `len` bytes at `addr` that lie in its regions, in
    /// region order.
    pub fn pieces(&self, addr: u64, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let end = addr.saturating_add(len);
        self.regions.iter().filter_map(move |r| {
            let (from, to) = (addr.max(r.base), end.min(r.base + r.size));
            (from < to).then(|| (from, to - from))
        })
    }

    /// The part of it made of the regions `keep` accepts (the memory one call may write, say).
    pub fn only(&self, keep: impl Fn(&Region) -> bool) -> Footprint {
        Footprint {
            regions: self.regions.iter().filter(|r| keep(r)).copied().collect(),
            fence: self.fence.clone(),
        }
    }
}

/// Host copies of a footprint's regions as they were at one moment (`None` for a region freed
/// by then).
pub struct Capture {
    regions: Vec<(Region, Option<Vec<u8>>)>,
    fence: Option<SmallVec<[u64; 2]>>,
}

impl Capture {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.regions
            .iter()
            .filter_map(|(_, b)| b.as_ref())
            .map(|b| b.len() as u64)
            .sum()
    }
}

/// Bytes of device memory that changed since a [`Capture`], with their new values: runs of
/// changed bytes, each exactly as long as the change (bytes that kept their value are never
/// included); or, from [`Snapshotter::written`], every byte of a range known to be written.
#[derive(Clone, Debug, Default)]
pub struct Delta {
    changes: Vec<(u64, Vec<u8>)>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Bytes changed.
    pub fn bytes(&self) -> u64 {
        self.changes.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// The runs of changed bytes: device address and new values.
    pub fn changes(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.changes.iter().map(|(a, b)| (*a, &b[..]))
    }

    /// Adds `other`'s runs to these.
    pub fn append(&mut self, other: Delta) {
        self.changes.extend(other.changes);
    }
}

/// `len` bytes of device memory at `addr`, read into a host buffer of their own; `what` names
/// the buffer when no host memory can be had for it.
fn read_to_host(
    device: &dyn DeviceMemory,
    addr: u64,
    len: u64,
    what: &str,
) -> Result<Vec<u8>, CopyError> {
    let failed = |detail: String| CopyError::Failed { addr, len, detail };
    let size =
        usize::try_from(len).map_err(|_| failed("the range exceeds the address space".into()))?;
    let mut bytes = try_vec(size, 0u8).map_err(|_| failed(format!("no host memory for {what}")))?;
    read_device(device, addr, &mut bytes)?;
    Ok(bytes)
}

impl SnapshotPlan {
    /// The memory this plan's snapshot will hold.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            regions: self.regions().to_vec(),
            fence: self.fence_agents(),
        }
    }
}

impl Snapshotter {
    /// Copies the current bytes of `footprint` to the host. Regions freed (or reused by a newer
    /// allocation) since the footprint was planned are left out; frees wait for the copy.
    pub fn capture(&self, footprint: &Footprint) -> Result<Capture, CopyError> {
        let device = self.device();
        let pinned = self.inventory().pin(footprint.fence.as_deref());
        let mut regions = Vec::with_capacity(footprint.regions.len());
        for region in &footprint.regions {
            if !pinned.is_live(region) {
                regions.push((*region, None));
                continue;
            }
            let bytes = read_to_host(device, region.base, region.size, "a capture")?;
            regions.push((*region, Some(bytes)));
        }
        Ok(Capture {
            regions,
            fence: footprint.fence.clone(),
        })
    }

    /// The current bytes of `len` bytes at `addr`, as a delta: what work known to have written
    /// every one of them (a copy, a memset) left there, whether or not a byte's value changed.
    /// A capture cannot tell a byte written with the value it held from one not written;
    /// where the written range is known this is exact. The caller makes sure the memory is
    /// still allocated; [`written_within`](Self::written_within) checks it.
    pub fn written(&self, addr: u64, len: u64) -> Result<Delta, CopyError> {
        let bytes = read_to_host(self.device(), addr, len, "the written bytes")?;
        Ok(Delta {
            changes: if bytes.is_empty() {
                Vec::new()
            } else {
                vec![(addr, bytes)]
            },
        })
    }

    /// [`written`](Self::written) for the parts of the `len` bytes at `addr` that lie in
    /// `footprint`'s regions still allocated: regions freed (or reused by a newer allocation)
    /// since the footprint was planned are left out, as by [`changes`](Self::changes), since
    /// their memory may be gone (reading it faulted where the allocator had unmapped it); frees
    /// wait for the read.
    pub fn written_within(
        &self,
        footprint: &Footprint,
        addr: u64,
        len: u64,
    ) -> Result<Delta, CopyError> {
        let device = self.device();
        let pinned = self.inventory().pin(footprint.fence.as_deref());
        let mut changes = Vec::new();
        for (from, piece) in footprint.pieces(addr, len) {
            let live = footprint
                .regions
                .iter()
                .find(|r| r.base <= from && from < r.base + r.size)
                .is_some_and(|r| pinned.is_live(r));
            if !live {
                continue;
            }
            let bytes = read_to_host(device, from, piece, "the written bytes")?;
            changes.push((from, bytes));
        }
        Ok(Delta { changes })
    }

    /// What differs in device memory from `since`, byte for byte. Regions freed since the
    /// capture are left out.
    pub fn changes(&self, since: &Capture) -> Result<Delta, CopyError> {
        let device = self.device();
        let pinned = self.inventory().pin(since.fence.as_deref());
        let mut delta = Delta::default();
        let mut now = Vec::new();
        for (region, before) in &since.regions {
            let Some(before) = before else { continue };
            if !pinned.is_live(region) {
                continue;
            }
            now.clear();
            now.resize(before.len(), 0);
            read_device(device, region.base, &mut now)?;
            let mut i = 0;
            while i < now.len() {
                if now[i] == before[i] {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < now.len() && now[i] != before[i] {
                    i += 1;
                }
                delta
                    .changes
                    .push((region.base + start as u64, now[start..i].to_vec()));
            }
        }
        Ok(delta)
    }
}

impl Snapshot {
    /// The memory this snapshot holds, for [`Snapshotter::capture`].
    pub fn footprint(&self) -> Footprint {
        Footprint {
            regions: self.layout.regions.clone(),
            fence: self.fence.clone(),
        }
    }

    /// Writes `delta` into the store, so that every later restore brings those bytes back with
    /// their new values (device memory is left as it is: it holds them already). Chunk hashes
    /// of the chunks it touches are refreshed. The parts of changes outside the snapshot's
    /// regions, or in regions freed since, are ignored (a change that runs past a region keeps
    /// its part inside). Returns the bytes folded in.
    ///
    /// Where a device shadow refuses a change (its device copy fails), the snapshot keeps the
    /// bytes in host memory and every later restore writes them after the store's bytes, so
    /// they survive as if the shadow held them; a restore that cannot write them fails, as a
    /// restore does, with the bytes it lost. (Before, the fold failed, and the next restore
    /// undid what the work wrote: under softhsa's injected copy faults, the stress mix's
    /// re-entrant tool work was lost with a warning on stderr.)
    pub fn fold(&mut self, delta: &Delta) -> Result<u64, CopyError> {
        let pinned = self.inventory.pin(self.fence.as_deref());
        let layout = &self.layout;
        let cs = layout.chunk_size;
        // (region, chunk of the region) of every chunk a change lands in.
        let mut touched: Vec<(usize, usize)> = Vec::new();
        let mut folded = 0;
        for (addr, bytes) in delta.changes() {
            let end = addr.saturating_add(bytes.len() as u64);
            // Every region the change overlaps (regions never share a byte), from the last one
            // starting at or before `addr`; each gets its part of the change.
            let from = layout
                .regions
                .partition_point(|g| g.base <= addr)
                .saturating_sub(1);
            for (r, region) in layout.regions.iter().enumerate().skip(from) {
                if region.base >= end {
                    break;
                }
                let lo = addr.max(region.base);
                let hi = end.min(region.base.saturating_add(region.size));
                if lo >= hi || !pinned.is_live(region) {
                    continue;
                }
                let piece = &bytes[(lo - addr) as usize..(hi - addr) as usize];
                let offset = lo - region.base;
                let at = layout.store_offset[r] + offset;
                match &mut self.store.backing {
                    Backing::Device { addr: shadow } => {
                        // A shadow that refuses the bytes (a failed device copy, tried again
                        // up to FOLD_ATTEMPTS times in all) leaves them to be written by every
                        // restore after the store's.
                        let device = &self.source.device;
                        let taken =
                            (0..FOLD_ATTEMPTS).any(|_| device.write(*shadow + at, piece).is_ok());
                        if !taken {
                            self.overlay.push(Overlay {
                                region: r,
                                offset,
                                bytes: piece.to_vec(),
                            });
                        }
                    }
                    Backing::Empty(_) => continue,
                    Backing::Host { .. } | Backing::File { .. } => {
                        let at = at as usize;
                        self.store.bytes_mut()[at..at + piece.len()].copy_from_slice(piece);
                    }
                }
                folded += piece.len() as u64;
                let first = (offset / cs) as usize;
                let last = ((offset + piece.len() as u64 - 1) / cs) as usize;
                touched.extend((first..=last).map(|k| (r, k)));
            }
        }
        let rehash = self.hashes.len() == layout.chunks() && !touched.is_empty();
        if rehash {
            touched.sort_unstable();
            touched.dedup();
            let mut scratch = Vec::new();
            for (r, k) in touched {
                let c = layout.first_chunk[r] + k;
                let (offset, len) = layout.span(r, k, 1);
                let at = (layout.store_offset[r] + offset) as usize;
                self.hashes[c] = match &self.store.backing {
                    Backing::Device { addr: shadow } => {
                        scratch.resize(len as usize, 0);
                        match self.source.device.read(*shadow + at as u64, &mut scratch) {
                            Ok(()) => chunk_hash(&scratch),
                            // Unknown: a hash no chunk is likely to have, so that the chunk
                            // is written back (and the overlay on top of it) whenever hashed.
                            Err(_) => !self.hashes[c],
                        }
                    }
                    _ => chunk_hash(&self.store.bytes()[at..at + len as usize]),
                };
            }
        }
        drop(pinned);
        if rehash {
            // Changed hashes get a new name: a device keeping a copy of them by the old one
            // would otherwise verify against what the store held before the fold.
            self.rename();
        }
        Ok(folded)
    }
}

/// Times a change is offered to a device shadow before it is kept beside it: a device copy may
/// fail once and succeed when asked again (softhsa's injected copy faults do), and every change
/// kept beside the shadow is written by every restore after, each a device copy of its own that
/// may fail in turn and stop the replay.
const FOLD_ATTEMPTS: usize = 3;

/// Bytes folded into a snapshot that its device shadow refused: `bytes` at `offset` of region
/// `region` of its layout.
#[derive(Clone, Debug)]
pub(crate) struct Overlay {
    pub(crate) region: usize,
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
}

/// Writes `overlay` into device memory after a restore wrote the store's bytes (`outcome`,
/// which takes in what was written or lost), in the regions still `live`.
pub(crate) fn apply_overlay(
    device: &dyn DeviceMemory,
    layout: &crate::layout::Layout,
    live: &[bool],
    overlay: &[Overlay],
    outcome: &mut crate::copy::WriteOutcome,
) {
    for piece in overlay.iter().filter(|p| live[p.region]) {
        let addr = layout.regions[piece.region].base + piece.offset;
        match device.write(addr, &piece.bytes) {
            Ok(()) => outcome.bytes += piece.bytes.len() as u64,
            Err(e) => {
                outcome.lost_bytes += piece.bytes.len() as u64;
                outcome.error.get_or_insert(e);
            }
        }
    }
}
