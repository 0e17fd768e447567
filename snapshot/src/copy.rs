//! Parallel copy and hash primitives over a [`Layout`]. Callers hold the inventory's read side
//! for the duration of every function here, so every live region stays allocated.

use crate::hash::{GROUP, chunk_hashes};

use crate::device::{
    Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HashRange, HostWindow,
    StoreBytes, VerifiedRestore, VerifyRange,
};
use crate::layout::{Layout, Piece, marked_indices, split_ranges};
use crate::store::Store;

/// Chunks hashed per rayon job when hashing through host windows: whole groups of
/// [`GROUP`], which [`chunk_hashes`] hashes in one loop.
const MIN_CHUNKS_PER_JOB: usize = 2 * GROUP;

/// The host window of every live region that the device exposes in full.
pub(crate) fn windows(
    device: &dyn DeviceMemory,
    layout: &Layout,
    live: &[bool],
) -> Vec<Option<HostWindow>> {
    layout
        .regions
        .iter()
        .zip(live)
        .map(|(r, &live)| {
            live.then(|| device.host_window(r.base, r.size))
                .flatten()
                .filter(|w| w.len() as u64 >= r.size)
        })
        .collect()
}

/// `len` bytes of a host window starting `offset` bytes in.
///
/// # Safety
/// `offset + len <= window.len()`, and the caller holds the inventory's read side for the
/// window's allocation (see [`HostWindow::new`]), so the bytes are valid and not written
/// concurrently while the returned slice lives.
unsafe fn window_bytes<'a>(window: &HostWindow, offset: u64, len: u64) -> &'a [u8] {
    debug_assert!(offset + len <= window.len() as u64);
    // SAFETY: in bounds by the caller's promise; validity and absence of concurrent writers come
    // from the HostWindow contract while the read side is held.
    unsafe { std::slice::from_raw_parts(window.as_ptr().add(offset as usize), len as usize) }
}

/// Reads `dst.len()` bytes of device memory at `addr`: through a host window when the device
/// offers one for the range (no runtime copy that could fail), else through the device. The
/// caller holds the inventory's read side for the allocation.
pub(crate) fn read_device(
    device: &dyn DeviceMemory,
    addr: u64,
    dst: &mut [u8],
) -> Result<(), CopyError> {
    let len = dst.len() as u64;
    match device
        .host_window(addr, len)
        .filter(|w| w.len() as u64 >= len)
    {
        Some(window) => {
            // SAFETY: the window covers `len` bytes; the caller holds the inventory's read side.
            dst.copy_from_slice(unsafe { window_bytes(&window, 0, len) });
            Ok(())
        }
        None => device.read(addr, dst),
    }
}

/// Write `src` into a host window at `offset`, with streaming stores if `streaming`.
///
/// # Safety
/// `offset + src.len() <= window.len()`, and the caller holds the inventory's read side for the
/// window's allocation, so the destination is valid and nothing else accesses it meanwhile.
unsafe fn window_write(window: &HostWindow, offset: u64, src: &[u8], streaming: bool) {
    debug_assert!(offset + src.len() as u64 <= window.len() as u64);
    // SAFETY: in bounds by the caller's promise; nothing else accesses these bytes while the
    // read side is held, and device memory never overlaps the snapshot store `src` lives in.
    let dst =
        unsafe { std::slice::from_raw_parts_mut(window.as_ptr().add(offset as usize), src.len()) };
    copy_bytes(dst, src, streaming);
}

/// Copies of at least this many bytes in all (one snapshot or restore) bypass the caches with
/// streaming stores: the destination would not fit in them anyway, and ordinary stores first
/// read every destination line (the C library's memcpy makes the same switch, but only for one
/// call of that size, never for the 1 MiB pieces the copies are split into).
pub(crate) const STREAMING_MIN_BYTES: u64 = 64 << 20;

