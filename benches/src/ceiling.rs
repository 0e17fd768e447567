//! The machine's copy and read ceilings, measured with code that shares nothing with kreplay's:
//! plain threads (no rayon), each method tried, the best kept, and how it was obtained said.
//!
//! - copy: 1 thread and every CPU, each thread copying one contiguous share, 1 MiB blocks
//!   dealt round robin, or 1 MiB blocks claimed in turn from a shared counter (a thread that
//!   starts late or runs slow takes fewer), with ordinary stores (the C library's `memcpy`) or
//!   streaming (non-temporal) stores, 32-byte AVX2 ones where the CPU has them, each range in
//!   one stream or in [`STREAMS`] streams advanced in turn 64 bytes at a time;
//! - read: the same thread counts and splits, summing 8-byte words or 32-byte AVX2 vectors, in
//!   one stream or [`STREAMS`] streams per range advanced in turn 128 bytes at a time.
//!
//! Several streams per thread keep more reads in flight than one sequential stream does: on the
//! 2-core test machine two threads read 22-31 GB/s with four streams each against 16-20 GB/s
//! with one, while copies with four streams were slower (7-11 GB/s against 12-16).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A ceiling: the best method's rate, and every method's.
#[derive(Clone, Debug, PartialEq)]
pub struct Ceiling {
    /// Bytes per pass (the footprint).
    pub bytes: u64,
    /// Best wall time of the best method.
    pub seconds: f64,
    /// `bytes` per second of the best method, GB/s.
    pub gbps: f64,
    /// The best method in words.
    pub method: String,
    /// Every method tried with its GB/s.
    pub tried: Vec<(String, f64)>,
    /// The best method, to time it again beside a row (`None` when nothing was measured).
    pub best: Option<CeilingMethod>,
}

/// One way of copying or reading a buffer, with plain threads and no code of kreplay's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CeilingMethod {
    threads: usize,
    split: Split,
    /// Copies: streaming stores; reads: AVX2 loads.
    wide: bool,
    /// Streams each range is cut into, advanced in turn: 1 or [`STREAMS`].
    streams: usize,
}

/// Streams per range of the multi-stream methods.
pub const STREAMS: usize = 4;

impl CeilingMethod {
    /// One timed copy of `src` into `dst` by this method.
    pub fn copy_once(self, src: &[u8], dst: &mut [u8]) -> Duration {
        assert_eq!(src.len(), dst.len());
        let start = Instant::now();
        copy_with(self, src, dst);
        black_box(&dst);
        start.elapsed()
    }

    /// One timed read of `src` by this method.
    pub fn read_once(self, src: &[u8]) -> Duration {
        let start = Instant::now();
        read_with(self, src);
        start.elapsed()
    }
}

impl Ceiling {
    /// One line: the rate, the method and the runner-up methods.
    pub fn describe(&self) -> String {
        let mut others: Vec<&(String, f64)> = self.tried.iter().collect();
        others.sort_by(|a, b| b.1.total_cmp(&a.1));
        let list = others
            .iter()
            .map(|(m, g)| format!("{m} {g:.1}"))
            .collect::<Vec<_>>()
            .join("; ");
        format!(
            "{:.2} GB/s by {} (tried, GB/s: {list})",
            self.gbps, self.method
        )
    }

