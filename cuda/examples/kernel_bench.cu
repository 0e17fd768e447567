// Device kernels of kreplay against each other and against the machine's ceilings, on one
// GPU, in one run: the copy engine's device-to-device copy, read-only kernels of several
// shapes (the read ceiling), the first warp-per-chunk hash kernel and the committed
// eight-lanes-per-chunk one, over a footprint of FOOTPRINT_GIB. Built and run on the GPU machine:
//
//   nvcc -O3 -arch=sm_90 -o kernel_bench cuda/examples/kernel_bench.cu
//   ./kernel_bench 32 20 [PTX]  # footprint in GiB, timed repetitions (median reported)
//
// With PTX (the committed kreplay_kernels.ptx) it also times that PTX's read_once and hash
// kernels as the crate runs them: JIT-compiled by the driver (cuModuleLoadData) and launched
// with cuLaunchKernel, timed with events and with the host clock around launch and wait.
//
// Every hash variant's output is compared with the first kernel's (which the crate's GPU test
// compares with the host's xxh3_64) over the whole footprint and over unaligned and odd-sized
// ranges; a difference fails the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cuda.h>
#include <cstdlib>
#include <vector>

#include "../kernels/kreplay_kernels.cu"

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__device__ __forceinline__ u64 kr_shfl(u64 v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

// The first hash kernel (one warp per chunk, 8-byte loads), kept here as the reference.
// One warp per chunk. xxh3's eight accumulators are split over the warp: lane l works on
// accumulator j = l % 8 and, in each 1 KiB block (16 stripes of 64 bytes), on stripes
// l / 8, l / 8 + 4, l / 8 + 8, l / 8 + 12, reading word j of each (so a warp load covers 256
// contiguous bytes). Within a block the additions commute, so the four lanes of one
// accumulator sum their parts and exchange them with two shuffles; the data half of the
// accumulate step belongs to accumulator j ^ 1, one more shuffle. The scramble between blocks
// is per accumulator, done by each lane on its own copy.
extern "C" __global__ void kreplay_hash_chunks_v1(const unsigned char *base, u64 len, u64 chunk_size,
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


// Read-only kernels: U 16-byte loads in flight per thread, streaming (CS) or plain loads.
template <int U, bool CS>
__global__ void read_kernel(const uint4 *p, u64 words, u64 *sink) {
    u64 x = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < words; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            v[k] = CS ? __ldcs(p + i + k * stride) : p[i + k * stride];
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            x ^= ((u64)(v[k].x ^ v[k].z) << 32) | (v[k].y ^ v[k].w);
        }
    }
    for (; i < words; i += stride) {
        const uint4 v = p[i];
        x ^= ((u64)(v.x ^ v.z) << 32) | (v.y ^ v.w);
    }
    if (x == 0x6b72706c61792121ULL) {
        *sink = x;
    }
}

// Block-contiguous read: each block reads TILE bytes in a row per step (the hash's pattern).
template <int U>
__global__ void read_tiles(const uint4 *p, u64 words, u64 *sink) {
    u64 x = 0;
    const u64 tile = (u64)blockDim.x * U;
    for (u64 t = (u64)blockIdx.x * tile; t < words; t += (u64)gridDim.x * tile) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 i = t + k * blockDim.x + threadIdx.x;
            v[k] = i < words ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            x ^= ((u64)(v[k].x ^ v[k].z) << 32) | (v[k].y ^ v[k].w);
        }
    }
    if (x == 0x6b72706c61792121ULL) {
        *sink = x;
    }
}

__global__ void fill(u64 *p, u64 n, u64 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 x = (i + 1) * 0x9E3779B97F4A7C15ULL ^ seed;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ULL;
        x ^= x >> 29;
        p[i] = x;
    }
}

static cudaEvent_t ev0, ev1;
template <class F>
static float median_ms(int reps, F f) {
    f();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(ev0));
        f();
        CK(cudaEventRecord(ev1));
        CK(cudaEventSynchronize(ev1));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static int sms;