/// Copy `src` into `dst` (same length) with the stores `streaming` asks for.
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8], streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if streaming && dst.len() >= 4096 {
            // SAFETY: SSE2 is part of x86-64; AVX2 only on the CPU's word.
            unsafe {
                if std::is_x86_feature_detected!("avx2") {
                    stream::copy_avx2(dst, src)
                } else {
                    stream::copy_sse2(dst, src)
                }
            };
            return;
        }
    }
    let _ = streaming;
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod stream {
    use std::arch::x86_64::*;

    /// Bytes before `dst` reaches `align`.
    fn head(dst: &[u8], align: usize) -> usize {
        (align - (dst.as_ptr() as usize % align)) % align
    }

    /// Streaming copy, 32-byte stores.
    ///
    /// # Safety
    /// AVX2 is available; `dst.len() == src.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_avx2(dst: &mut [u8], src: &[u8]) {
        debug_assert_eq!(dst.len(), src.len());
        let h = head(dst, 32).min(dst.len());
        dst[..h].copy_from_slice(&src[..h]);
        let body = (dst.len() - h) / 128 * 128;
        let (d, s) = (dst[h..].as_mut_ptr(), src[h..].as_ptr());
        let mut i = 0;
        while i < body {
            // SAFETY: [i, i + 128) lies inside both slices past the head; `d + i` is 32-byte
            // aligned (the head aligned it); source loads are unaligned.
            unsafe {
                let a = _mm256_loadu_si256(s.add(i).cast());
                let b = _mm256_loadu_si256(s.add(i + 32).cast());
                let c = _mm256_loadu_si256(s.add(i + 64).cast());
                let e = _mm256_loadu_si256(s.add(i + 96).cast());
                _mm256_stream_si256(d.add(i).cast(), a);
                _mm256_stream_si256(d.add(i + 32).cast(), b);
                _mm256_stream_si256(d.add(i + 64).cast(), c);
                _mm256_stream_si256(d.add(i + 96).cast(), e);
            }
            i += 128;
        }
        // Streaming stores are weakly ordered: fence them before anything that publishes the
        // copy to another thread.
        _mm_sfence();
        let t = h + body;
        dst[t..].copy_from_slice(&src[t..]);
    }

    /// Streaming copy, 16-byte stores.
    ///
    /// # Safety
    /// `dst.len() == src.len()`.
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn copy_sse2(dst: &mut [u8], src: &[u8]) {
        debug_assert_eq!(dst.len(), src.len());
        let h = head(dst, 16).min(dst.len());
        dst[..h].copy_from_slice(&src[..h]);
        let body = (dst.len() - h) / 64 * 64;
        let (d, s) = (dst[h..].as_mut_ptr(), src[h..].as_ptr());
        let mut i = 0;
        while i < body {
            // SAFETY: as in `copy_avx2`, with 16-byte alignment.
            unsafe {
                for k in (0..64).step_by(16) {
                    let v = _mm_loadu_si128(s.add(i + k).cast());
                    _mm_stream_si128(d.add(i + k).cast(), v);
                }
            }
            i += 64;
        }
        _mm_sfence();
        let t = h + body;
        dst[t..].copy_from_slice(&src[t..]);
    }
}

/// Chunks a hashing snapshot hashes before copying them: a group [`chunk_hashes`] hashes in
/// one loop, as long as the group fits in half of a core's L2 cache (256 KiB), where the copy
/// that follows finds it.
fn copy_group(chunk_size: u64) -> usize {
    ((256 << 10) / chunk_size.max(1)).clamp(1, GROUP as u64) as usize
}