    /// The better of two measurements of the same ceiling.
    pub fn better(self, other: Ceiling) -> Ceiling {
        if other.gbps > self.gbps { other } else { self }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// Each thread one contiguous share.
    Shares,
    /// 1 MiB blocks dealt round robin.
    Blocks,
    /// 1 MiB blocks claimed in turn from a shared counter: the threads are started one after
    /// another and a machine's CPUs need not run at one speed (a shared host's), so fixed shares
    /// wait for the last; on a 16-CPU host a copy ceiling of fixed shares read 0.75-0.9 of what
    /// kreplay's restore, whose copy threads take pieces as they come free, reached.
    Claimed,
}

const SPLITS: [Split; 3] = [Split::Shares, Split::Blocks, Split::Claimed];

/// Calls `f` with each byte range thread `t` of `threads` handles; `next` is the counter the
/// threads of one pass claim [`Split::Claimed`] blocks from (starting at 0).
fn for_each_range(
    len: usize,
    threads: usize,
    t: usize,
    split: Split,
    next: &AtomicUsize,
    mut f: impl FnMut(usize, usize),
) {
    if split == Split::Claimed {
        loop {
            let block = next.fetch_add(1, Ordering::Relaxed);
            let start = block.saturating_mul(BLOCK);
            if start >= len {
                return;
            }
            f(start, (start + BLOCK).min(len));
        }
    }
    for (a, b) in ranges(len, threads, t, split) {
        f(a, b);
    }
}

const BLOCK: usize = 1 << 20;

/// The byte ranges thread `t` of `threads` handles.
fn ranges(len: usize, threads: usize, t: usize, split: Split) -> Vec<(usize, usize)> {
    match split {
        Split::Shares => {
            let share = len.div_ceil(threads).next_multiple_of(4096);
            let start = (t * share).min(len);
            vec![(start, (start + share).min(len))]
        }
        Split::Blocks => (0..len.div_ceil(BLOCK))
            .filter(|b| b % threads == t)
            .map(|b| (b * BLOCK, ((b + 1) * BLOCK).min(len)))
            .collect(),
        // Claimed as the pass runs (`for_each_range`), not known ahead.
        Split::Claimed => Vec::new(),
    }
}

fn thread_counts() -> Vec<usize> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1, n / 2, n];
    counts.retain(|&c| c >= 1);
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn split_name(split: Split) -> &'static str {
    match split {
        Split::Shares => "one contiguous share each",
        Split::Blocks => "1 MiB blocks round robin",
        Split::Claimed => "1 MiB blocks claimed in turn",
    }
}

fn plural(threads: usize) -> String {
    if threads == 1 {
        "1 thread".into()
    } else {
        format!("{threads} threads")
    }
}

/// A raw pointer that may cross to the measuring threads (each touches disjoint ranges).
#[derive(Clone, Copy)]
struct Ptr(*mut u8);
// SAFETY: only used to hand disjoint ranges of one live buffer to scoped threads.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        f();
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Streaming copy of `len` bytes (x86-64: non-temporal stores, 32-byte AVX2 ones where the CPU
/// has them, else SSE2's 16-byte ones, part of the base ISA). The wider stores are tried because
/// a machine may write faster with them: on a 16-CPU Xeon host kreplay's own copy (AVX2 stores)
/// ran 1.17-1.26x a ceiling of SSE2 stores over 1 GiB.
///
/// # Safety
/// `src` and `dst` are valid for `len` bytes and do not overlap.
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 (checked just above); the caller's promise.
        return unsafe { copy_streaming_avx2(dst, src, len) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = ((16 - dst as usize % 16) % 16).min(len);
        // SAFETY: inside both buffers by the caller's promise; the stores after the head are
        // 16-byte aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let body = (len - head) / 64 * 64;
            let (d, s) = (dst.add(head), src.add(head));
            let mut i = 0;
            while i < body {
                for k in (0..64).step_by(16) {
                    _mm_stream_si128(d.add(i + k).cast(), _mm_loadu_si128(s.add(i + k).cast()));
                }
                i += 64;
            }
            _mm_sfence();
            let t = head + body;
            std::ptr::copy_nonoverlapping(src.add(t), dst.add(t), len - t);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as promised by the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

/// [`copy_streaming`] with 32-byte AVX2 non-temporal stores, 128 bytes a round.
///
/// # Safety
/// AVX2 is available; `src` and `dst` are valid for `len` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_streaming_avx2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{_mm_sfence, _mm256_loadu_si256, _mm256_stream_si256};
    let head = ((32 - dst as usize % 32) % 32).min(len);
    // SAFETY: inside both buffers by the caller's promise; the stores after the head are
    // 32-byte aligned.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let body = (len - head) / 128 * 128;
        let (d, s) = (dst.add(head), src.add(head));
        let mut i = 0;
        while i < body {
            for k in (0..128).step_by(32) {
                _mm256_stream_si256(d.add(i + k).cast(), _mm256_loadu_si256(s.add(i + k).cast()));
            }
            i += 128;
        }
        _mm_sfence();
        let t = head + body;
        std::ptr::copy_nonoverlapping(src.add(t), dst.add(t), len - t);
    }
}

