//! The device kernels on a real GPU: the chunk hash equals the host's xxh3_64, and every
//! device-tier restore strategy leaves memory as one run of an `x += 1` kernel that writes a
//! chosen fraction of it. Skipped, with the reason printed, where no driver or GPU is present.
//!
//! `KREPLAY_CUDA_TEST_PTX=<file>` runs them on a PTX file instead of the committed one (for a
//! kernel rebuilt on the GPU machine before its PTX is committed).

use std::sync::Arc;

use kreplay_cuda::driver::{CuContext, CuDevicePtr};
use kreplay_cuda::kernels::{self, override_ptx};
use kreplay_cuda::{CudaMemory, Driver, ShadowBudget};
use kreplay_snapshot::{
    DeviceMemory, Filter, HashRange, Inventory, MemoryKind, NewAllocation, RestoreRequest,
    RestoreStrategy, SnapshotConfig, Snapshotter, StoreBytes, StoreTier, VerifiedRestore,
    VerifyRange,
};
use xxhash_rust::xxh3::xxh3_64;

fn gpu() -> Option<&'static Driver> {
    if let Ok(path) = std::env::var("KREPLAY_CUDA_TEST_PTX") {
        let text = std::fs::read_to_string(&path).expect("KREPLAY_CUDA_TEST_PTX names a file");
        override_ptx(text);
    }
    match Driver::get() {
        Ok(d) if d.device_count().unwrap_or(0) > 0 => Some(d),
        Ok(_) => {
            eprintln!("skipped: the CUDA driver reports no device");
            None
        }
        Err(e) => {
            eprintln!("skipped: no CUDA driver here ({e})");
            None
        }
    }
}

fn context(d: &'static Driver) -> CuContext {
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: retains device 0's primary context (kept for the test process).
    unsafe {
        d.check("retain", (d.primary_ctx_retain)(&mut ctx, 0))
            .unwrap();
        d.make_current(ctx).unwrap();
    }
    ctx
}

fn alloc(d: &Driver, bytes: usize) -> CuDevicePtr {
    let mut p: CuDevicePtr = 0;
    // SAFETY: allocates in the current context.
    unsafe { d.check("alloc", (d.mem_alloc)(&mut p, bytes)).unwrap() };
    p
}

/// Deterministic pseudo-random bytes.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn memory(d: &'static Driver, ctx: CuContext, inventory: Arc<Inventory>) -> Arc<CudaMemory> {
    // SAFETY: the primary context retained above, alive for the test process.
    unsafe {
        CudaMemory::new(
            d,
            inventory,
            ctx,
            ShadowBudget::default(),
            StoreTier::Device,
        )
    }
    .unwrap()
}

#[test]
fn device_chunk_hashes_equal_the_host_xxh3_of_every_chunk() {
    let Some(d) = gpu() else { return };
    let ctx = context(d);
    let size = (4 << 20) + 4096;
    let host = noise(size, 0x5eed);
    let buf = alloc(d, size);
    let mem = memory(d, ctx, Arc::new(Inventory::new()));
    mem.write(buf, &host).unwrap();
    assert!(mem.capabilities().device_hash, "kernels did not load");
    // (offset into the buffer, length, chunk size): whole blocks, partial last blocks, a last
    // stripe that is not 8-byte aligned, short tails for the host path, unaligned starts.
    // The last two: 8192 chunks (groups of 8 lanes per chunk) and 8191 (a warp per chunk, see
    // `kernels::lanes_for`).
    let cases: [(usize, usize, usize); 11] = [
        (0, 4 << 20, 64 << 10),
        (0, (4 << 20) + 100, 64 << 10),
        (0, (1 << 20) + 241, 64 << 10),
        (0, (1 << 20) + 240, 64 << 10),
        (0, 3 * 1024 + 777, 512),
        (0, 1025, 1024),
        (3, (2 << 20) + 13, 4096),
        (8, 300, 512),
        (16, 65, 512),
        (0, 4 << 20, 512),
        (8, (4 << 20) - 512 - 435, 512),
    ];
    for (off, len, cs) in cases {
        let chunks = len.div_ceil(cs);
        let mut got = vec![0u64; chunks];
        mem.hash_chunks(buf + off as u64, len as u64, cs as u64, &mut got)
            .unwrap();
        let want: Vec<u64> = host[off..off + len].chunks(cs).map(xxh3_64).collect();
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            wrong, 0,
            "offset {off}, {len} bytes in {cs}-byte chunks: {wrong} of {chunks} hashes differ"
        );
    }
    // A wrong-sized output is an error, not a partial answer.
    let mut short = vec![0u64; 1];
    assert!(mem.hash_chunks(buf, 1 << 20, 64 << 10, &mut short).is_err());
    drop(mem);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
}

