//! The chunk hash: XXH3-64 with a fixed secret, using the widest vector unit the CPU offers at
//! run time.
//!
//! `xxhash-rust` picks its vector code when it is compiled (`target_feature`), so a build
//! without `-C target-cpu` flags hashes with SSE2 even on a CPU with AVX2, and hashing then
//! runs well below the memory's read rate. This module keeps `xxhash-rust` as the reference and
//! the fallback, and adds an AVX2 version of XXH3's long-input loop (the part that touches
//! every byte) selected once per process with `is_x86_feature_detected!`. Both compute the
//! same function, `xxh3_64` (seed 0), checked against each other by the tests.

use std::sync::OnceLock;

use xxhash_rust::const_xxh3::const_custom_default_secret;
use xxhash_rust::xxh3::xxh3_64;

/// Length of the secret: XXH3's default size, so a block is 16 stripes of 64 bytes.
const SECRET_LEN: usize = 192;
const STRIPE: usize = 64;
const STRIPES_PER_BLOCK: usize = (SECRET_LEN - STRIPE) / 8;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
/// How far ahead of the stripe being hashed the one-chunk AVX2 loop asks for memory. Hashing
/// runs at several times the memory's read rate once the data is in cache (37 GB/s on one core
/// of the 2-core test machine), so without it a thread alternates between waiting for memory
/// and hashing: one thread hashed 7-9 GB/s out of memory without it and 9.5-10.5 GB/s with it
/// there. [`chunk_hashes`] does better by hashing [`GROUP`] chunks in one loop instead.
const PREFETCH_AHEAD: usize = 4096;
/// Chunks of equal length [`chunk_hashes`] hashes together in one loop: one stripe of each in
/// turn, so a thread keeps that many streams of reads in flight (and as many independent
/// accumulator chains), which the memory system serves in parallel. On the 2-core test machine
/// (AMD EPYC, 4 KiB pages) a two-thread hash pass over 256 MiB and 1 GiB ran 18-25 GB/s four
/// chunks at a time against 15-19 GB/s one chunk at a time with the prefetch above, and
/// 18-21 GB/s two at a time; eight at a time (more accumulators than the 16 vector registers
/// hold) was no faster than four, and a software prefetch in the four-chunk loop made it slower
/// (the hardware prefetchers follow four sequential streams by themselves).
pub(crate) const GROUP: usize = 4;
/// Inputs up to this length take XXH3's short paths (never vectorised): left to `xxhash-rust`.
const MID_MAX: usize = 240;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH3's default secret, so [`chunk_hash`] is `xxh3_64` (seed 0), the hash a device's hash
/// kernel computes (see `DeviceMemory::hash_chunks`).
static SECRET: [u8; SECRET_LEN] = const_custom_default_secret(0);

/// Which implementation hashes long inputs in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashImpl {
    /// `xxhash-rust` as compiled (SSE2 on a plain x86-64 build).
    Portable,
    /// The AVX2 long-input loop of this module.
    Avx2,
}

impl HashImpl {
    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            HashImpl::Portable => "xxh3 (portable build)",
            HashImpl::Avx2 => "xxh3 (AVX2, selected at run time)",
        }
    }
}

/// The implementation this process uses, detected once.
pub fn hash_impl() -> HashImpl {
    static IMPL: OnceLock<HashImpl> = OnceLock::new();
    *IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return HashImpl::Avx2;
            }
        }
        HashImpl::Portable
    })
}

/// The hash of one chunk.
pub fn chunk_hash(bytes: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if bytes.len() > MID_MAX && hash_impl() == HashImpl::Avx2 {
            // SAFETY: `hash_impl` returns Avx2 only when the CPU reports AVX2.
            return unsafe { avx2::hash_long(bytes) };
        }
    }
    portable_hash(bytes)
}