static void row(const char *name, float ms, double bytes_counted) {
    printf("%-44s %9.3f ms %7.3f TB/s\n", name, ms, bytes_counted / (ms * 1e-3) / 1e12);
    fflush(stdout);
}

// Hash [p, p + len) in chunks of cs with the new kernel into out (device), `grid` blocks of 256.
static void hash_new(const unsigned char *p, u64 len, u64 cs, u64 *out, KrHashRange *dlist,
                     unsigned grid) {
    KrHashRange e = {(u64)p, len, 0, 0};
    CK(cudaMemcpy(dlist, &e, sizeof e, cudaMemcpyHostToDevice));
    const u64 work = (len + cs - 1) / cs;
    if (grid == 0) grid = (unsigned)std::max<u64>(1, (work + 31) / 32);
    kreplay_hash_list<<<grid, 256>>>(dlist, 1, work, cs, out);
}

static void hash_old(const unsigned char *p, u64 len, u64 cs, u64 *out) {
    const u64 chunks = (len + cs - 1) / cs;
    kreplay_hash_chunks_v1<<<(unsigned)std::max<u64>(1, (chunks + 7) / 8), 256>>>(p, len, cs, chunks, out);
}

static int compare(const char *what, const unsigned char *p, u64 len, u64 cs, u64 *a, u64 *b,
                   KrHashRange *dlist, unsigned grid) {
    const u64 chunks = (len + cs - 1) / cs;
    CK(cudaMemset(a, 0, chunks * 8));
    CK(cudaMemset(b, 0, chunks * 8));
    hash_old(p, len, cs, a);
    hash_new(p, len, cs, b, dlist, grid);
    CK(cudaDeviceSynchronize());
    std::vector<u64> ha(chunks), hb(chunks);
    CK(cudaMemcpy(ha.data(), a, chunks * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, chunks * 8, cudaMemcpyDeviceToHost));
    u64 wrong = 0;
    for (u64 i = 0; i < chunks; ++i) wrong += ha[i] != hb[i];
    printf("check %-36s %llu chunks, %llu differ\n", what, chunks, wrong);
    return wrong != 0;
}