#[test]
fn one_batched_hash_of_many_ranges_equals_the_host_xxh3_of_each_chunk() {
    let Some(d) = gpu() else { return };
    let ctx = context(d);
    let size = 8 << 20;
    let host = noise(size, 0xba7c);
    let buf = alloc(d, size);
    let mem = memory(d, ctx, Arc::new(Inventory::new()));
    mem.write(buf, &host).unwrap();
    let cs = 64usize << 10;
    // (offset, length, first output index): whole chunks, a range ending in a short tail (host
    // path), one ending in a partial block, an unaligned one, and holes in the output between.
    let ranges = [
        (0usize, 16 * cs, 0usize),
        (20 * cs, 3 * cs + 100, 18),
        (30 * cs, 2 * cs + 5000, 24),
        (40 * cs + 8, cs + 4096, 40),
        (100 * cs, 1, 50),
    ];
    let total = 51;
    let sentinel = 0x5151_5151_5151_5151u64;
    let mut got = vec![sentinel; total];
    let batch: Vec<HashRange> = ranges
        .iter()
        .map(|&(off, len, first)| HashRange {
            addr: buf + off as u64,
            len: len as u64,
            first,
        })
        .collect();
    mem.hash_chunk_ranges(&batch, cs as u64, &mut got).unwrap();
    for &(off, len, first) in &ranges {
        for (k, chunk) in host[off..off + len].chunks(cs).enumerate() {
            assert_eq!(
                got[first + k],
                xxh3_64(chunk),
                "range at {off} ({len} bytes), chunk {k}"
            );
        }
    }
    // An output too short for the ranges is an error.
    let mut short = vec![0u64; 10];
    assert!(
        mem.hash_chunk_ranges(&batch, cs as u64, &mut short)
            .is_err()
    );
    drop(mem);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
}

#[test]
fn one_verified_restore_launch_writes_back_exactly_the_changed_chunks_from_either_store() {
    let Some(d) = gpu() else { return };
    let ctx = context(d);
    let cs = 64usize << 10;
    // Twelve whole chunks and a 100-byte last one (compared byte for byte on the device).
    let size = 12 * cs + 100;
    let snap = noise(size, 0xf00d);
    // The host's xxh3 of every chunk: an unchanged chunk must hash to exactly this on the GPU.
    let hashes: Vec<u64> = snap.chunks(cs).map(xxh3_64).collect();
    let buf = alloc(d, size);
    let shadow = alloc(d, size);
    let mem = memory(d, ctx, Arc::new(Inventory::new()));
    assert!(
        mem.capabilities().verified_restore,
        "kreplay_restore_verified did not load"
    );
    mem.write(shadow, &snap).unwrap();
    // A page-aligned host copy, registered as the snapshot crate registers its stores.
    let mut backing = vec![0u8; size + 4096];
    let at = backing.as_ptr().align_offset(4096);
    let pinned = &mut backing[at..at + size];
    pinned.copy_from_slice(&snap);
    let pinned = &*pinned;
    assert!(mem.register_host(pinned.as_ptr(), pinned.len()));
    let unpinned = snap.clone();
    let c = cs as u64;
    // Chunks 0..8 and 10..13 are verified, 8..10 are a learned write set.
    let ranges = [
        VerifyRange {
            addr: buf,
            len: 8 * c,
            store_offset: 0,
            first: 0,
            write: false,
        },
        VerifyRange {
            addr: buf + 8 * c,
            len: 2 * c,
            store_offset: 8 * c,
            first: 8,
            write: true,
        },
        VerifyRange {
            addr: buf + 10 * c,
            len: 2 * c + 100,
            store_offset: 10 * c,
            first: 10,
            write: false,
        },
    ];
    let stores = [
        ("device shadow", StoreBytes::Device(shadow), 1),
        ("pinned host", StoreBytes::Host(pinned), 2),
    ];
    for (name, store, snapshot_id) in stores {
        // Twice with the same snapshot: the second uses the hashes the device kept.
        for round in 0..2u8 {
            let mut live = snap.clone();
            for chunk in [1usize, 5, 8, 11] {
                live[chunk * cs + 7 + usize::from(round)] ^= 0x5a;
            }
            live[12 * cs + 99] ^= 1;
            mem.write(buf, &live).unwrap();
            let job = VerifiedRestore {
                ranges: &ranges,
                store,
                chunk_size: c,
                hashes: &hashes,
                snapshot_id,
            };
            let mut changed = vec![0u64; 1];
            mem.restore_verified(&job, &mut changed).unwrap();
            // Chunk 8 lies in the write set: written back, never reported.
            assert_eq!(
                changed[0],
                (1 << 1) | (1 << 5) | (1 << 11) | (1 << 12),
                "{name}, round {round}: changed chunks {:#b}",
                changed[0]
            );
            let mut out = vec![0u8; size];
            mem.read(buf, &mut out).unwrap();
            let wrong = out.iter().zip(&snap).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "{name}, round {round}: {wrong} bytes differ");
        }
    }
    // A host store the device cannot read is refused untouched, for the two-step path.
    let job = VerifiedRestore {
        ranges: &ranges,
        store: StoreBytes::Host(&unpinned),
        chunk_size: c,
        hashes: &hashes,
        snapshot_id: 3,
    };
    let mut changed = vec![0u64; 1];
    assert_eq!(
        mem.restore_verified(&job, &mut changed),
        Err(kreplay_snapshot::CopyError::Unsupported)
    );
    mem.unregister_host(pinned.as_ptr(), pinned.len());
    drop(mem);
    // SAFETY: our allocations, no longer used.
    unsafe {
        (d.mem_free)(buf);
        (d.mem_free)(shadow);
    }
}