/// Copy `len` bytes in `streams` streams advanced in turn 64 bytes at a time (one stream: the
/// C library's `memcpy` or [`copy_streaming`]).
///
/// # Safety
/// `src` and `dst` are valid for `len` bytes and do not overlap.
unsafe fn copy_range(dst: *mut u8, src: *const u8, len: usize, streams: usize, streaming: bool) {
    const STEP: usize = 64;
    let one = |d: *mut u8, s: *const u8, n: usize| {
        // SAFETY: the caller's ranges, cut below into parts inside them.
        unsafe {
            if streaming {
                copy_streaming(d, s, n);
            } else {
                std::ptr::copy_nonoverlapping(s, d, n);
            }
        }
    };
    // Streaming stores want 16-byte aligned destinations: the head up to that is copied alone.
    let head = ((16 - dst as usize % 16) % 16).min(len);
    let part = (len - head) / streams.max(1) / STEP * STEP;
    if streams <= 1 || part == 0 {
        one(dst, src, len);
        return;
    }
    one(dst, src, head);
    // SAFETY: every part lies inside the caller's ranges: [head + k * part, head + (k + 1) *
    // part) for k < streams, then the tail after them.
    unsafe {
        let (d, s) = (dst.add(head), src.add(head));
        let mut i = 0;
        while i < part {
            for k in 0..streams {
                let at = k * part + i;
                if streaming {
                    stream_64(d.add(at), s.add(at));
                } else {
                    std::ptr::copy_nonoverlapping(s.add(at), d.add(at), STEP);
                }
            }
            i += STEP;
        }
        if streaming {
            store_fence();
        }
        let done = head + streams * part;
        one(dst.add(done), src.add(done), len - done);
    }
}

/// 64 bytes by streaming stores, without the fence [`store_fence`] adds after a run of them.
///
/// # Safety
/// `src` and `dst` are valid for 64 bytes and do not overlap; `dst` is 16-byte aligned.
unsafe fn stream_64(dst: *mut u8, src: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_si128, _mm_stream_si128};
        for k in (0..64).step_by(16) {
            // SAFETY: inside both 64-byte ranges; `dst + k` is 16-byte aligned.
            unsafe { _mm_stream_si128(dst.add(k).cast(), _mm_loadu_si128(src.add(k).cast())) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as promised by the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, 64)
    }
}

/// Orders the streaming stores before it before any store after it.
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Whether streaming stores are a distinct method here.
fn has_streaming() -> bool {
    cfg!(target_arch = "x86_64")
}

fn copy_with(method: CeilingMethod, src: &[u8], dst: &mut [u8]) {
    let len = src.len();
    let CeilingMethod {
        threads,
        split,
        wide: streaming,
        streams,
    } = method;
    let (s, d) = (Ptr(src.as_ptr().cast_mut()), Ptr(dst.as_mut_ptr()));
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let next = &next;
            scope.spawn(move || {
                let (s, d) = (s, d);
                for_each_range(len, threads, t, split, next, |a, b| {
                    // SAFETY: [a, b) lies inside both buffers (of equal length); threads get
                    // disjoint ranges; the buffers outlive the scope.
                    unsafe { copy_range(d.0.add(a), s.0.add(a), b - a, streams, streaming) };
                });
            });
        }
    });
}