/// Snapshot copy of every region of `layout` into host bytes `store` (laid out by
/// `layout.store_offset`), hashing each chunk right after copying it when `hashes` is given.
/// Returns the bytes copied.
pub(crate) fn copy_to_host(
    device: &dyn DeviceMemory,
    layout: &Layout,
    windows: &[Option<HostWindow>],
    store: &mut [u8],
    hashes: Option<&mut [u64]>,
) -> Result<u64, CopyError> {
    let live = vec![true; layout.regions.len()];
    let pieces = layout.full_pieces(&live);
    let dsts = split_ranges(store, pieces.iter().map(|p| layout.store_range(p)));
    let outs: Vec<Option<&mut [u64]>> = match hashes {
        Some(h) => split_ranges(h, pieces.iter().map(|p| layout.global(p)))
            .into_iter()
            .map(Some)
            .collect(),
        None => pieces.iter().map(|_| None).collect(),
    };
    let cs = layout.chunk_size;
    let streaming = layout.bytes >= STREAMING_MIN_BYTES;
    let items: Vec<_> = pieces.iter().zip(dsts).zip(outs).collect();
    crate::pool::map(items, |((p, dst), out)| {
        let (offset, len) = layout.piece_span(p);
        match (&windows[p.region], out) {
            (Some(w), Some(out)) => {
                // Hash then copy a few chunks at a time, so each chunk is read from memory
                // once (the copy finds it in cache, and streaming stores leave the store
                // out).
                let group = copy_group(cs);
                let span = cs as usize * group;
                for (i, (d, h)) in dst.chunks_mut(span).zip(out.chunks_mut(group)).enumerate() {
                    // SAFETY: the piece lies inside its region and the window covers the
                    // region; the caller holds the inventory's read side.
                    let s = unsafe { window_bytes(w, offset + (i * span) as u64, d.len() as u64) };
                    chunk_hashes(s, cs as usize, h);
                    copy_bytes(d, s, streaming);
                }
            }
            (Some(w), None) => {
                // SAFETY: as above.
                copy_bytes(dst, unsafe { window_bytes(w, offset, len) }, streaming);
            }
            (None, out) => {
                device.read(layout.regions[p.region].base + offset, dst)?;
                if let Some(out) = out {
                    chunk_hashes(dst, cs as usize, out);
                }
            }
        }
        Ok(())
    })
    .into_iter()
    .collect::<Result<(), CopyError>>()?;
    Ok(layout.bytes)
}

/// Copy `pieces` of memory through their regions' host windows into a host store (laid out by
/// `layout.store_offset`): what a snapshot of a footprint still followed copies (the pages
/// written since the last one). Pieces of a region without a window are left out. Returns the
/// bytes copied.
pub(crate) fn copy_pieces_to_host(
    layout: &Layout,
    windows: &[Option<HostWindow>],
    store: &mut [u8],
    pieces: &[Piece],
) -> u64 {
    let dsts = split_ranges(store, pieces.iter().map(|p| layout.store_range(p)));
    let items: Vec<_> = pieces.iter().zip(dsts).collect();
    crate::pool::map(items, |(p, dst)| {
        let Some(w) = &windows[p.region] else {
            return 0;
        };
        let (offset, len) = layout.piece_span(p);
        // SAFETY: the piece lies inside its region, which the window covers; the caller
        // holds the inventory's read side.
        dst.copy_from_slice(unsafe { window_bytes(w, offset, len) });
        len
    })
    .into_iter()
    .sum()
}

/// Hash every chunk of every region of `layout` as a host store holds it (`store`, laid out by
/// `layout.store_offset`) into `out` (indexed by global chunk): the hashes a hashing snapshot
/// would have taken of the same bytes. Returns the bytes hashed.
pub(crate) fn hash_store(layout: &Layout, store: &[u8], out: &mut [u64]) -> u64 {
    let all = vec![true; layout.regions.len()];
    let pieces = layout.full_pieces(&all);
    let outs = split_ranges(out, pieces.iter().map(|p| layout.global(p)));
    let cs = layout.chunk_size;
    crate::pool::map(pieces.iter().zip(outs).collect(), |(p, out)| {
        chunk_hashes(&store[layout.store_range(p)], cs as usize, out);
    });
    layout.bytes
}

