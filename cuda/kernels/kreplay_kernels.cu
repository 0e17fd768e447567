// kreplay's device kernels for the CUDA backend.
//
// Built into PTX (kreplay_kernels.ptx beside this file) by `cargo xtask ptx`, which runs
//   nvcc -ptx -arch=compute_75 -O3 cuda/kernels/kreplay_kernels.cu -o cuda/kernels/kreplay_kernels.ptx
// The PTX is committed; at run time the driver JIT-compiles it for the GPU at hand
// (cuModuleLoadData), so building kreplay needs no CUDA toolkit.
//
// * kreplay_hash_chunks: one xxh3_64 (seed 0) per chunk of a device range, bit for bit the
//   hash the snapshot crate computes on the host (xxhash-rust's xxh3_64), so device and host
//   hashes can be compared. One warp per chunk; the range is read once.
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

__device__ __forceinline__ u64 kr_shfl(u64 v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

// One warp per chunk. xxh3's eight accumulators are split over the warp: lane l works on
// accumulator j = l % 8 and, in each 1 KiB block (16 stripes of 64 bytes), on stripes
// l / 8, l / 8 + 4, l / 8 + 8, l / 8 + 12, reading word j of each (so a warp load covers 256
// contiguous bytes). Within a block the additions commute, so the four lanes of one
// accumulator sum their parts and exchange them with two shuffles; the data half of the
// accumulate step belongs to accumulator j ^ 1, one more shuffle. The scramble between blocks
// is per accumulator, done by each lane on its own copy.
extern "C" __global__ void kreplay_hash_chunks(const unsigned char *base, u64 len, u64 chunk_size,
                                               u64 chunks, u64 *out) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u32 j = lane & 7;
    const u32 quarter = lane >> 3;
    const u64 key_scramble = KR_SECRET[16 + j];
    const u64 init[8] = {KR_PRIME32_3, KR_PRIME64_1, KR_PRIME64_2, KR_PRIME64_3,
                         KR_PRIME64_4, KR_PRIME32_2, KR_PRIME64_5, KR_PRIME32_1};
    // Stripe keys of this lane's four stripes: stripe s, word j reads the secret at 8 * (s + j).
    u64 key[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        key[k] = KR_SECRET[quarter + 4 * k + j];
    }

    for (u64 c = warp; c < chunks; c += warps) {
        const u64 start = c * chunk_size;
        const u64 n = (len - start < chunk_size) ? (len - start) : chunk_size;
        if (n <= KR_MID_SIZE_MAX) {
            continue;
        }
        const unsigned char *p = base + start;
        u64 acc = init[j];
        const u64 blocks = (n - 1) / 1024;
        for (u64 b = 0; b < blocks; ++b) {
            const unsigned char *q = p + b * 1024 + quarter * 64 + j * 8;
            u64 d[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                d[k] = kr_load64(q + k * 256);
            }
            u64 prod = 0, data = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                prod += kr_mul32(d[k], key[k]);
                data += d[k];
            }
            prod += kr_shfl(prod, 8);
            prod += kr_shfl(prod, 16);
            data += kr_shfl(data, 8);
            data += kr_shfl(data, 16);
            acc += prod + kr_shfl(data, 1);
            acc ^= acc >> 47;
            acc ^= key_scramble;
            acc *= KR_PRIME32_1;
        }
        // The last, partial block: its whole stripes (the stripe holding the last byte
        // excluded), without a scramble.
        const u64 stripes = ((n - 1) - blocks * 1024) / 64;
        {
            const unsigned char *q = p + blocks * 1024 + quarter * 64 + j * 8;
            u64 prod = 0, data = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                if ((u64)(quarter + 4 * k) < stripes) {
                    const u64 d = kr_load64(q + k * 256);
                    prod += kr_mul32(d, key[k]);
                    data += d;
                }
            }
            prod += kr_shfl(prod, 8);
            prod += kr_shfl(prod, 16);
            data += kr_shfl(data, 8);
            data += kr_shfl(data, 16);
            acc += prod + kr_shfl(data, 1);
        }
        // The last stripe: the final 64 bytes, with the secret read at 121.
        {
            u64 prod = 0, data = 0;
            if (quarter == 0) {
                const u64 d = kr_load64(p + n - 64 + j * 8);
                prod = kr_mul32(d, KR_LAST_KEY[j]);
                data = d;
            }
            prod += kr_shfl(prod, 8);
            prod += kr_shfl(prod, 16);
            data += kr_shfl(data, 8);
            data += kr_shfl(data, 16);
            acc += prod + kr_shfl(data, 1);
        }
        // Merge: lane 0 collects the eight accumulators.
        u64 a[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            a[i] = __shfl_sync(0xffffffffu, acc, i);
        }
        if (lane == 0) {
            u64 h = n * KR_PRIME64_1;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u64 x = a[2 * i] ^ KR_MERGE_KEY[2 * i];
                const u64 y = a[2 * i + 1] ^ KR_MERGE_KEY[2 * i + 1];
                h += (x * y) ^ __umul64hi(x, y);
            }
            h ^= h >> 37;
            h *= 0x165667919E3779F9ULL;
            h ^= h >> 32;
            out[c] = h;
        }
    }
}

// One entry of a gather: copy len bytes from src to dst (device addresses).
struct KrCopy {
    u64 dst;
    u64 src;
    u64 len;
};

// One block per entry of `copies` (the host splits copies into tiles, so every entry is at most
// one tile). 16-byte moves when the entry allows them, bytes otherwise.
extern "C" __global__ void kreplay_gather(const KrCopy *copies, u64 count) {
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

// Read `words` 16-byte words once; store only if their xor is a value no data has (so the
// loads cannot be dropped).
extern "C" __global__ void kreplay_read_once(const uint4 *p, u64 words, u64 *sink) {
    u64 x = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < words; i += 4 * stride) {
        const uint4 v0 = p[i];
        const uint4 v1 = p[i + stride];
        const uint4 v2 = p[i + 2 * stride];
        const uint4 v3 = p[i + 3 * stride];
        x ^= ((u64)(v0.x ^ v1.x ^ v2.x ^ v3.x) << 32) | (v0.y ^ v1.y ^ v2.y ^ v3.y);
        x ^= ((u64)(v0.z ^ v1.z ^ v2.z ^ v3.z) << 32) | (v0.w ^ v1.w ^ v2.w ^ v3.w);
    }
    for (; i < words; i += stride) {
        const uint4 v = p[i];
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
