//! Parallel copy and hash primitives over a [`Layout`]. Callers hold the inventory's read side
//! for the duration of every function here, so every live region stays allocated.

use crate::hash::chunk_hash;
use rayon::prelude::*;

use crate::device::{Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HostWindow};
use crate::layout::{Layout, Piece, split_ranges};
use crate::store::Store;

/// Chunks hashed per rayon job at minimum when hashing through host windows.
const MIN_CHUNKS_PER_JOB: usize = 8;

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

/// Write `src` into a host window at `offset`.
///
/// # Safety
/// `offset + src.len() <= window.len()`, and the caller holds the inventory's read side for the
/// window's allocation, so the destination is valid and nothing else accesses it meanwhile.
unsafe fn window_write(window: &HostWindow, offset: u64, src: &[u8]) {
    debug_assert!(offset + src.len() as u64 <= window.len() as u64);
    // SAFETY: in bounds by the caller's promise; the destination is device memory, which never
    // overlaps the snapshot store `src` lives in.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr(),
            window.as_ptr().add(offset as usize),
            src.len(),
        )
    }
}

/// Hash each `chunk_size` chunk of `bytes` into `out`.
fn hash_chunks_into(bytes: &[u8], chunk_size: u64, out: &mut [u64]) {
    for (h, chunk) in out.iter_mut().zip(bytes.chunks(chunk_size as usize)) {
        *h = chunk_hash(chunk);
    }
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
    pieces
        .par_iter()
        .zip(dsts)
        .zip(outs)
        .try_for_each(|((p, dst), out)| {
            let (offset, len) = layout.piece_span(p);
            match (&windows[p.region], out) {
                (Some(w), Some(out)) => {
                    // Copy then hash chunk by chunk, so each chunk is hashed while in cache.
                    for (i, (d, h)) in dst.chunks_mut(cs as usize).zip(out).enumerate() {
                        // SAFETY: the piece lies inside its region and the window covers the
                        // region; the caller holds the inventory's read side.
                        let s = unsafe { window_bytes(w, offset + i as u64 * cs, d.len() as u64) };
                        d.copy_from_slice(s);
                        *h = chunk_hash(d);
                    }
                }
                (Some(w), None) => {
                    // SAFETY: as above.
                    dst.copy_from_slice(unsafe { window_bytes(w, offset, len) });
                }
                (None, out) => {
                    device.read(layout.regions[p.region].base + offset, dst)?;
                    if let Some(out) = out {
                        hash_chunks_into(dst, cs, out);
                    }
                }
            }
            Ok(())
        })?;
    Ok(layout.bytes)
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
/// entries of dead regions are left alone): the device hash kernel when offered, else host
/// windows, else reads into a scratch buffer. Returns the bytes hashed.
pub(crate) fn hash_live(
    device: &dyn DeviceMemory,
    caps: Capabilities,
    layout: &Layout,
    live: &[bool],
    windows: &[Option<HostWindow>],
    out: &mut [u64],
) -> Result<u64, CopyError> {
    let cs = layout.chunk_size;
    let live_regions: Vec<usize> = (0..layout.regions.len()).filter(|&r| live[r]).collect();
    let bytes = live_regions.iter().map(|&r| layout.regions[r].size).sum();
    if caps.device_hash {
        let outs = split_ranges(
            out,
            live_regions
                .iter()
                .map(|&r| layout.first_chunk[r]..layout.first_chunk[r + 1]),
        );
        live_regions
            .par_iter()
            .zip(outs)
            .try_for_each(|(&r, out)| {
                let region = &layout.regions[r];
                device.hash_chunks(region.base, region.size, cs, out)
            })?;
        return Ok(bytes);
    }
    let pieces = layout.full_pieces(live);
    let outs = split_ranges(out, pieces.iter().map(|p| layout.global(p)));
    let scratch_len = pieces
        .iter()
        .filter(|p| windows[p.region].is_none())
        .map(|p| layout.piece_span(p).1)
        .max()
        .unwrap_or(0) as usize;
    pieces.par_iter().zip(outs).try_for_each_init(
        Vec::new,
        |scratch: &mut Vec<u8>, (p, out)| {
            let (offset, len) = layout.piece_span(p);
            match &windows[p.region] {
                Some(w) => {
                    // Chunks of one piece in parallel too: hashing is CPU-bound per chunk.
                    out.par_iter_mut()
                        .enumerate()
                        .with_min_len(MIN_CHUNKS_PER_JOB)
                        .for_each(|(i, h)| {
                            let start = i as u64 * cs;
                            let n = cs.min(len - start);
                            // SAFETY: the chunk lies inside the piece, inside the region the
                            // window covers; the caller holds the inventory's read side.
                            *h = chunk_hash(unsafe { window_bytes(w, offset + start, n) });
                        });
                }
                None => {
                    scratch.resize(scratch_len, 0);
                    let buf = &mut scratch[..len as usize];
                    device.read(layout.regions[p.region].base + offset, buf)?;
                    hash_chunks_into(buf, cs, out);
                }
            }
            Ok(())
        },
    )?;
    Ok(bytes)
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
        let copies: Vec<DeviceCopy> = pieces
            .iter()
            .map(|p| {
                let (offset, len) = layout.piece_span(p);
                DeviceCopy {
                    dst: layout.regions[p.region].base + offset,
                    src: shadow + layout.store_offset[p.region] + offset,
                    len,
                }
            })
            .collect();
        let all: Vec<&Piece> = pieces.iter().collect();
        let (bytes, chunks) = total(&all);
        outcome.record(bytes, chunks, device.copy_on_device(&copies));
        return outcome;
    }
    let src = store.bytes();
    let (direct, via_device): (Vec<&Piece>, Vec<&Piece>) =
        pieces.iter().partition(|p| windows[p.region].is_some());
    if !direct.is_empty() {
        direct.par_iter().for_each(|p| {
            let (offset, _) = layout.piece_span(p);
            if let Some(w) = &windows[p.region] {
                // SAFETY: the piece lies inside its region, which the window covers; the caller
                // holds the inventory's read side.
                unsafe { window_write(w, offset, &src[layout.store_range(p)]) };
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
        let results: Vec<(u64, usize, Result<(), CopyError>)> = via_device
            .par_iter()
            .map(|p| {
                let (offset, len) = layout.piece_span(p);
                let base = layout.regions[p.region].base;
                (
                    len,
                    p.count,
                    device.write(base + offset, &src[layout.store_range(p)]),
                )
            })
            .collect();
        for (bytes, chunks, result) in results {
            outcome.record(bytes, chunks, result);
        }
    }
    outcome
}
