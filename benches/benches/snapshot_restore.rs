//! Criterion benches of snapshot and restore, with a memcpy of the same bytes as the ceiling in
//! every group.
//!
//! Default footprints: 16 MiB and 64 MiB. The feature `large` or `KREPLAY_BENCH_LARGE=1` adds
//! 256 MiB, 1 GiB and 4 GiB (several GiB of memory and much longer runs).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use kreplay_benches::{ChunkMap, HostDevice, HostDeviceOptions, format_bytes, format_percent};
use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, RestoreRequest, RestoreStrategy, SnapshotConfig, Snapshotter,
    StoreTier,
};
use xxhash_rust::xxh3::xxh3_64;

const MIB: u64 = 1 << 20;
const DIRTY: [f64; 4] = [0.0, 0.01, 0.1, 1.0];
const NOT_FINAL: RestoreRequest = RestoreRequest {
    next_pass: 1,
    may_be_final: false,
};

fn footprints() -> Vec<u64> {
    let mut v = vec![16 * MIB, 64 * MIB];
    let large = cfg!(feature = "large")
        || std::env::var("KREPLAY_BENCH_LARGE").is_ok_and(|v| v != "0" && !v.is_empty());
    if large {
        v.extend([256 * MIB, 1024 * MIB, 4096 * MIB]);
    }
    v
}

struct Setup {
    device: Arc<HostDevice>,
    inventory: Arc<Inventory>,
    map: ChunkMap,
}

fn setup(footprint: u64) -> Setup {
    // SAFETY: the benches run one operation at a time: nothing touches device memory while a
    // snapshot or restore runs, and nothing is freed meanwhile.
    let device = Arc::new(unsafe { HostDevice::with_host_windows(HostDeviceOptions::all()) });
    let inventory = Arc::new(Inventory::new());
    for i in 0..4 {
        let addr = device
            .alloc_tracked(&inventory, footprint / 4, 1, MemoryKind::CoarseDevice)
            .expect("bench allocation");
        device.fill(addr, footprint / 4, i).expect("fill");
    }
    let regions = inventory.select(&Filter::for_replay(1));
    let map = ChunkMap::new(&regions, kreplay_snapshot::DEFAULT_CHUNK_SIZE);
    Setup {
        device,
        inventory,
        map,
    }
}

fn snapshotter(s: &Setup, tier: StoreTier, strategy: RestoreStrategy) -> Snapshotter {
    let config = SnapshotConfig::default()
        .with_store(tier)
        .with_strategy(strategy)
        // Steady-state restores: verification only before a final pass.
        .with_verify_every(0);
    Snapshotter::new(s.inventory.clone(), s.device.clone(), config).expect("config")
}

fn ceilings(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, footprint: u64) {
    let src = vec![0xA5u8; footprint as usize];
    let mut dst = vec![0u8; footprint as usize];
    group.bench_function("ceiling/memcpy", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    group.bench_function("ceiling/xxh3_1t", |b| {
        b.iter(|| {
            src.chunks(kreplay_snapshot::DEFAULT_CHUNK_SIZE as usize)
                .map(xxh3_64)
                .fold(0, |a, h| a ^ h)
        })
    });
}

fn snapshots(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    s: &Setup,
    tier: StoreTier,
    strategy: RestoreStrategy,
) {
    let snap = snapshotter(s, tier, strategy);
    drop(snap.snapshot(&Filter::for_replay(1)).expect("snapshot")); // allocate the store once
    group.bench_function(format!("snapshot/{tier}/{strategy}"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let plan = snap.plan(&Filter::for_replay(1)).expect("plan");
                let start = Instant::now();
                let taken = snap.take(plan).expect("snapshot");
                total += start.elapsed();
                drop(taken);
            }
            total
        })
    });
}

fn restores(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    s: &Setup,
    tier: StoreTier,
    strategy: RestoreStrategy,
    fraction: f64,
) {
    let snap = snapshotter(s, tier, strategy);
    let mut snapshot = snap.snapshot(&Filter::for_replay(1)).expect("snapshot");
    let chunks = s.map.pick(fraction, 42);
    let mut salt = 0u64;
    let mut pass = |snapshot: &mut kreplay_snapshot::Snapshot| {
        salt += 1;
        s.map.dirty(&s.device, &chunks, salt).expect("dirty");
        let start = Instant::now();
        snapshot.restore(&NOT_FINAL).expect("restore");
        start.elapsed()
    };
    pass(&mut snapshot); // pass 0: learn the write set
    group.bench_function(
        format!("restore/{tier}/{strategy}/{}", format_percent(fraction)),
        |b| b.iter_custom(|iters| (0..iters).map(|_| pass(&mut snapshot)).sum()),
    );
}

fn bench(c: &mut Criterion) {
    for footprint in footprints() {
        let s = setup(footprint);
        let mut group = c.benchmark_group(format!("snapshot_restore/{}", format_bytes(footprint)));
        group
            .throughput(Throughput::Bytes(footprint))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        ceilings(&mut group, footprint);
        for tier in [StoreTier::Host, StoreTier::File, StoreTier::Device] {
            snapshots(&mut group, &s, tier, RestoreStrategy::Full);
        }
        snapshots(&mut group, &s, StoreTier::Host, RestoreStrategy::Writeset);
        for strategy in [
            RestoreStrategy::Auto,
            RestoreStrategy::Full,
            RestoreStrategy::Hash,
            RestoreStrategy::Writeset,
        ] {
            for fraction in DIRTY {
                restores(&mut group, &s, StoreTier::Host, strategy, fraction);
            }
        }
        for tier in [StoreTier::File, StoreTier::Device] {
            restores(&mut group, &s, tier, RestoreStrategy::Full, 0.01);
            restores(&mut group, &s, tier, RestoreStrategy::Writeset, 0.01);
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