#[test]
fn a_verified_restore_finds_the_same_chunks_with_a_warp_or_eight_lanes_per_chunk() {
    let Some(d) = gpu() else { return };
    let ctx = context(d);
    let cs = 512usize;
    let mem = memory(d, ctx, Arc::new(Inventory::new()));
    assert!(mem.capabilities().verified_restore);
    // 8191 chunks take the wide kernel, 8193 (the last one short) the narrow one.
    for chunks in [
        kernels::WIDE_BELOW_CHUNKS as usize - 1,
        kernels::WIDE_BELOW_CHUNKS as usize + 1,
    ] {
        let size = (chunks - 1) * cs + 100;
        let snap = noise(size, chunks as u64);
        let hashes: Vec<u64> = snap.chunks(cs).map(xxh3_64).collect();
        let buf = alloc(d, size);
        let shadow = alloc(d, size);
        mem.write(shadow, &snap).unwrap();
        let mut live = snap.clone();
        let touched = [0usize, 1, 63, 64, 4000, chunks - 2, chunks - 1];
        for &c in &touched {
            live[c * cs + (c % 97).min(99)] ^= 0x81;
        }
        mem.write(buf, &live).unwrap();
        let ranges = [VerifyRange {
            addr: buf,
            len: size as u64,
            store_offset: 0,
            first: 0,
            write: false,
        }];
        let job = VerifiedRestore {
            ranges: &ranges,
            store: StoreBytes::Device(shadow),
            chunk_size: cs as u64,
            hashes: &hashes,
            snapshot_id: 100 + chunks as u64,
        };
        let mut changed = vec![0u64; chunks.div_ceil(64)];
        mem.restore_verified(&job, &mut changed).unwrap();
        let mut want = vec![0u64; chunks.div_ceil(64)];
        for &c in &touched {
            want[c / 64] |= 1 << (c % 64);
        }
        assert_eq!(changed, want, "{chunks} chunks: changed chunks differ");
        let mut out = vec![0u8; size];
        mem.read(buf, &mut out).unwrap();
        let wrong = out.iter().zip(&snap).filter(|(a, b)| a != b).count();
        assert_eq!(wrong, 0, "{chunks} chunks: {wrong} bytes differ");
        // SAFETY: our allocations, no longer used.
        unsafe {
            (d.mem_free)(buf);
            (d.mem_free)(shadow);
        }
    }
}