/// The hash of every `chunk_size` piece of `bytes` (the last may be shorter) into `out`, in
/// order: the values [`chunk_hash`] gives each, computed four equal-length chunks at a
/// time where the CPU has AVX2. `out` has one entry per piece (extra entries are left alone).
pub fn chunk_hashes(bytes: &[u8], chunk_size: usize, out: &mut [u64]) {
    assert!(chunk_size > 0, "chunk size 0");
    let mut pieces = bytes.chunks(chunk_size);
    let mut out = out.iter_mut();
    #[cfg(target_arch = "x86_64")]
    {
        if chunk_size > MID_MAX
            && hash_impl() == HashImpl::Avx2
            && let Some(group_len) = GROUP.checked_mul(chunk_size)
        {
            let whole = bytes.len() / group_len * GROUP;
            for group in bytes[..whole * chunk_size].chunks_exact(group_len) {
                let inputs: [&[u8]; GROUP] =
                    std::array::from_fn(|k| &group[k * chunk_size..(k + 1) * chunk_size]);
                // SAFETY: `hash_impl` returns Avx2 only when the CPU reports AVX2; the inputs
                // are of equal length, longer than MID_MAX.
                let hashes = unsafe { avx2::hash_long_group(inputs) };
                for h in hashes {
                    match out.next() {
                        Some(slot) => *slot = h,
                        None => return,
                    }
                }
                // Skip the pieces just hashed.
                pieces.nth(GROUP - 1);
            }
        }
    }
    for (slot, piece) in out.zip(pieces) {
        *slot = chunk_hash(piece);
    }
}

