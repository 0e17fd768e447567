// kreplay's device kernels for the CUDA backend.
//
// Built into PTX (kreplay_kernels.ptx beside this file) by `cargo xtask ptx`, which runs
//   nvcc -ptx -arch=compute_75 -O3 cuda/kernels/kreplay_kernels.cu -o cuda/kernels/kreplay_kernels.ptx
// The PTX is committed; at run time the driver JIT-compiles it for the GPU at hand
// (cuModuleLoadData), so building kreplay needs no CUDA toolkit.
//
// * kreplay_hash_list: one xxh3_64 (seed 0) per chunk of a list of device ranges, bit for bit
//   the hash the snapshot crate computes on the host (xxhash-rust's xxh3_64), so device and
//   host hashes can be compared. Eight lanes per chunk, 16-byte loads; every byte is read once.
// * kreplay_restore_verified + kreplay_gather_found: a verified restore queued as launches
//   on one stream with one wait: every chunk of a list of live ranges is hashed as
//   kreplay_hash_list does and compared with the snapshot's hash on the device; a chunk that
//   differs gets its bit in a bitmap of changed chunks and a copy from the snapshot's store (a
//   device shadow, or pinned host memory through its device mapping) in a list that
//   kreplay_gather_found, right behind it, carries out without the host.
// * kreplay_hash_list_wide, kreplay_restore_verified_wide: the same with a whole warp per chunk,
//   for launches over too few chunks to fill the GPU with groups of eight lanes.
// * kreplay_gather: a list of device-to-device copies done in one launch (one block per tile;
//   the host splits copies into tiles).
// * kreplay_read_once: reads a range once and keeps nothing (the bandwidth ceiling that hashing
//   is measured against).

typedef unsigned long long u64;
typedef unsigned int u32;

// xxh3's default secret, as 64-bit little-endian words at the offsets the long hash reads:
// stripe keys and the scramble key (offsets 0, 8, ..., 184), the last stripe's keys
// (offsets 121 + 8j) and the merge keys (offsets 11 + 8j).
__constant__ u64 KR_SECRET[24] = {
    0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
    0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL, 0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
    0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
    0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
    0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL, 0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
    0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
};
__constant__ u64 KR_LAST_KEY[8] = {
    0xea647378d9c97e9fULL, 0xc5c3ebd33483acc5ULL, 0x17eb6313faffa081ULL, 0xd349daf0b751dd0dULL,
    0x2b9e68d429265516ULL, 0x8ffca1477d58be16ULL, 0x45ce31d07ad1b8f8ULL, 0xaf280416958f3acbULL,
};
__constant__ u64 KR_MERGE_KEY[8] = {
    0x6dd4de1cad21f72cULL, 0xa44072db979083e9ULL, 0xe679cb1f67b3b7a4ULL, 0xd05a8278e5c0cc4eULL,
    0x4608b82172ffcc7dULL, 0x9035e08e2443f774ULL, 0x52283c4c263a81e6ULL, 0x65d088cb00c391bbULL,
};

#define KR_PRIME32_1 0x9E3779B1ULL
#define KR_PRIME32_2 0x85EBCA77ULL
#define KR_PRIME32_3 0xC2B2AE3DULL
#define KR_PRIME64_1 0x9E3779B185EBCA87ULL
#define KR_PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define KR_PRIME64_3 0x165667B19E3779F9ULL
#define KR_PRIME64_4 0x85EBCA77C2B2AE63ULL
#define KR_PRIME64_5 0x27D4EB2F165667C5ULL

// Below this length xxh3 takes its short-input paths, which the host computes instead.
#define KR_MID_SIZE_MAX 240

// A little-endian 64-bit word at any address (allocations are 256-byte aligned, so the slow
// path is only taken for the unaligned last stripe of an odd-length chunk).
__device__ __forceinline__ u64 kr_load64(const unsigned char *p) {
    if ((((size_t)p) & 7) == 0) {
        return *(const u64 *)p;
    }
    u64 v = 0;
#pragma unroll
    for (int b = 7; b >= 0; --b) {
        v = (v << 8) | p[b];
    }
    return v;
}