/// Snapshot copy of every region into a device shadow at `shadow`, as one batched device copy.
pub(crate) fn copy_to_shadow(
    device: &dyn DeviceMemory,
    layout: &Layout,
    shadow: u64,
) -> Result<u64, CopyError> {
    let copies: Vec<DeviceCopy> = layout
        .regions
        .iter()
        .zip(&layout.store_offset)
        .map(|(r, &off)| DeviceCopy {
            dst: shadow + off,
            src: r.base,
            len: r.size,
        })
        .collect();
    if !copies.is_empty() {
        device.copy_on_device(&copies)?;
    }
    Ok(layout.bytes)
}

/// Hash every chunk of the live regions of device memory into `out` (indexed by global chunk;
/// entries of dead regions, and of chunks `skip` flags, hold no meaningful value afterwards):
/// the device hash kernel when offered (one batched call), else host windows, else reads into a
/// scratch buffer. Returns the bytes hashed.
pub(crate) fn hash_live(
    device: &dyn DeviceMemory,
    caps: Capabilities,
    layout: &Layout,
    live: &[bool],
    windows: &[Option<HostWindow>],
    out: &mut [u64],
    skip: Option<&[bool]>,
) -> Result<u64, CopyError> {
    let cs = layout.chunk_size;
    if caps.device_hash {
        // One call for every range: whole live regions, or the runs between the chunks `skip`
        // marks, found without visiting every chunk, so a device can hash all of them in one
        // launch. A range never spans two regions (a device may check that each range lies in
        // one allocation, and neighbouring allocations are often adjacent in the address space).
        let runs: Vec<(usize, usize, usize)> = match skip {
            None => (0..layout.regions.len())
                .filter(|&r| live[r])
                .map(|r| (r, 0, layout.region_chunks(r)))
                .collect(),
            Some(set) => layout.unmarked_runs(live, set),
        };
        let mut bytes = 0;
        let ranges: Vec<HashRange> = runs
            .into_iter()
            .map(|(r, first, count)| {
                let (offset, len) = layout.span(r, first, count);
                bytes += len;
                HashRange {
                    addr: layout.regions[r].base + offset,
                    len,
                    first: layout.first_chunk[r] + first,
                }
            })
            .collect();
        device.hash_chunk_ranges(&ranges, cs, out)?;
        return Ok(bytes);
    }
    let pieces = match skip {
        None => layout.full_pieces(live),
        Some(set) => layout.runs(live, |c| !set[c]),
    };
    let bytes = pieces.iter().map(|p| layout.piece_span(p).1).sum();
    let outs = split_ranges(out, pieces.iter().map(|p| layout.global(p)));
    let scratch_len = pieces
        .iter()
        .filter(|p| windows[p.region].is_none())
        .map(|p| layout.piece_span(p).1)
        .max()
        .unwrap_or(0) as usize;
    crate::pool::map_init(
        pieces.iter().zip(outs).collect(),
        Vec::new,
        |scratch: &mut Vec<u8>, (p, out)| {
            let (offset, len) = layout.piece_span(p);
            match &windows[p.region] {
                Some(w) => {
                    // Chunks of one piece in parallel too: hashing is CPU-bound per chunk.
                    crate::pool::map(
                        out.chunks_mut(MIN_CHUNKS_PER_JOB).enumerate().collect(),
                        |(i, h)| {
                            let start = (i * MIN_CHUNKS_PER_JOB) as u64 * cs;
                            let n = (cs * h.len() as u64).min(len - start);
                            // SAFETY: the chunks lie inside the piece, inside the region the
                            // window covers; the caller holds the inventory's read side.
                            chunk_hashes(
                                unsafe { window_bytes(w, offset + start, n) },
                                cs as usize,
                                h,
                            );
                        },
                    );
                }
                None => {
                    scratch.resize(scratch_len, 0);
                    let buf = &mut scratch[..len as usize];
                    device.read(layout.regions[p.region].base + offset, buf)?;
                    chunk_hashes(buf, cs as usize, out);
                }
            }
            Ok(())
        },
    )
    .into_iter()
    .collect::<Result<(), CopyError>>()?;
    Ok(bytes)
}