/// Four passes of `x += 1` over `fraction` of a 64 MiB buffer (evenly spread 64 KiB runs), with
/// the snapshot and restores of `strategy` on a device shadow between passes, as the pass loop
/// does them. Returns (wrong words, bytes written by each pass, bytes moved by each restore,
/// bytes hashed by each restore).
fn four_passes(
    d: &'static Driver,
    ctx: CuContext,
    strategy: RestoreStrategy,
    fraction: f64,
) -> (usize, u64, Vec<u64>, Vec<u64>) {
    const BYTES: usize = 64 << 20;
    const CHUNK: u64 = 64 << 10;
    let words = BYTES / 4;
    let buf = alloc(d, BYTES);
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: buf,
        size: BYTES as u64,
        owner_agent: 0,
        kind: MemoryKind::CoarseDevice,
    });
    let mem = memory(d, ctx, inventory.clone());
    let start: Vec<u32> = (0..words as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    let start_bytes: Vec<u8> = start.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.write(buf, &start_bytes).unwrap();

    let chunks = BYTES as u64 / CHUNK;
    let dirty = ((chunks as f64 * fraction).round() as u64).clamp(1, chunks);
    let stride = chunks / dirty;
    let run_words = CHUNK / 4;
    let config = SnapshotConfig::default()
        .with_store(StoreTier::Device)
        .with_strategy(strategy)
        .with_chunk_size(CHUNK)
        .with_verify_every(0);
    let snapshotter = Snapshotter::new(inventory, mem.clone(), config).unwrap();
    let mut snap = snapshotter.snapshot(&Filter::for_replay(0)).unwrap();
    let kernels = mem.kernels().unwrap();
    let touch = || {
        // SAFETY: every run lies in buf (dirty * stride <= chunks); we wait right after.
        unsafe {
            kernels
                .add_one_runs(d, mem.stream(), buf, dirty, run_words, stride * run_words)
                .unwrap();
            d.check("sync", (d.stream_synchronize)(mem.stream()))
                .unwrap();
        }
    };
    let (mut moved, mut hashed) = (Vec::new(), Vec::new());
    for pass in 0..4u64 {
        touch();
        if pass < 3 {
            let report = snap
                .restore(&RestoreRequest {
                    next_pass: pass + 1,
                    may_be_final: pass + 1 == 3,
                })
                .unwrap();
            moved.push(report.bytes_moved);
            hashed.push(report.bytes_hashed);
        }
    }
    drop(snap);
    drop(snapshotter);
    let mut out = vec![0u8; BYTES];
    mem.read(buf, &mut out).unwrap();
    let touched = |w: usize| {
        let c = w as u64 / run_words;
        c.is_multiple_of(stride) && c / stride < dirty
    };
    let wrong = out
        .chunks(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .enumerate()
        .filter(|&(i, v)| v != start[i].wrapping_add(u32::from(touched(i))))
        .count();
    drop(mem);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
    (wrong, dirty * CHUNK, moved, hashed)
}

#[test]
fn every_device_strategy_leaves_memory_as_one_run_of_the_kernel() {
    let Some(d) = gpu() else { return };
    let ctx = context(d);
    let all = 64u64 << 20;
    for strategy in [
        RestoreStrategy::Full,
        RestoreStrategy::Hash,
        RestoreStrategy::Writeset,
        RestoreStrategy::WritesetUnverified,
        RestoreStrategy::Auto,
    ] {
        for fraction in [0.01, 0.1, 1.0] {
            let (wrong, written, moved, hashed) = four_passes(d, ctx, strategy, fraction);
            eprintln!(
                "{strategy} {fraction}: {wrong} wrong words, moved {moved:?}, hashed {hashed:?}"
            );
            assert_eq!(wrong, 0, "{strategy} at {fraction}");
            match strategy {
                RestoreStrategy::Full => assert_eq!(moved, [all; 3]),
                // Detection on the device: every restore hashes all and moves what changed.
                RestoreStrategy::Hash => {
                    assert_eq!(hashed, [all; 3], "{strategy}");
                    assert_eq!(moved, [written; 3], "{strategy}");
                }
                // The verified write set learns on the first restore (hashing all), then writes
                // the learned set unhashed and hashes every other chunk.
                RestoreStrategy::Writeset => {
                    assert_eq!(hashed, [all, all - written, all - written], "{strategy}");
                    assert_eq!(moved, [written; 3], "{strategy}");
                }
                // Learns on the first restore, writes the learned set unhashed on the second,
                // verifies before the final pass.
                RestoreStrategy::WritesetUnverified => {
                    assert_eq!(hashed, [all, 0, all]);
                    assert_eq!(moved, [written; 3]);
                }
                _ => {}
            }
        }
    }
}