// acc[j] += lo32(k) * hi32(k) where k = data ^ key (xxh3's accumulate step for one word).
__device__ __forceinline__ u64 kr_mul32(u64 data, u64 key) {
    u64 k = data ^ key;
    return (u64)(u32)k * (k >> 32);
}

// One range of a batched hash (`struct KrHashRange`, the host's `HashEntry`): `len` bytes at
// `addr`, cut into chunks of the launch's chunk size; the hash of its chunk k goes to
// out[out_first + k]. `work_first` numbers the chunks of all entries in order (entry e's chunks
// are work items work_first .. work_first + chunks - 1), so a chunk's entry is found by a
// binary search.
struct KrHashRange {
    u64 addr;
    u64 len;
    u64 out_first;
    u64 work_first;
};

// The 16 bytes of words 2p and 2p + 1 of a stripe, as two little-endian 64-bit words.
template <bool ALIGNED>
__device__ __forceinline__ void kr_load_pair(const unsigned char *p, u64 &w0, u64 &w1) {
    if (ALIGNED) {
        const uint4 v = __ldcs((const uint4 *)p);
        w0 = ((u64)v.y << 32) | v.x;
        w1 = ((u64)v.w << 32) | v.z;
    } else {
        w0 = kr_load64(p);
        w1 = kr_load64(p + 8);
    }
}