/// A hash restore through host windows in one pass: every chunk of the live regions is hashed
/// into `out` (indexed by global chunk) and, where its hash differs from `snapshot`'s, written
/// back from `store` (the host bytes of the snapshot, laid out by `layout.store_offset`) right
/// away, while the chunk just read is still in the cache: the write then costs a read of the
/// snapshot's bytes, not a second trip through memory for the live ones as well. Every live
/// region must have a window (the caller checks). Returns the bytes hashed and the bytes written
/// back; which chunks changed is in `out` against `snapshot`, as after [`hash_live`].
pub(crate) fn hash_and_restore(
    layout: &Layout,
    live: &[bool],
    windows: &[Option<HostWindow>],
    store: &[u8],
    snapshot: &[u64],
    out: &mut [u64],
) -> (u64, u64) {
    let cs = layout.chunk_size;
    let pieces = layout.full_pieces(live);
    let hashed = pieces.iter().map(|p| layout.piece_span(p).1).sum();
    let outs = split_ranges(out, pieces.iter().map(|p| layout.global(p)));
    let written = crate::pool::map(pieces.iter().zip(outs).collect(), |(p, out)| {
        let Some(w) = &windows[p.region] else {
            return 0;
        };
        let (offset, len) = layout.piece_span(p);
        let first = layout.global(p).start;
        let store_start = layout.store_range(p).start as u64;
        crate::pool::map(
            out.chunks_mut(MIN_CHUNKS_PER_JOB).enumerate().collect(),
            |(i, h)| {
                let job = i * MIN_CHUNKS_PER_JOB;
                let start = job as u64 * cs;
                let n = (cs * h.len() as u64).min(len - start);
                // SAFETY: the chunks lie inside the piece, inside the region the window
                // covers; the caller holds the inventory's read side. The slice is gone
                // before anything below writes to the same bytes.
                chunk_hashes(
                    unsafe { window_bytes(w, offset + start, n) },
                    cs as usize,
                    h,
                );
                let mut written = 0;
                for (k, hash) in h.iter().enumerate() {
                    if *hash == snapshot[first + job + k] {
                        continue;
                    }
                    let at = start + k as u64 * cs;
                    let bytes = cs.min(len - at);
                    let src = (store_start + at) as usize;
                    // SAFETY: the chunk lies inside the window, as above; no slice of it
                    // lives any more, and the store never overlaps device memory.
                    unsafe {
                        window_write(w, offset + at, &store[src..src + bytes as usize], false)
                    };
                    written += bytes;
                }
                written
            },
        )
        .into_iter()
        .sum::<u64>()
    })
    .into_iter()
    .sum();
    (hashed, written)
}