/// Every method a ceiling tries, in the order it tries them: each thread count, both splits,
/// ordinary and (where the CPU has them, `wide`) wide accesses, one and [`STREAMS`] streams per
/// thread range.
fn methods(wide: bool) -> impl Iterator<Item = CeilingMethod> {
    let widths: &'static [bool] = if wide { &[false, true] } else { &[false] };
    thread_counts().into_iter().flat_map(move |threads| {
        SPLITS.into_iter().flat_map(move |split| {
            widths.iter().flat_map(move |&wide| {
                [1, STREAMS].map(|streams| CeilingMethod {
                    threads,
                    split,
                    wide,
                    streams,
                })
            })
        })
    })
}

/// The copy ceiling over `src.len()` bytes into `dst`.
pub fn copy_ceiling(src: &[u8], dst: &mut [u8], repeats: usize) -> Ceiling {
    assert_eq!(src.len(), dst.len());
    let tried = methods(has_streaming())
        .map(|method| (method, best_of(repeats, || copy_with(method, src, dst))))
        .collect();
    black_box(&dst);
    finish(src.len() as u64, tried, true)
}

fn method_name(method: CeilingMethod, copy: bool) -> String {
    let kind = match (copy, method.wide) {
        (true, false) => "memcpy stores",
        (true, true) if has_avx2() => "streaming 32-byte stores",
        (true, true) => "streaming stores",
        (false, false) => "8-byte loads",
        (false, true) => "AVX2 32-byte loads",
    };
    let streams = if method.streams > 1 {
        format!(", {} streams each", method.streams)
    } else {
        String::new()
    };
    format!(
        "{}, {}, {kind}{streams}",
        plural(method.threads),
        split_name(method.split)
    )
}