// xxh3_64 of the n > 240 bytes at p, computed by the 8 lanes of a group (`mask` names them,
// `q` is the lane's place in it). xxh3's eight accumulators go in pairs to the lanes: lane q
// owns accumulators 2p and 2p + 1 (p = q % 4) for the stripes of parity q / 4, so each lane
// reads 16 bytes of every other stripe (8 lanes read 128 contiguous bytes, a whole line) and
// a 1 KiB block is 8 loads of 16 bytes per lane, all in flight at once. The data half of
// xxh3's accumulate step (acc[i ^ 1] += data[i]) stays inside the lane; the two stripe
// parities add their parts with one shuffle per accumulator before the per-block scramble,
// which both lanes of a pair do on their own copies.
template <bool ALIGNED>
__device__ __forceinline__ u64 kr_hash_long(const unsigned char *p, u64 n, u32 q, u32 mask,
                                            const u64 (&k0)[8], const u64 (&k1)[8]) {
    const u32 sp = q >> 2;
    const u32 pr = q & 3;
    const u64 init[8] = {KR_PRIME32_3, KR_PRIME64_1, KR_PRIME64_2, KR_PRIME64_3,
                         KR_PRIME64_4, KR_PRIME32_2, KR_PRIME64_5, KR_PRIME32_1};
    u64 acc0 = pr == 0 ? init[0] : pr == 1 ? init[2] : pr == 2 ? init[4] : init[6];
    u64 acc1 = pr == 0 ? init[1] : pr == 1 ? init[3] : pr == 2 ? init[5] : init[7];
    const u64 sk0 = KR_SECRET[16 + 2 * pr];
    const u64 sk1 = KR_SECRET[16 + 2 * pr + 1];
    const u64 blocks = (n - 1) / 1024;
    const unsigned char *lane_p = p + sp * 64 + pr * 16;
    for (u64 b = 0; b < blocks; ++b) {
        const unsigned char *r = lane_p + b * 1024;
        u64 w0[8], w1[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            kr_load_pair<ALIGNED>(r + t * 128, w0[t], w1[t]);
        }
        u64 a0 = 0, a1 = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            a0 += kr_mul32(w0[t], k0[t]) + w1[t];
            a1 += kr_mul32(w1[t], k1[t]) + w0[t];
        }
        a0 += __shfl_xor_sync(mask, a0, 4, 8);
        a1 += __shfl_xor_sync(mask, a1, 4, 8);
        acc0 += a0;
        acc1 += a1;
        acc0 ^= acc0 >> 47;
        acc0 ^= sk0;
        acc0 *= KR_PRIME32_1;
        acc1 ^= acc1 >> 47;
        acc1 ^= sk1;
        acc1 *= KR_PRIME32_1;
    }
    // The last, partial block: its whole stripes (the stripe holding the last byte excluded),
    // without a scramble.
    {
        const u64 stripes = ((n - 1) - blocks * 1024) / 64;
        const unsigned char *r = lane_p + blocks * 1024;
        u64 a0 = 0, a1 = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            if ((u64)(2 * t + sp) < stripes) {
                u64 w0, w1;
                kr_load_pair<ALIGNED>(r + t * 128, w0, w1);
                a0 += kr_mul32(w0, k0[t]) + w1;
                a1 += kr_mul32(w1, k1[t]) + w0;
            }
        }
        a0 += __shfl_xor_sync(mask, a0, 4, 8);
        a1 += __shfl_xor_sync(mask, a1, 4, 8);
        acc0 += a0;
        acc1 += a1;
    }
    // The last stripe: the final 64 bytes (any alignment), with the secret read at 121.
    {
        u64 a0 = 0, a1 = 0;
        if (sp == 0) {
            const u64 w0 = kr_load64(p + n - 64 + pr * 16);
            const u64 w1 = kr_load64(p + n - 64 + pr * 16 + 8);
            a0 = kr_mul32(w0, KR_LAST_KEY[2 * pr]) + w1;
            a1 = kr_mul32(w1, KR_LAST_KEY[2 * pr + 1]) + w0;
        }
        a0 += __shfl_xor_sync(mask, a0, 4, 8);
        a1 += __shfl_xor_sync(mask, a1, 4, 8);
        acc0 += a0;
        acc1 += a1;
    }
    // Merge: each lane folds its pair; the four pairs are summed over the group.
    const u64 x = acc0 ^ KR_MERGE_KEY[2 * pr];
    const u64 y = acc1 ^ KR_MERGE_KEY[2 * pr + 1];
    u64 term = (x * y) ^ __umul64hi(x, y);
    term += __shfl_xor_sync(mask, term, 1, 8);
    term += __shfl_xor_sync(mask, term, 2, 8);
    u64 h = n * KR_PRIME64_1 + term;
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    h ^= h >> 32;
    return h;
}

// xxh3_64 (seed 0) of every chunk of every entry of `list`: `work` chunks in all. Eight lanes
// per chunk (see kr_hash_long); the grid strides over the chunks. Chunks of 240 bytes or less
// are left unwritten (the host hashes them: xxh3's short-input paths).
extern "C" __global__ void kreplay_hash_list(const KrHashRange *list, u64 count, u64 work,
                                             u64 chunk_size, u64 *out) {
    const u32 lane = threadIdx.x & 31;
    const u32 q = lane & 7;
    const u32 mask = 0xffu << (lane & 24);
    const u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    const u64 groups = ((u64)gridDim.x * blockDim.x) >> 3;
    // This lane's stripe keys: stripe s = 2t + q / 4, words 2p and 2p + 1 (p = q % 4) read the
    // secret at 8 * (s + 2p) and 8 * (s + 2p + 1).
    u64 k0[8], k1[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        k0[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3)];
        k1[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3) + 1];
    }
    for (u64 w = group; w < work; w += groups) {
        u64 lo = 0, hi = count;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (list[mid].work_first <= w) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const KrHashRange e = list[lo];
        const u64 k = w - e.work_first;
        const u64 start = k * chunk_size;
        const u64 n = (e.len - start < chunk_size) ? (e.len - start) : chunk_size;
        if (n <= KR_MID_SIZE_MAX) {
            continue;
        }
        const unsigned char *p = (const unsigned char *)(e.addr + start);
        const u64 h = (((size_t)p) & 15) == 0 ? kr_hash_long<true>(p, n, q, mask, k0, k1)
                                               : kr_hash_long<false>(p, n, q, mask, k0, k1);
        if (q == 0) {
            out[e.out_first + k] = h;
        }
    }
}