/// A verified restore done by the device in one operation ([`DeviceMemory::restore_verified`]):
/// the chunks of the live regions that `skip` does not mark are hashed and written back where
/// they differ from the snapshot, the marked ones (a learned write set) are written unhashed.
/// Returns the bytes hashed and the global indices of the chunks found changed, in order.
/// `Err(Unsupported)`: nothing was done (the device cannot, or cannot read this store).
/// `ranges` is the list handed to the device, kept by the caller between restores: with a
/// learned set of 10% of 32 GiB it holds 100 Ki ranges (4 MB), and on the development machine
/// allocating lists that size afresh for every restore cost more in page faults than building
/// them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_on_device(
    device: &dyn DeviceMemory,
    layout: &Layout,
    live: &[bool],
    store: &Store,
    skip: Option<&[bool]>,
    snapshot: (&[u64], u64),
    ranges: &mut Vec<VerifyRange>,
) -> Result<(u64, Vec<usize>), CopyError> {
    let (hashes, snapshot_id) = snapshot;
    if hashes.len() != layout.chunks() {
        return Err(CopyError::Unsupported);
    }
    let range = |r: usize, first: usize, count: usize, write: bool| {
        let (offset, len) = layout.span(r, first, count);
        VerifyRange {
            addr: layout.regions[r].base + offset,
            len,
            store_offset: layout.store_offset[r] + offset,
            first: layout.first_chunk[r] + first,
            write,
        }
    };
    ranges.clear();
    match skip {
        None => ranges.extend(
            (0..layout.regions.len())
                .filter(|&r| live[r])
                .map(|r| range(r, 0, layout.region_chunks(r), false)),
        ),
        Some(set) => layout.for_unmarked_runs(live, set, |r, first, count| {
            ranges.push(range(r, first, count, false))
        }),
    }
    let bytes_hashed = ranges.iter().map(|r| r.len).sum();
    if let Some(set) = skip {
        layout.for_runs_of(live, marked_indices(set), |p| {
            ranges.push(range(p.region, p.first, p.count, true))
        });
    }
    let job = VerifiedRestore {
        ranges,
        store: match store.device_addr() {
            Some(shadow) => StoreBytes::Device(shadow),
            None => StoreBytes::Host(store.bytes()),
        },
        chunk_size: layout.chunk_size,
        hashes,
        snapshot_id,
    };
    let mut bits = vec![0u64; layout.chunks().div_ceil(64)];
    device.restore_verified(&job, &mut bits)?;
    Ok((bytes_hashed, set_bits(&bits, hashes.len(), skip)))
}

/// Global indices of the bits set in `bits` (bit `c % 64` of word `c / 64`) below `chunks`, in
/// order, leaving out the chunks `skip` marks. Visits set bits only: at 1% of 32 GiB changed,
/// testing all 64 bits of every word that has one cost more host time than the write-back of
/// the changed chunks on the device.
fn set_bits(bits: &[u64], chunks: usize, skip: Option<&[bool]>) -> Vec<usize> {
    // Sized once: grown by doubling, the list was copied a dozen times at 1% of 32 GiB.
    let mut out = Vec::with_capacity(bits.iter().map(|w| w.count_ones() as usize).sum());
    for (i, &word) in bits.iter().enumerate() {
        let mut w = word;
        while w != 0 {
            let c = i * 64 + w.trailing_zeros() as usize;
            w &= w - 1;
            if c < chunks && skip.is_none_or(|set| !set[c]) {
                out.push(c);
            }
        }
    }
    out
}

/// What writing pieces back did.
#[derive(Debug, Default)]
pub(crate) struct WriteOutcome {
    pub bytes: u64,
    pub chunks: u64,
    pub lost_bytes: u64,
    pub lost_chunks: u64,
    pub error: Option<CopyError>,
}

impl WriteOutcome {
    /// `bytes` in `chunks` chunks already written (by a device's verified restore).
    pub(crate) fn totals(bytes: u64, chunks: u64) -> Self {
        WriteOutcome {
            bytes,
            chunks,
            ..WriteOutcome::default()
        }
    }

    /// `pieces` already written (by a device's verified restore).
    pub(crate) fn written(layout: &Layout, pieces: &[Piece]) -> Self {
        let mut outcome = WriteOutcome::default();
        for p in pieces {
            outcome.record(layout.piece_span(p).1, p.count, Ok(()));
        }
        outcome
    }

    fn record(&mut self, bytes: u64, chunks: usize, result: Result<(), CopyError>) {
        match result {
            Ok(()) => {
                self.bytes += bytes;
                self.chunks += chunks as u64;
            }
            Err(e) => {
                self.lost_bytes += bytes;
                self.lost_chunks += chunks as u64;
                self.error.get_or_insert(e);
            }
        }
    }
}