/// The same function through `xxhash-rust` only (the reference).
pub fn portable_hash(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

fn read64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn initial_acc() -> [u64; 8] {
    [
        PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
    ]
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn mul128_fold64(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// XXH3's final merge of the eight accumulators.
fn merge(acc: &[u64; 8], len: usize) -> u64 {
    let mut result = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let s = 11 + 16 * i;
        result = result.wrapping_add(mul128_fold64(
            acc[2 * i] ^ read64(&SECRET, s),
            acc[2 * i + 1] ^ read64(&SECRET, s + 8),
        ));
    }
    avalanche(result)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    /// One 64-byte stripe into the accumulators.
    ///
    /// # Safety
    /// AVX2 is available; `input` and `secret` point at 64 readable bytes.
    #[target_feature(enable = "avx2")]
    unsafe fn accumulate_stripe(acc: &mut [__m256i; 2], input: *const u8, secret: *const u8) {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: 32-byte unaligned loads inside the 64 readable bytes the caller promises.
            let (data, key) = unsafe {
                (
                    _mm256_loadu_si256(input.add(32 * i).cast()),
                    _mm256_loadu_si256(secret.add(32 * i).cast()),
                )
            };
            let data_key = _mm256_xor_si256(data, key);
            let data_key_hi = _mm256_srli_epi64::<32>(data_key);
            let product = _mm256_mul_epu32(data_key, data_key_hi);
            // acc[i ^ 1] += data[i]: swap the two 64-bit halves of each 128-bit lane.
            let swapped = _mm256_shuffle_epi32::<0b0100_1110>(data);
            *a = _mm256_add_epi64(*a, _mm256_add_epi64(product, swapped));
        }
    }

    /// XXH3's scramble after each block.
    ///
    /// # Safety
    /// AVX2 is available; `secret` points at 64 readable bytes.
    #[target_feature(enable = "avx2")]
    unsafe fn scramble(acc: &mut [__m256i; 2], secret: *const u8) {
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: inside the 64 readable bytes the caller promises.
            let key = unsafe { _mm256_loadu_si256(secret.add(32 * i).cast()) };
            let shifted = _mm256_srli_epi64::<47>(*a);
            let data_key = _mm256_xor_si256(_mm256_xor_si256(*a, shifted), key);
            let data_key_hi = _mm256_shuffle_epi32::<0b0011_0001>(data_key);
            let lo = _mm256_mul_epu32(data_key, prime);
            let hi = _mm256_mul_epu32(data_key_hi, prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }

    /// XXH3-64 with [`SECRET`] of each of `N` inputs of one length (longer than 240 bytes), one
    /// stripe of each in turn.
    ///
    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn hash_long_group<const N: usize>(inputs: [&[u8]; N]) -> [u64; N] {
        let len = inputs[0].len();
        assert!(len > MID_MAX && inputs.iter().all(|i| i.len() == len));
        let ptrs: [*const u8; N] = std::array::from_fn(|k| inputs[k].as_ptr());
        let secret = SECRET.as_ptr();
        let init = initial_acc();
        // SAFETY: `init` holds 64 bytes; unaligned loads.
        let start = unsafe {
            [
                _mm256_loadu_si256(init.as_ptr().cast()),
                _mm256_loadu_si256(init.as_ptr().add(4).cast()),
            ]
        };
        let mut acc = [start; N];
        let blocks = (len - 1) / BLOCK;
        for b in 0..blocks {
            for s in 0..STRIPES_PER_BLOCK {
                let at = b * BLOCK + s * STRIPE;
                for (a, p) in acc.iter_mut().zip(ptrs) {
                    // SAFETY: stripe `s` of block `b` lies inside every input (all of length
                    // `len`, b < blocks); the secret offset s * 8 + 64 <= SECRET_LEN.
                    unsafe { accumulate_stripe(a, p.add(at), secret.add(s * 8)) };
                }
            }
            for a in acc.iter_mut() {
                // SAFETY: the last 64 bytes of the secret.
                unsafe { scramble(a, secret.add(SECRET_LEN - STRIPE)) };
            }
        }
        let stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
        for (a, p) in acc.iter_mut().zip(ptrs) {
            for s in 0..stripes {
                // SAFETY: as in `hash_long`, for each input of length `len`.
                unsafe {
                    accumulate_stripe(a, p.add(blocks * BLOCK + s * STRIPE), secret.add(s * 8))
                };
            }
            // SAFETY: as in `hash_long`.
            unsafe {
                accumulate_stripe(a, p.add(len - STRIPE), secret.add(SECRET_LEN - STRIPE - 7))
            };
        }
        std::array::from_fn(|k| {
            let mut out = [0u64; 8];
            // SAFETY: `out` holds 64 writable bytes; unaligned stores.
            unsafe {
                _mm256_storeu_si256(out.as_mut_ptr().cast(), acc[k][0]);
                _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), acc[k][1]);
            }
            merge(&out, len)
        })
    }

    /// XXH3-64 of `bytes` (longer than 240 bytes) with [`SECRET`].
    ///
    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn hash_long(bytes: &[u8]) -> u64 {
        debug_assert!(bytes.len() > MID_MAX);
        let len = bytes.len();
        let input = bytes.as_ptr();
        let secret = SECRET.as_ptr();
        let init = initial_acc();
        // SAFETY: `init` holds 64 bytes; unaligned loads.
        let mut acc = unsafe {
            [
                _mm256_loadu_si256(init.as_ptr().cast()),
                _mm256_loadu_si256(init.as_ptr().add(4).cast()),
            ]
        };
        let blocks = (len - 1) / BLOCK;
        for b in 0..blocks {
            for s in 0..STRIPES_PER_BLOCK {
                let at = b * BLOCK + s * STRIPE;
                // Ask for the line PREFETCH_AHEAD bytes on now, so that memory reads overlap
                // the hashing instead of alternating with it. A prefetch never faults, and
                // `wrapping_add` keeps the address computation defined past the end.
                _mm_prefetch::<_MM_HINT_T0>(input.wrapping_add(at + PREFETCH_AHEAD).cast());
                // SAFETY: stripe `s` of block `b` lies inside `bytes` (b < blocks); the secret
                // offset s * 8 + 64 <= SECRET_LEN.
                unsafe { accumulate_stripe(&mut acc, input.add(at), secret.add(s * 8)) };
            }
            // SAFETY: the last 64 bytes of the secret.
            unsafe { scramble(&mut acc, secret.add(SECRET_LEN - STRIPE)) };
        }
        let stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
        for s in 0..stripes {
            // SAFETY: these stripes end before `len - 1`; the secret offsets stay in bounds.
            unsafe {
                accumulate_stripe(
                    &mut acc,
                    input.add(blocks * BLOCK + s * STRIPE),
                    secret.add(s * 8),
                )
            };
        }
        // SAFETY: the last stripe of the input (len > 64), and 64 secret bytes ending 7 before
        // the secret's end.
        unsafe {
            accumulate_stripe(
                &mut acc,
                input.add(len - STRIPE),
                secret.add(SECRET_LEN - STRIPE - 7),
            )
        };
        let mut out = [0u64; 8];
        // SAFETY: `out` holds 64 writable bytes; unaligned stores.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().cast(), acc[0]);
            _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), acc[1]);
        }
        merge(&out, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_size_past_the_bytes_hashes_them_as_one_chunk() {
        // The four-at-a-time path multiplied the chunk size by four: near the top of the
        // address space that overflowed (a panic, or a zero-length group).
        let data = [7u8; 300];
        for chunk_size in [1 << 62, usize::MAX / 2, usize::MAX] {
            let mut out = [0u64; 2];
            chunk_hashes(&data, chunk_size, &mut out);
            assert_eq!(out, [chunk_hash(&data), 0]);
        }
    }

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn the_run_time_hash_equals_the_reference_at_every_length_class() {
        let lengths = [
            0, 1, 3, 16, 17, 128, 129, 240, 241, 255, 256, 511, 512, 1023, 1024, 1025, 2047, 2048,
            4096, 4097, 65_536, 65_537, 100_003,
        ];
        for (i, &len) in lengths.iter().enumerate() {
            let data = bytes(len, i as u64 + 1);
            assert_eq!(
                chunk_hash(&data),
                portable_hash(&data),
                "length {len} with {:?}",
                hash_impl()
            );
        }
    }

    #[test]
    fn hashing_chunks_in_groups_gives_each_chunk_its_own_hash() {
        // Chunk sizes on both sides of the short paths and of a block, counts that leave no,
        // some and all chunks outside whole groups, and a short last chunk.
        for (i, &chunk) in [64, 240, 241, 1024, 1025, 4096 + 7, 65_536]
            .iter()
            .enumerate()
        {
            for count in [1, 3, 4, 5, 8, 9] {
                for tail in [0, 1, 300] {
                    let data = bytes(chunk * count + tail, (i * 100 + count) as u64);
                    let pieces = data.chunks(chunk).count();
                    let mut out = vec![0u64; pieces + 1];
                    chunk_hashes(&data, chunk, &mut out);
                    for (k, piece) in data.chunks(chunk).enumerate() {
                        assert_eq!(
                            out[k],
                            portable_hash(piece),
                            "chunk {chunk}, count {count}, tail {tail}, piece {k}"
                        );
                    }
                    assert_eq!(out[pieces], 0, "an extra entry is left alone");
                }
            }
        }
    }

    #[test]
    fn a_change_in_one_chunk_of_a_group_changes_only_its_hash() {
        let chunk = 4096;
        let mut data = bytes(chunk * GROUP * 2, 11);
        let mut before = vec![0u64; GROUP * 2];
        chunk_hashes(&data, chunk, &mut before);
        data[chunk * 2 + 100] ^= 1;
        let mut after = vec![0u64; GROUP * 2];
        chunk_hashes(&data, chunk, &mut after);
        for k in 0..GROUP * 2 {
            assert_eq!(before[k] != after[k], k == 2, "chunk {k}");
        }
    }

    #[test]
    fn every_byte_of_a_chunk_changes_its_hash() {
        let mut data = bytes(65_536, 7);
        let base = chunk_hash(&data);
        for at in [0, 1, 63, 64, 1023, 1024, 32_768, 65_471, 65_472, 65_535] {
            data[at] ^= 0x10;
            assert_ne!(chunk_hash(&data), base, "flip at {at}");
            data[at] ^= 0x10;
        }
        assert_eq!(chunk_hash(&data), base);
    }
}