// A whole warp per chunk, for launches over too few chunks to fill the GPU with groups of 8:
// the same xxh3_64 as kr_hash_long, the warp's four groups of 8 lanes (j = lane / 8) summing
// the stripes of blocks j, j + 4, j + 8, ... (a block's sums do not depend on the accumulators,
// only the scramble between blocks does), so four blocks' loads are in flight per chunk instead
// of one. After each round every lane gathers the four blocks' sums with shuffles and folds them
// into its accumulators in block order; every lane ends with the same hash. The partial last
// block, the last stripe and the merge are done by every group alike (the same reads).
#define KR_FULL 0xffffffffu
#define KR_WIDE 4

template <bool ALIGNED>
__device__ __forceinline__ u64 kr_hash_wide(const unsigned char *p, u64 n, u32 lane,
                                            const u64 (&k0)[8], const u64 (&k1)[8]) {
    const u32 q = lane & 7;
    const u32 j = lane >> 3;
    const u32 sp = q >> 2;
    const u32 pr = q & 3;
    const u64 init[8] = {KR_PRIME32_3, KR_PRIME64_1, KR_PRIME64_2, KR_PRIME64_3,
                         KR_PRIME64_4, KR_PRIME32_2, KR_PRIME64_5, KR_PRIME32_1};
    u64 acc0 = pr == 0 ? init[0] : pr == 1 ? init[2] : pr == 2 ? init[4] : init[6];
    u64 acc1 = pr == 0 ? init[1] : pr == 1 ? init[3] : pr == 2 ? init[5] : init[7];
    const u64 sk0 = KR_SECRET[16 + 2 * pr];
    const u64 sk1 = KR_SECRET[16 + 2 * pr + 1];
    const u64 blocks = (n - 1) / 1024;
    const unsigned char *lane_p = p + sp * 64 + pr * 16;
    for (u64 b0 = 0; b0 < blocks; b0 += KR_WIDE) {
        const u64 b = b0 + j;
        u64 a0 = 0, a1 = 0;
        if (b < blocks) {
            const unsigned char *r = lane_p + b * 1024;
            u64 w0[8], w1[8];
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                kr_load_pair<ALIGNED>(r + t * 128, w0[t], w1[t]);
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                a0 += kr_mul32(w0[t], k0[t]) + w1[t];
                a1 += kr_mul32(w1[t], k1[t]) + w0[t];
            }
        }
        a0 += __shfl_xor_sync(KR_FULL, a0, 4);
        a1 += __shfl_xor_sync(KR_FULL, a1, 4);
#pragma unroll
        for (u32 i = 0; i < KR_WIDE; ++i) {
            const u64 s0 = __shfl_sync(KR_FULL, a0, (i << 3) | q);
            const u64 s1 = __shfl_sync(KR_FULL, a1, (i << 3) | q);
            if (b0 + i < blocks) {
                acc0 += s0;
                acc1 += s1;
                acc0 ^= acc0 >> 47;
                acc0 ^= sk0;
                acc0 *= KR_PRIME32_1;
                acc1 ^= acc1 >> 47;
                acc1 ^= sk1;
                acc1 *= KR_PRIME32_1;
            }
        }
    }
    {
        const u64 stripes = ((n - 1) - blocks * 1024) / 64;
        const unsigned char *r = lane_p + blocks * 1024;
        u64 a0 = 0, a1 = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            if ((u64)(2 * t + sp) < stripes) {
                u64 w0, w1;
                kr_load_pair<ALIGNED>(r + t * 128, w0, w1);
                a0 += kr_mul32(w0, k0[t]) + w1;
                a1 += kr_mul32(w1, k1[t]) + w0;
            }
        }
        a0 += __shfl_xor_sync(KR_FULL, a0, 4);
        a1 += __shfl_xor_sync(KR_FULL, a1, 4);
        acc0 += a0;
        acc1 += a1;
    }
    {
        u64 a0 = 0, a1 = 0;
        if (sp == 0) {
            const u64 w0 = kr_load64(p + n - 64 + pr * 16);
            const u64 w1 = kr_load64(p + n - 64 + pr * 16 + 8);
            a0 = kr_mul32(w0, KR_LAST_KEY[2 * pr]) + w1;
            a1 = kr_mul32(w1, KR_LAST_KEY[2 * pr + 1]) + w0;
        }
        a0 += __shfl_xor_sync(KR_FULL, a0, 4);
        a1 += __shfl_xor_sync(KR_FULL, a1, 4);
        acc0 += a0;
        acc1 += a1;
    }
    const u64 x = acc0 ^ KR_MERGE_KEY[2 * pr];
    const u64 y = acc1 ^ KR_MERGE_KEY[2 * pr + 1];
    u64 term = (x * y) ^ __umul64hi(x, y);
    term += __shfl_xor_sync(KR_FULL, term, 1);
    term += __shfl_xor_sync(KR_FULL, term, 2);
    u64 h = n * KR_PRIME64_1 + term;
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    h ^= h >> 32;
    return h;
}