/// Write `pieces` back from the store to device memory: one batched device copy for a device
/// store; otherwise plain parallel copies through host windows, and for the rest one batched
/// write (if the device batches) or parallel writes.
pub(crate) fn write_back(
    device: &dyn DeviceMemory,
    caps: Capabilities,
    layout: &Layout,
    windows: &[Option<HostWindow>],
    store: &Store,
    pieces: &[Piece],
) -> WriteOutcome {
    let mut outcome = WriteOutcome::default();
    if pieces.is_empty() {
        return outcome;
    }
    let total = |ps: &[&Piece]| -> (u64, usize) {
        ps.iter().fold((0, 0), |(b, c), p| {
            (b + layout.piece_span(p).1, c + p.count)
        })
    };
    if let Some(shadow) = store.device_addr() {
        // Pieces that continue each other within one region are one copy (a full restore is
        // then one copy per region instead of one per 1 MiB piece).
        let mut copies: Vec<DeviceCopy> = Vec::new();
        let mut last_region = usize::MAX;
        for p in pieces {
            let (offset, len) = layout.piece_span(p);
            let dst = layout.regions[p.region].base + offset;
            match copies.last_mut() {
                Some(c) if last_region == p.region && c.dst + c.len == dst => c.len += len,
                _ => copies.push(DeviceCopy {
                    dst,
                    src: shadow + layout.store_offset[p.region] + offset,
                    len,
                }),
            }
            last_region = p.region;
        }
        let all: Vec<&Piece> = pieces.iter().collect();
        let (bytes, chunks) = total(&all);
        outcome.record(bytes, chunks, device.copy_on_device(&copies));
        return outcome;
    }
    let src = store.bytes();
    let (direct, via_device): (Vec<&Piece>, Vec<&Piece>) =
        pieces.iter().partition(|p| windows[p.region].is_some());
    if !direct.is_empty() {
        let streaming = total(&direct).0 >= STREAMING_MIN_BYTES;
        crate::pool::map(direct.clone(), |p| {
            let (offset, _) = layout.piece_span(p);
            if let Some(w) = &windows[p.region] {
                // SAFETY: the piece lies inside its region, which the window covers; the caller
                // holds the inventory's read side.
                unsafe { window_write(w, offset, &src[layout.store_range(p)], streaming) };
            }
        });
        let (bytes, chunks) = total(&direct);
        outcome.record(bytes, chunks, Ok(()));
    }
    if via_device.is_empty() {
        return outcome;
    }
    if caps.batched_writes {
        let writes: Vec<ChunkWrite<'_>> = via_device
            .iter()
            .map(|p| ChunkWrite {
                addr: layout.regions[p.region].base + layout.piece_span(p).0,
                data: &src[layout.store_range(p)],
            })
            .collect();
        let (bytes, chunks) = total(&via_device);
        outcome.record(bytes, chunks, device.write_batch(&writes));
    } else {
        let results = crate::pool::map(via_device, |p| {
            let (offset, len) = layout.piece_span(p);
            let base = layout.regions[p.region].base;
            (
                len,
                p.count,
                device.write(base + offset, &src[layout.store_range(p)]),
            )
        });
        for (bytes, chunks, result) in results {
            outcome.record(bytes, chunks, result);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::set_bits;

    #[test]
    fn set_bits_lists_every_set_bit_below_the_chunk_count_in_order_except_skipped_ones() {
        let mut bits = vec![0u64; 3];
        for c in [0, 1, 63, 64, 100, 127, 128, 130, 150] {
            bits[c / 64] |= 1 << (c % 64);
        }
        // Chunks 0..140: bit 150 lies past the last chunk.
        assert_eq!(
            set_bits(&bits, 140, None),
            vec![0, 1, 63, 64, 100, 127, 128, 130]
        );
        let mut skip = vec![false; 140];
        skip[63] = true;
        skip[128] = true;
        assert_eq!(
            set_bits(&bits, 140, Some(&skip)),
            vec![0, 1, 64, 100, 127, 130]
        );
        assert!(set_bits(&[0, 0], 128, None).is_empty());
        assert_eq!(set_bits(&[u64::MAX], 64, None), (0..64).collect::<Vec<_>>());
    }
}