int main(int argc, char **argv) {
    const u64 gib = argc > 1 ? strtoull(argv[1], 0, 10) : 32;
    const int reps = argc > 2 ? atoi(argv[2]) : 20;
    const u64 bytes = gib << 30;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MiB, footprint %llu GiB, median of %d\n", prop.name, sms,
           prop.l2CacheSize >> 20, gib, reps);
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    unsigned char *a, *b;
    u64 *sink, *h1, *h2;
    KrHashRange *dlist;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMalloc(&sink, 64));
    const u64 cs = 64 << 10;
    const u64 chunks = bytes / cs;
    CK(cudaMalloc(&h1, (chunks + 1024) * 8));
    CK(cudaMalloc(&h2, (chunks + 1024) * 8));
    CK(cudaMalloc(&dlist, 4096));
    fill<<<sms * 8, 256>>>((u64 *)a, bytes / 8, 1);
    fill<<<sms * 8, 256>>>((u64 *)b, bytes / 8, 2);
    CK(cudaDeviceSynchronize());

    int bad = 0;
    bad |= compare("whole footprint, 64 KiB chunks", a, bytes, cs, h1, h2, dlist, 0);
    bad |= compare("whole footprint, capped grid", a, bytes, cs, h1, h2, dlist, sms * 8);
    bad |= compare("1 MiB + 241 at +0, 64 KiB", a, (1 << 20) + 241, cs, h1, h2, dlist, 0);
    bad |= compare("4 MiB + 100, 64 KiB", a, (4 << 20) + 100, cs, h1, h2, dlist, 0);
    bad |= compare("3 KiB + 777, 512", a, 3 * 1024 + 777, 512, h1, h2, dlist, 0);
    bad |= compare("1025, 1024", a, 1025, 1024, h1, h2, dlist, 0);
    bad |= compare("+3: 2 MiB + 13, 4096", a + 3, (2 << 20) + 13, 4096, h1, h2, dlist, 0);
    bad |= compare("+8: 300, 512", a + 8, 300, 512, h1, h2, dlist, 0);
    bad |= compare("+16: 8 MiB + 1000, 1 MiB", a + 16, (8 << 20) + 1000, 1 << 20, h1, h2, dlist, 0);
    bad |= compare("+64: 1 MiB, 4 KiB", a + 64, 1 << 20, 4096, h1, h2, dlist, 0);

    const double B = (double)bytes;
    row("copy: cudaMemcpy DtoD (footprint, 2x counted)",
        median_ms(reps, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }), 2 * B);
    row("read_once committed (8 x 16 B cs, 16 blk/SM)",
        median_ms(reps, [&] { kreplay_read_once<<<sms * 16, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
    for (int per : {8, 32}) {
        char name[96];
        snprintf(name, sizeof name, "read U=4 plain, %d blk/SM", per);
        row(name, median_ms(reps, [&] { read_kernel<4, false><<<sms * per, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
        snprintf(name, sizeof name, "read U=8 cs, %d blk/SM", per);
        row(name, median_ms(reps, [&] { read_kernel<8, true><<<sms * per, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
        snprintf(name, sizeof name, "read U=8 plain, %d blk/SM", per);
        row(name, median_ms(reps, [&] { read_kernel<8, false><<<sms * per, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
        snprintf(name, sizeof name, "read U=16 cs, %d blk/SM", per);
        row(name, median_ms(reps, [&] { read_kernel<16, true><<<sms * per, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
        snprintf(name, sizeof name, "read tiles U=8, %d blk/SM", per);
        row(name, median_ms(reps, [&] { read_tiles<8><<<sms * per, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
    }
    row("read tiles U=8, one tile per block",
        median_ms(reps, [&] { read_tiles<8><<<(unsigned)(bytes / 16 / 2048), 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
    row("hash v1 (warp per chunk, 8 B loads)", median_ms(reps, [&] { hash_old(a, bytes, cs, h1); }), B);
    KrHashRange e = {(u64)a, bytes, 0, 0};
    CK(cudaMemcpy(dlist, &e, sizeof e, cudaMemcpyHostToDevice));
    row("hash_list, one chunk per group",
        median_ms(reps, [&] { kreplay_hash_list<<<(unsigned)((chunks + 31) / 32), 256>>>(dlist, 1, chunks, cs, h2); }), B);
    for (int per : {2, 4, 8, 16}) {
        char name[96];
        snprintf(name, sizeof name, "hash_list, %d blk/SM (grid stride)", per);
        row(name, median_ms(reps, [&] { kreplay_hash_list<<<sms * per, 256>>>(dlist, 1, chunks, cs, h2); }), B);
    }
    for (int threads : {128, 512}) {
        char name[96];
        snprintf(name, sizeof name, "hash_list, %d threads, one chunk per group", threads);
        row(name, median_ms(reps, [&] { kreplay_hash_list<<<(unsigned)((chunks * 8 + threads - 1) / threads), threads>>>(dlist, 1, chunks, cs, h2); }), B);
    }
    // Many entries: the footprint as 1 MiB pieces (the snapshot's piece size), skipping every
    // 100th piece (a verified write set's holes).
    {
        std::vector<KrHashRange> list;
        u64 work = 0;
        const u64 piece = 1 << 20;
        for (u64 off = 0, i = 0; off < bytes; off += piece, ++i) {
            if (i % 100 == 0) continue;
            list.push_back({(u64)a + off, piece, off / cs, work});
            work += piece / cs;
            if (list.size() * sizeof(KrHashRange) >= 4096 * 256) break;
        }
        KrHashRange *dl;
        CK(cudaMalloc(&dl, list.size() * sizeof(KrHashRange)));
        CK(cudaMemcpy(dl, list.data(), list.size() * sizeof(KrHashRange), cudaMemcpyHostToDevice));
        char name[96];
        snprintf(name, sizeof name, "hash_list, %zu entries (99%% of pieces)", list.size());
        const double hb = (double)work * cs;
        row(name, median_ms(reps, [&] { kreplay_hash_list<<<(unsigned)((work + 31) / 32), 256>>>(dl, list.size(), work, cs, h2); }), hb);
        CK(cudaFree(dl));
    }
    // The same kernels from the committed PTX, JIT-compiled by the driver as the crate loads
    // them, on the random data and then on constant data.
    if (argc > 3) {
        FILE *f = fopen(argv[3], "rb");
        if (!f) {
            perror(argv[3]);
            return 1;
        }
        std::vector<char> text(64 << 20);
        const size_t n = fread(text.data(), 1, text.size() - 1, f);
        text[n] = 0;
        fclose(f);
        CUmodule mod;
        CUfunction fr, fh;
        if (cuModuleLoadData(&mod, text.data()) != CUDA_SUCCESS ||
            cuModuleGetFunction(&fr, mod, "kreplay_read_once") != CUDA_SUCCESS ||
            cuModuleGetFunction(&fh, mod, "kreplay_hash_list") != CUDA_SUCCESS) {
            printf("cannot load %s\n", argv[3]);
            return 1;
        }
        u64 words = bytes / 16;
        const unsigned char *ap = a;
        void *rargs[] = {&ap, &words, &sink};
        u64 one = 1, cs_ = cs, work = chunks;
        void *hargs[] = {&dlist, &one, &work, &cs_, &h2};
        auto jit_read = [&] { cuLaunchKernel(fr, sms * 16, 1, 1, 256, 1, 1, 0, 0, rargs, 0); };
        auto jit_hash = [&] {
            cuLaunchKernel(fh, (unsigned)((chunks + 31) / 32), 1, 1, 256, 1, 1, 0, 0, hargs, 0);
        };
        auto host_clock = [&](auto f) {
            std::vector<double> t;
            for (int r = 0; r < reps; ++r) {
                auto t0 = std::chrono::steady_clock::now();
                f();
                CK(cudaDeviceSynchronize());
                t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(t.begin(), t.end());
            return (float)t[t.size() / 2];
        };
        for (int pass = 0; pass < 2; ++pass) {
            const char *data = pass == 0 ? "random" : "constant";
            if (pass == 1) {
                CK(cudaMemset(a, 1, bytes));
                CK(cudaDeviceSynchronize());
            }
            char name[96];
            snprintf(name, sizeof name, "PTX JIT read_once, events, %s data", data);
            row(name, median_ms(reps, jit_read), B);
            snprintf(name, sizeof name, "PTX JIT read_once, host clock, %s data", data);
            row(name, host_clock(jit_read), B);
            snprintf(name, sizeof name, "PTX JIT hash_list, events, %s data", data);
            row(name, median_ms(reps, jit_hash), B);
            snprintf(name, sizeof name, "PTX JIT hash_list, host clock, %s data", data);
            row(name, host_clock(jit_hash), B);
            snprintf(name, sizeof name, "sm_90 read_once, events, %s data", data);
            row(name, median_ms(reps, [&] { kreplay_read_once<<<sms * 16, 256>>>((const uint4 *)a, bytes / 16, sink); }), B);
            snprintf(name, sizeof name, "sm_90 hash_list, events, %s data", data);
            row(name, median_ms(reps, [&] { kreplay_hash_list<<<(unsigned)((chunks + 31) / 32), 256>>>(dlist, 1, chunks, cs, h2); }), B);
            row("copy DtoD (2x counted)", median_ms(reps, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }), 2 * B);
        }
    }
    printf(bad ? "RESULT: hash variants DIFFER\n" : "RESULT: hash variants agree\n");
    return bad;
}