// kreplay_hash_list with a whole warp per chunk (kr_hash_wide); blocks of a multiple of 32.
extern "C" __global__ void kreplay_hash_list_wide(const KrHashRange *list, u64 count, u64 work,
                                                  u64 chunk_size, u64 *out) {
    const u32 lane = threadIdx.x & 31;
    const u32 q = lane & 7;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    u64 k0[8], k1[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        k0[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3)];
        k1[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3) + 1];
    }
    for (u64 w = warp; w < work; w += warps) {
        u64 lo = 0, hi = count;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (list[mid].work_first <= w) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const KrHashRange e = list[lo];
        const u64 k = w - e.work_first;
        const u64 start = k * chunk_size;
        const u64 n = (e.len - start < chunk_size) ? (e.len - start) : chunk_size;
        if (n <= KR_MID_SIZE_MAX) {
            continue;
        }
        const unsigned char *p = (const unsigned char *)(e.addr + start);
        const u64 h = (((size_t)p) & 15) == 0 ? kr_hash_wide<true>(p, n, lane, k0, k1)
                                               : kr_hash_wide<false>(p, n, lane, k0, k1);
        if (lane == 0) {
            out[e.out_first + k] = h;
        }
    }
}

// One range of a verified restore (`struct KrRestoreRange`, the host's `RestoreEntry`): `len`
// bytes of live memory at `addr`, whose snapshotted bytes are at `src`, cut into chunks of the
// launch's chunk size; chunk k has global index first + k (in the snapshot's hashes and the
// bitmap of changed chunks) and is work item work_first + k.
struct KrRestoreRange {
    u64 addr;
    u64 src;
    u64 len;
    u64 first;
    u64 work_first;
};

// One entry of a gather: copy len bytes from src to dst (device addresses).
struct KrCopy {
    u64 dst;
    u64 src;
    u64 len;
};

