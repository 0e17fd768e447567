//! The machine's copy and read ceilings, measured with code that shares nothing with kreplay's:
//! plain threads (no rayon), each method tried, the best kept, and how it was obtained said.
//!
//! - copy: 1 thread and every CPU, each thread copying one contiguous share or 1 MiB blocks
//!   dealt round robin, with ordinary stores (the C library's `memcpy`) or streaming
//!   (non-temporal) stores;
//! - read: the same thread and block layouts, summing 8-byte words or 32-byte AVX2 vectors.

use std::hint::black_box;
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
}

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

/// Streaming copy of `len` bytes (x86-64: SSE2 non-temporal stores, part of the base ISA).
///
/// # Safety
/// `src` and `dst` are valid for `len` bytes and do not overlap.
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
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
    } = method;
    let (s, d) = (Ptr(src.as_ptr().cast_mut()), Ptr(dst.as_mut_ptr()));
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let (s, d) = (s, d);
                for (a, b) in ranges(len, threads, t, split) {
                    // SAFETY: [a, b) lies inside both buffers (of equal length); threads get
                    // disjoint ranges; the buffers outlive the scope.
                    unsafe {
                        if streaming {
                            copy_streaming(d.0.add(a), s.0.add(a), b - a);
                        } else {
                            std::ptr::copy_nonoverlapping(s.0.add(a), d.0.add(a), b - a);
                        }
                    }
                }
            });
        }
    });
}

/// The copy ceiling over `src.len()` bytes into `dst`.
pub fn copy_ceiling(src: &[u8], dst: &mut [u8], repeats: usize) -> Ceiling {
    assert_eq!(src.len(), dst.len());
    let mut tried = Vec::new();
    let stores: &[bool] = if has_streaming() {
        &[false, true]
    } else {
        &[false]
    };
    for threads in thread_counts() {
        for split in [Split::Shares, Split::Blocks] {
            for &streaming in stores {
                let method = CeilingMethod {
                    threads,
                    split,
                    wide: streaming,
                };
                let seconds = best_of(repeats, || copy_with(method, src, dst));
                tried.push((method, seconds));
            }
        }
    }
    black_box(&dst);
    finish(src.len() as u64, tried, true)
}

fn method_name(method: CeilingMethod, copy: bool) -> String {
    let kind = match (copy, method.wide) {
        (true, false) => "memcpy stores",
        (true, true) => "streaming stores",
        (false, false) => "8-byte loads",
        (false, true) => "AVX2 32-byte loads",
    };
    format!(
        "{}, {}, {kind}",
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
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let body = bytes.len() / 128 * 128;
    let p = bytes.as_ptr();
    let mut i = 0;
    while i < body {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: [i + 32k, i + 32k + 32) lies inside `bytes`.
            let v = unsafe { _mm256_loadu_si256(p.add(i + 32 * k).cast()) };
            *a = _mm256_add_epi64(*a, v);
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
    out.iter()
        .fold(sum_words(&bytes[body..]), |a, &b| a.wrapping_add(b))
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
    } = method;
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let mut sum = 0u64;
                for (a, b) in ranges(len, threads, t, split) {
                    let part = &src[a..b];
                    #[cfg(target_arch = "x86_64")]
                    let s = if avx2 && has_avx2() {
                        // SAFETY: the CPU has AVX2 (checked just above).
                        unsafe { sum_avx2(part) }
                    } else {
                        sum_words(part)
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let s = {
                        let _ = avx2;
                        sum_words(part)
                    };
                    sum = sum.wrapping_add(s);
                }
                black_box(sum);
            });
        }
    });
}

/// The read ceiling over `src`.
pub fn read_ceiling(src: &[u8], repeats: usize) -> Ceiling {
    let mut tried = Vec::new();
    let loads: &[bool] = if has_avx2() { &[false, true] } else { &[false] };
    for threads in thread_counts() {
        for split in [Split::Shares, Split::Blocks] {
            for &avx2 in loads {
                let method = CeilingMethod {
                    threads,
                    split,
                    wide: avx2,
                };
                tried.push((method, best_of(repeats, || read_with(method, src))));
            }
        }
    }
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
        for split in [Split::Shares, Split::Blocks] {
            for threads in 1..4 {
                let len = 5 * BLOCK + 123;
                let mut covered = vec![0u8; len];
                for t in 0..threads {
                    for (a, b) in ranges(len, threads, t, split) {
                        covered[a..b].iter_mut().for_each(|c| *c += 1);
                    }
                }
                assert!(covered.iter().all(|&c| c == 1), "{split:?} {threads}");
            }
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
}