fn sum_words(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
        .fold(0u64, u64::wrapping_add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
/// # Safety
/// AVX2 is available.
unsafe fn sum_avx2(bytes: &[u8]) -> u64 {
    let body = bytes.len() / 128 * 128;
    // SAFETY: AVX2 is available (the caller's promise); one part, a multiple of 128 bytes.
    let sum = unsafe { sum_avx2_streams(&[&bytes[..body]]) };
    sum.wrapping_add(sum_words(&bytes[body..]))
}

/// The sum of `bytes` read in `streams` streams advanced in turn, 128 bytes at a time, by 32-byte
/// AVX2 loads or 8-byte words (one stream: [`sum_avx2`] or [`sum_words`]).
fn sum_streams(bytes: &[u8], streams: usize, avx2: bool) -> u64 {
    let one = |b: &[u8]| {
        #[cfg(target_arch = "x86_64")]
        if avx2 && has_avx2() {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { sum_avx2(b) };
        }
        sum_words(b)
    };
    let part = bytes.len() / streams.max(1) / 128 * 128;
    if streams <= 1 || part == 0 {
        return one(bytes);
    }
    let parts: Vec<&[u8]> = (0..streams)
        .map(|k| &bytes[k * part..(k + 1) * part])
        .collect();
    #[cfg(target_arch = "x86_64")]
    let body = if avx2 && has_avx2() {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { sum_avx2_streams(&parts) }
    } else {
        sum_words_streams(&parts)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let body = sum_words_streams(&parts);
    body.wrapping_add(one(&bytes[streams * part..]))
}

fn sum_words_streams(parts: &[&[u8]]) -> u64 {
    let mut sums = vec![0u64; parts.len()];
    let len = parts.first().map_or(0, |p| p.len());
    let mut i = 0;
    while i < len {
        for (sum, part) in sums.iter_mut().zip(parts) {
            *sum = sum.wrapping_add(sum_words(&part[i..i + 128]));
        }
        i += 128;
    }
    sums.into_iter().fold(0, u64::wrapping_add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
/// # Safety
/// AVX2 is available; every part has the length of the first, a multiple of 128.
unsafe fn sum_avx2_streams(parts: &[&[u8]]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let len = parts.first().map_or(0, |p| p.len());
    let mut i = 0;
    while i < len {
        for part in parts {
            let p = part.as_ptr();
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: [i + 32k, i + 32k + 32) lies inside `part` (i + 128 <= len).
                let v = unsafe { _mm256_loadu_si256(p.add(i + 32 * k).cast()) };
                *a = _mm256_add_epi64(*a, v);
            }
        }
        i += 128;
    }
    let mut out = [0u64; 4];
    let total = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    // SAFETY: `out` holds 32 bytes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), total) };
    out.iter().fold(0, |a, &b| a.wrapping_add(b))
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn read_with(method: CeilingMethod, src: &[u8]) {
    let len = src.len();
    let CeilingMethod {
        threads,
        split,
        wide: avx2,
        streams,
    } = method;
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let next = &next;
            scope.spawn(move || {
                let mut sum = 0u64;
                for_each_range(len, threads, t, split, next, |a, b| {
                    sum = sum.wrapping_add(sum_streams(&src[a..b], streams, avx2));
                });
                black_box(sum);
            });
        }
    });
}

/// The read ceiling over `src`.
pub fn read_ceiling(src: &[u8], repeats: usize) -> Ceiling {
    let tried = methods(has_avx2())
        .map(|method| (method, best_of(repeats, || read_with(method, src))))
        .collect();
    finish(src.len() as u64, tried, false)
}

fn finish(bytes: u64, tried: Vec<(CeilingMethod, f64)>, copy: bool) -> Ceiling {
    let best = tried.iter().min_by(|a, b| a.1.total_cmp(&b.1)).copied();
    Ceiling {
        bytes,
        seconds: best.map_or(f64::INFINITY, |b| b.1),
        gbps: rate(bytes, best.map_or(f64::INFINITY, |b| b.1)),
        method: best.map_or_else(|| "nothing measured".into(), |b| method_name(b.0, copy)),
        tried: tried
            .into_iter()
            .map(|(m, s)| (method_name(m, copy), rate(bytes, s)))
            .collect(),
        best: best.map(|b| b.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_try_every_thread_count_split_width_and_stream_count_once() {
        let threads = thread_counts().len();
        for (wide, widths) in [(false, 1), (true, 2)] {
            let all: Vec<CeilingMethod> = methods(wide).collect();
            assert_eq!(
                all.len(),
                threads * SPLITS.len() * widths * 2,
                "wide {wide}"
            );
            for (i, m) in all.iter().enumerate() {
                assert!(!all[..i].contains(m), "{m:?} twice");
                assert!(wide || !m.wide, "{m:?}");
            }
        }
    }

    #[test]
    fn every_copy_method_copies_every_byte() {
        let len = 3 * BLOCK + 4096 + 37;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        let mut dst = vec![0u8; len];
        let c = copy_ceiling(&src[1..], &mut dst[1..], 1);
        assert_eq!(&dst[1..], &src[1..]);
        assert!(c.gbps > 0.0 && c.tried.len() >= 2, "{c:?}");
        assert!(c.describe().contains(&c.method));
    }

    #[test]
    fn the_best_method_can_be_run_again_and_still_copies_every_byte() {
        let len = 2 * BLOCK + 99;
        let src: Vec<u8> = (0..len).map(|i| (i * 13 + i / 511) as u8).collect();
        let mut dst = vec![0u8; len];
        let c = copy_ceiling(&src, &mut dst, 1);
        let mut again = vec![0u8; len];
        c.best.expect("a method").copy_once(&src, &mut again);
        assert_eq!(again, src);
        let r = read_ceiling(&src, 1);
        assert!(r.best.expect("a method").read_once(&src) > Duration::ZERO);
        assert!(r.method.contains("loads") && c.method.contains("stores"));
    }

    #[test]
    fn the_streaming_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..BLOCK + 300).map(|i| (i * 11 + i / 251) as u8).collect();
        for len in [0, 1, 15, 16, 63, 64, 65, 4096 + 37, BLOCK + 200] {
            for (s_off, d_off) in [(0, 0), (1, 0), (0, 5), (7, 33)] {
                let mut dst = vec![0xEEu8; len + 80];
                // SAFETY: both ranges lie inside their vectors, which do not overlap.
                unsafe {
                    copy_streaming(dst.as_mut_ptr().add(d_off), src.as_ptr().add(s_off), len)
                };
                assert!(
                    dst[d_off..d_off + len] == src[s_off..s_off + len],
                    "{len} {s_off} {d_off}"
                );
                assert!(dst[..d_off].iter().all(|&b| b == 0xEE), "before");
                assert!(dst[d_off + len..].iter().all(|&b| b == 0xEE), "after");
            }
        }
    }

    #[test]
    fn thread_ranges_cover_the_buffer_once() {
        for split in SPLITS {
            for threads in 1..4 {
                let len = 5 * BLOCK + 123;
                let mut covered = vec![0u8; len];
                let next = AtomicUsize::new(0);
                for t in 0..threads {
                    for_each_range(len, threads, t, split, &next, |a, b| {
                        covered[a..b].iter_mut().for_each(|c| *c += 1);
                    });
                }
                assert!(covered.iter().all(|&c| c == 1), "{split:?} {threads}");
            }
        }
    }

    #[test]
    fn each_copy_method_alone_copies_every_byte_and_each_read_sums_every_word() {
        let len = 3 * BLOCK + 4096 + 40;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        for method in methods(true) {
            let mut dst = vec![0u8; len];
            copy_with(method, &src, &mut dst);
            assert!(dst == src, "{method:?}");
        }
        // Every method reads through `for_each_range`, whose coverage is checked above; a
        // read of each runs to the end.
        for method in methods(true) {
            assert!(method.read_once(&src) > Duration::ZERO, "{method:?}");
        }
    }

    #[test]
    fn the_avx2_sum_equals_the_word_sum() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 31) as u8).collect();
        if has_avx2() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: checked above.
            assert_eq!(unsafe { sum_avx2(&bytes[3..]) }, sum_words(&bytes[3..]));
        }
        let c = read_ceiling(&bytes, 1);
        assert!(c.gbps > 0.0);
    }

    #[test]
    fn reading_in_several_streams_sums_every_word_once() {
        let bytes: Vec<u8> = (0..100_003u32).map(|i| (i * 37 + i / 7) as u8).collect();
        for len in [0, 100, 4 * 128, 4 * 128 + 8, 10_000, 100_000] {
            let part = &bytes[3..3 + len];
            let words = sum_words(&part[..len / 8 * 8]);
            for avx2 in [false, true] {
                for streams in [1, 2, STREAMS] {
                    assert_eq!(
                        sum_streams(&part[..len / 8 * 8], streams, avx2),
                        words,
                        "{len} {streams} {avx2}"
                    );
                }
            }
        }
    }

    #[test]
    fn copying_in_several_streams_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..BLOCK + 300).map(|i| (i * 11 + i / 251) as u8).collect();
        for len in [
            0,
            1,
            63,
            64 * STREAMS,
            64 * STREAMS + 17,
            4096 + 37,
            BLOCK + 200,
        ] {
            for (s_off, d_off) in [(0, 0), (1, 0), (0, 5), (7, 33)] {
                for streaming in [false, true] {
                    let mut dst = vec![0xEEu8; len + 80];
                    // SAFETY: both ranges lie inside their vectors, which do not overlap.
                    unsafe {
                        copy_range(
                            dst.as_mut_ptr().add(d_off),
                            src.as_ptr().add(s_off),
                            len,
                            STREAMS,
                            streaming,
                        )
                    };
                    assert!(
                        dst[d_off..d_off + len] == src[s_off..s_off + len],
                        "{len} {s_off} {d_off} {streaming}"
                    );
                    assert!(dst[..d_off].iter().all(|&b| b == 0xEE), "before");
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xEE), "after");
                }
            }
        }
        let c = copy_ceiling(&src, &mut vec![0u8; src.len()], 1);
        assert!(
            c.tried.iter().any(|(m, _)| m.contains("4 streams each")),
            "{c:?}"
        );
    }
}