// The detection half of a verified restore, `work` chunks in one launch. Eight lanes per chunk,
// as in kreplay_hash_list: each chunk is hashed (xxh3_64; chunks of 240 bytes or less are
// compared byte for byte with the store instead) and compared with the snapshot's hash
// snap[first + k]. A chunk that differs gets its bit in `changed` (bit g % 64 of word g / 64 for
// global chunk g) and a copy from the store appended to `found` (`found_count` entries; the host
// zeroes the bitmap and the count). kreplay_gather_found, queued right behind on the same
// stream, copies them back with whole blocks: copying inside this kernel, eight lanes of a
// 95-register kernel per chunk, moved changed chunks at a fraction of the gather's rate.
//
// kr_detect is the kernel's body, so that the restore kernel bench can build variants of it
// (other launch bounds) from the same code.
__device__ __forceinline__ void kr_detect(const KrRestoreRange *list, u64 count, u64 work,
                                          u64 chunk_size, const u64 *snap, u64 *changed,
                                          KrCopy *found, u64 *found_count) {
    const u32 lane = threadIdx.x & 31;
    const u32 q = lane & 7;
    const u32 mask = 0xffu << (lane & 24);
    const u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    const u64 groups = ((u64)gridDim.x * blockDim.x) >> 3;
    u64 k0[8], k1[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        k0[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3)];
        k1[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3) + 1];
    }
    for (u64 w = group; w < work; w += groups) {
        u64 lo = 0, hi = count;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (list[mid].work_first <= w) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const KrRestoreRange e = list[lo];
        const u64 k = w - e.work_first;
        const u64 start = k * chunk_size;
        const u64 n = (e.len - start < chunk_size) ? (e.len - start) : chunk_size;
        const unsigned char *live = (const unsigned char *)(e.addr + start);
        const unsigned char *src = (const unsigned char *)(e.src + start);
        bool differs;
        if (n <= KR_MID_SIZE_MAX) {
            u32 d = 0;
            for (u64 i = q; i < n; i += 8) {
                d |= live[i] != src[i];
            }
            d |= __shfl_xor_sync(mask, d, 1, 8);
            d |= __shfl_xor_sync(mask, d, 2, 8);
            d |= __shfl_xor_sync(mask, d, 4, 8);
            differs = d != 0;
        } else {
            // Every lane of the group ends with the same hash.
            const u64 h = (((size_t)live) & 15) == 0
                              ? kr_hash_long<true>(live, n, q, mask, k0, k1)
                              : kr_hash_long<false>(live, n, q, mask, k0, k1);
            differs = h != snap[e.first + k];
        }
        if (differs && q == 0) {
            const u64 g = e.first + k;
            atomicOr(&changed[g >> 6], 1ULL << (g & 63));
            const u64 at = atomicAdd(found_count, 1ULL);
            KrCopy c;
            c.dst = e.addr + start;
            c.src = e.src + start;
            c.len = n;
            found[at] = c;
        }
    }
}

extern "C" __global__ void kreplay_restore_verified(const KrRestoreRange *list, u64 count,
                                                    u64 work, u64 chunk_size, const u64 *snap,
                                                    u64 *changed, KrCopy *found,
                                                    u64 *found_count) {
    kr_detect(list, count, work, chunk_size, snap, changed, found, found_count);
}

// kreplay_restore_verified with a whole warp per chunk (kr_hash_wide), for launches over too
// few chunks to fill the GPU with groups of 8 lanes; the same bitmap, list and count.
extern "C" __global__ void kreplay_restore_verified_wide(const KrRestoreRange *list, u64 count,
                                                         u64 work, u64 chunk_size,
                                                         const u64 *snap, u64 *changed,
                                                         KrCopy *found, u64 *found_count) {
    const u32 lane = threadIdx.x & 31;
    const u32 q = lane & 7;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    u64 k0[8], k1[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        k0[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3)];
        k1[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3) + 1];
    }
    for (u64 w = warp; w < work; w += warps) {
        u64 lo = 0, hi = count;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (list[mid].work_first <= w) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const KrRestoreRange e = list[lo];
        const u64 k = w - e.work_first;
        const u64 start = k * chunk_size;
        const u64 n = (e.len - start < chunk_size) ? (e.len - start) : chunk_size;
        const unsigned char *live = (const unsigned char *)(e.addr + start);
        const unsigned char *src = (const unsigned char *)(e.src + start);
        bool differs;
        if (n <= KR_MID_SIZE_MAX) {
            u32 d = 0;
            for (u64 i = lane; i < n; i += 32) {
                d |= live[i] != src[i];
            }
            differs = __any_sync(KR_FULL, d) != 0;
        } else {
            const u64 h = (((size_t)live) & 15) == 0
                              ? kr_hash_wide<true>(live, n, lane, k0, k1)
                              : kr_hash_wide<false>(live, n, lane, k0, k1);
            differs = h != snap[e.first + k];
        }
        if (differs && lane == 0) {
            const u64 g = e.first + k;
            atomicOr(&changed[g >> 6], 1ULL << (g & 63));
            const u64 at = atomicAdd(found_count, 1ULL);
            KrCopy c;
            c.dst = e.addr + start;
            c.src = e.src + start;
            c.len = n;
            found[at] = c;
        }
    }
}

// The copies of `count` gather entries, one block per entry (blocks stride over the rest).
// 16-byte moves when the entry allows them, bytes otherwise.
__device__ __forceinline__ void kr_gather(const KrCopy *copies, u64 count) {
    for (u64 e = blockIdx.x; e < count; e += gridDim.x) {
        const KrCopy c = copies[e];
        if (((c.dst | c.src | c.len) & 15) == 0) {
            uint4 *d = (uint4 *)c.dst;
            const uint4 *s = (const uint4 *)c.src;
            const u64 n = c.len >> 4;
            u64 i = threadIdx.x;
            // Four 16-byte loads in flight per thread.
            for (; i + 3 * blockDim.x < n; i += 4 * blockDim.x) {
                const uint4 v0 = s[i];
                const uint4 v1 = s[i + blockDim.x];
                const uint4 v2 = s[i + 2 * blockDim.x];
                const uint4 v3 = s[i + 3 * blockDim.x];
                d[i] = v0;
                d[i + blockDim.x] = v1;
                d[i + 2 * blockDim.x] = v2;
                d[i + 3 * blockDim.x] = v3;
            }
            for (; i < n; i += blockDim.x) {
                d[i] = s[i];
            }
        } else {
            unsigned char *d = (unsigned char *)c.dst;
            const unsigned char *s = (const unsigned char *)c.src;
            for (u64 i = threadIdx.x; i < c.len; i += blockDim.x) {
                d[i] = s[i];
            }
        }
    }
}

// The copies kreplay_restore_verified found, `*count` of them (known only on the device).
extern "C" __global__ void kreplay_gather_found(const KrCopy *copies, const u64 *count) {
    kr_gather(copies, *count);
}

// One block per entry of `copies` (the host splits copies into tiles, so every entry is at most
// one tile).
extern "C" __global__ void kreplay_gather(const KrCopy *copies, u64 count) {
    kr_gather(copies, count);
}

// Read `words` 16-byte words once; store only if their xor is a value no data has (so the
// loads cannot be dropped). Each thread keeps eight 16-byte loads in flight.
extern "C" __global__ void kreplay_read_once(const uint4 *p, u64 words, u64 *sink) {
    u64 x = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 7 * stride < words; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            v[k] = __ldcs(p + i + k * stride);
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            x ^= ((u64)(v[k].x ^ v[k].z) << 32) | (v[k].y ^ v[k].w);
        }
    }
    for (; i < words; i += stride) {
        const uint4 v = __ldcs(p + i);
        x ^= ((u64)(v.x ^ v.z) << 32) | (v.y ^ v.w);
    }
    if (x == 0x6b72706c61792121ULL) {
        *sink = x;
    }
}

// For tests and the bench: add 1 to the 32-bit words of `runs` runs of `run_words` words,
// run r starting at word r * stride_words.
extern "C" __global__ void kreplay_add_one_runs(u32 *p, u64 runs, u64 run_words, u64 stride_words) {
    const u64 total = runs * run_words;
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const u64 r = i / run_words;
        p[r * stride_words + (i - r * run_words)] += 1;
    }
}
