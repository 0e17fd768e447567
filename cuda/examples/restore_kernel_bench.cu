// The device half of a verified restore and of a full restore, kernel against kernel, on one
// GPU, in one run: the committed detection and copy pair (kreplay_restore_verified listing the
// changed chunks, kreplay_gather_found copying them, queued behind it) against a fused variant
// that copies each changed chunk with its block right after checking it; the copy launch alone
// in several shapes; copy kernels and the gather against the copy engine over the whole
// footprint (the full restore's method).
// Built and run on the GPU machine:
//
//   nvcc -O3 -arch=sm_90 -o restore_kernel_bench cuda/examples/restore_kernel_bench.cu
//   ./restore_kernel_bench 32 5   # footprint in GiB, timed repetitions (median reported)
//
// A live footprint and its shadow (the snapshot's store) of FOOTPRINT_GIB each, 64 KiB chunks,
// pseudo-random bytes; a written fraction is evenly spread 64 KiB runs of x += 1 (as the
// crate's bench writes them). Times are CUDA events around the device work only (the bitmap's
// zeroing included, the host's bookkeeping not). After every timed restore the live footprint
// is compared with the shadow word by word and the bitmap's bits are counted: a difference, or
// a count other than the chunks written, fails the run.
#include <algorithm>
#include <cstdio>
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

// Copy one chunk with all threads of the block (16-byte moves, eight in flight per thread,
// when the chunk allows them; bytes otherwise).
__device__ __forceinline__ void kr_block_copy(u64 dst, u64 src, u64 len) {
    if (((dst | src | len) & 15) == 0) {
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        const u64 n = len >> 4;
        const u64 step = blockDim.x;
        u64 i = threadIdx.x;
        for (; i + 7 * step < n; i += 8 * step) {
            uint4 v[8];
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                v[t] = __ldcs(s + i + t * step);
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                d[i + t * step] = v[t];
            }
        }
        for (; i < n; i += step) {
            d[i] = __ldcs(s + i);
        }
    } else {
        unsigned char *d = (unsigned char *)dst;
        const unsigned char *s = (const unsigned char *)src;
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            d[i] = s[i];
        }
    }
}

// The fused variant tried against the committed pair: detection as kreplay_restore_verified,
// but a changed chunk is copied back by the whole block right after the block's 32 chunks are
// checked (while the other blocks on the SM go on hashing), with no copy launch behind it. The
// blocks stride over the chunks together, so every thread meets the same barriers.
extern "C" __global__ void fused_restore_verified(const KrRestoreRange *list, u64 count, u64 work,
                                                  u64 chunk_size, const u64 *snap, u64 *changed) {
    __shared__ u64 s_dst[32];
    __shared__ u64 s_src[32];
    __shared__ u64 s_len[32];
    __shared__ u32 s_found;
    const u32 lane = threadIdx.x & 31;
    const u32 q = lane & 7;
    const u32 mask = 0xffu << (lane & 24);
    const u64 per_block = blockDim.x >> 3;
    u64 k0[8], k1[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        k0[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3)];
        k1[t] = KR_SECRET[2 * t + (q >> 2) + 2 * (q & 3) + 1];
    }
    for (u64 base = (u64)blockIdx.x * per_block; base < work; base += (u64)gridDim.x * per_block) {
        if (threadIdx.x == 0) {
            s_found = 0;
        }
        __syncthreads();
        const u64 w = base + (threadIdx.x >> 3);
        if (w < work) {
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
            const u64 h = kr_hash_long<true>(live, n, q, mask, k0, k1);
            if (h != snap[e.first + k] && q == 0) {
                const u64 g = e.first + k;
                atomicOr(&changed[g >> 6], 1ULL << (g & 63));
                const u32 at = atomicAdd(&s_found, 1u);
                s_dst[at] = e.addr + start;
                s_src[at] = e.src + start;
                s_len[at] = n;
            }
        }
        __syncthreads();
        const u32 found = s_found;
        for (u32 i = 0; i < found; ++i) {
            kr_block_copy(s_dst[i], s_src[i], s_len[i]);
        }
        __syncthreads();
    }
}

// A gather with eight 16-byte loads in flight per thread (kr_gather keeps four).
__global__ void gather8(const KrCopy *copies, u64 count) {
    for (u64 e = blockIdx.x; e < count; e += gridDim.x) {
        const KrCopy c = copies[e];
        kr_block_copy(c.dst, c.src, c.len);
    }
}

// A grid-striding copy of `words` 16-byte words, LOADS loads in flight per thread.
template <int LOADS>
__global__ void copy_grid(uint4 *d, const uint4 *s, u64 words) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (LOADS - 1) * stride < words; i += LOADS * stride) {
        uint4 v[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            v[k] = __ldcs(s + i + k * stride);
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            d[i + k * stride] = v[k];
        }
    }
    for (; i < words; i += stride) {
        d[i] = s[i];
    }
}

__global__ void fill_noise(u64 *p, u64 words, u64 seed) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        u64 z = (i + seed) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        p[i] = z ^ (z >> 31);
    }
}

__global__ void count_diff(const uint4 *a, const uint4 *b, u64 words, unsigned long long *out) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    unsigned long long n = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const uint4 x = a[i], y = b[i];
        n += (x.x != y.x) | (x.y != y.y) | (x.z != y.z) | (x.w != y.w);
    }
    if (n) {
        atomicAdd(out, n);
    }
}

__global__ void popcount_bits(const u64 *bits, u64 words, unsigned long long *out) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    unsigned long long n = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        n += __popcll(bits[i]);
    }
    if (n) {
        atomicAdd(out, n);
    }
}

static cudaEvent_t ev0, ev1;

template <class P, class T, class C>
static float median_ms(int reps, P prepare, T timed, C check) {
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
        prepare();
        CK(cudaEventRecord(ev0));
        timed();
        CK(cudaEventRecord(ev1));
        CK(cudaEventSynchronize(ev1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        t.push_back(ms);
        check();
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    const u64 gib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 32;
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    const u64 bytes = gib << 30, cs = 64 << 10, chunks = bytes / cs, words = bytes / 16;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, footprint %llu GiB (x2 with the shadow), median of %d\n", prop.name,
           sms, gib, reps);
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    unsigned char *live, *shadow;
    CK(cudaMalloc(&live, bytes));
    CK(cudaMalloc(&shadow, bytes));
    fill_noise<<<sms * 16, 256>>>((u64 *)live, bytes / 8, 12345);
    CK(cudaMemcpy(shadow, live, bytes, cudaMemcpyDeviceToDevice));
    u64 *snap, *bits, *count;
    KrCopy *found;
    unsigned long long *diff;
    KrRestoreRange *dlist;
    KrHashRange *hlist;
    CK(cudaMalloc(&snap, chunks * 8));
    CK(cudaMalloc(&bits, (chunks / 64 + 1) * 8));
    count = bits + chunks / 64;
    CK(cudaMalloc(&found, chunks * sizeof(KrCopy)));
    CK(cudaMalloc(&diff, 16));
    CK(cudaMalloc(&dlist, sizeof(KrRestoreRange)));
    CK(cudaMalloc(&hlist, sizeof(KrHashRange)));
    const KrRestoreRange r = {(u64)live, (u64)shadow, bytes, 0, 0};
    const KrHashRange h = {(u64)shadow, bytes, 0, 0};
    CK(cudaMemcpy(dlist, &r, sizeof r, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(hlist, &h, sizeof h, cudaMemcpyHostToDevice));
    kreplay_hash_list<<<(unsigned)((chunks + 31) / 32), 256>>>(hlist, 1, chunks, cs, snap);
    CK(cudaDeviceSynchronize());
    const unsigned hash_blocks = (unsigned)((chunks + 31) / 32);
    const double B = (double)bytes;
    auto row = [&](const char *what, float ms, double moved) {
        printf("%-62s %9.3f ms %6.2f TB/s\n", what, ms, moved / (ms * 1e-3) / 1e12);
    };
    auto nothing = [] {};

    // Ceilings over the whole footprint.
    row("copy engine, cudaMemcpyAsync DtoD (read + write)",
        median_ms(reps, nothing, [&] { CK(cudaMemcpyAsync(shadow, live, bytes, cudaMemcpyDeviceToDevice)); }, nothing), 2 * B);
    for (int per : {2, 4, 8, 16}) {
        char name[96];
        snprintf(name, sizeof name, "copy kernel, 8 loads/thread, %d blocks/SM (read + write)", per);
        row(name, median_ms(reps, nothing, [&] { copy_grid<8><<<sms * per, 256>>>((uint4 *)shadow, (const uint4 *)live, words); }, nothing), 2 * B);
        snprintf(name, sizeof name, "copy kernel, 4 loads/thread, %d blocks/SM (read + write)", per);
        row(name, median_ms(reps, nothing, [&] { copy_grid<4><<<sms * per, 256>>>((uint4 *)shadow, (const uint4 *)live, words); }, nothing), 2 * B);
    }
    {
        std::vector<KrCopy> tiles;
        for (u64 off = 0; off < bytes; off += 1 << 20) {
            tiles.push_back({(u64)shadow + off, (u64)live + off, 1 << 20});
        }
        KrCopy *dt;
        CK(cudaMalloc(&dt, tiles.size() * sizeof(KrCopy)));
        CK(cudaMemcpy(dt, tiles.data(), tiles.size() * sizeof(KrCopy), cudaMemcpyHostToDevice));
        row("kreplay_gather, 1 MiB tiles (read + write)",
            median_ms(reps, nothing, [&] { kreplay_gather<<<(unsigned)tiles.size(), 256>>>(dt, tiles.size()); }, nothing), 2 * B);
        row("gather8, 1 MiB tiles (read + write)",
            median_ms(reps, nothing, [&] { gather8<<<(unsigned)tiles.size(), 256>>>(dt, tiles.size()); }, nothing), 2 * B);
        CK(cudaFree(dt));
    }
    row("kreplay_read_once, 16 blocks/SM", median_ms(reps, nothing, [&] { kreplay_read_once<<<sms * 16, 256>>>((const uint4 *)live, words, (u64 *)diff); }, nothing), B);
    row("kreplay_hash_list, one chunk per group", median_ms(reps, nothing, [&] { kreplay_hash_list<<<hash_blocks, 256>>>(hlist, 1, chunks, cs, snap); }, nothing), B);
    CK(cudaMemcpy(live, shadow, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());

    bool ok = true;
    for (double f : {0.0, 0.001, 0.01, 0.1, 1.0}) {
        const u64 runs = f == 0 ? 0 : std::max<u64>(1, (u64)(chunks * f));
        const u64 stride = runs ? chunks / runs : 0;
        const u64 run_words = cs / 4;
        auto write = [&] {
            if (runs) {
                kreplay_add_one_runs<<<(unsigned)std::min<u64>((runs * run_words + 255) / 256, 1 << 20), 256>>>(
                    (u32 *)live, runs, run_words, stride * run_words);
            }
        };
        auto check = [&] {
            unsigned long long h[2];
            CK(cudaMemset(diff, 0, 16));
            count_diff<<<sms * 16, 256>>>((const uint4 *)live, (const uint4 *)shadow, words, diff);
            popcount_bits<<<sms * 4, 256>>>(bits, chunks / 64, diff + 1);
            CK(cudaMemcpy(h, diff, 16, cudaMemcpyDeviceToHost));
            if (h[0] != 0 || h[1] != runs) {
                printf("FAIL at %.1f%%: %llu words differ, %llu bits set, %llu chunks written\n",
                       f * 100, h[0], h[1], (unsigned long long)runs);
                ok = false;
            }
        };
        printf("-- written %.1f%% (%llu chunks of 64 KiB, %.1f MB)\n", f * 100, (unsigned long long)runs,
               runs * (double)cs / 1e6);
        auto zero = [&] { CK(cudaMemsetAsync(bits, 0, (chunks / 64 + 1) * 8)); };
        row("  kreplay_restore_verified + kreplay_gather_found (committed)",
            median_ms(reps, write, [&] {
                zero();
                kreplay_restore_verified<<<hash_blocks, 256>>>(dlist, 1, chunks, cs, snap, bits, found, count);
                kreplay_gather_found<<<(unsigned)std::min<u64>(chunks, 2048), 256>>>(found, count);
            }, check), B);
        row("  fused: each block copies the changed chunks it found",
            median_ms(reps, write, [&] {
                zero();
                fused_restore_verified<<<hash_blocks, 256>>>(dlist, 1, chunks, cs, snap, bits);
            }, check), B);
        for (int per : {4, 16}) {
            char name[96];
            snprintf(name, sizeof name, "  fused, %d blocks/SM striding", per);
            row(name, median_ms(reps, write, [&] {
                zero();
                fused_restore_verified<<<sms * per, 256>>>(dlist, 1, chunks, cs, snap, bits);
            }, check), B);
        }
        // The copy launches alone, over the list the old detection made.
        if (runs) {
            write();
            zero();
            kreplay_restore_verified<<<hash_blocks, 256>>>(dlist, 1, chunks, cs, snap, bits, found, count);
            CK(cudaDeviceSynchronize());
            const double moved = 2.0 * runs * cs;
            row("  found copy alone, 2048 blocks, 4 loads (read + write)",
                median_ms(reps, nothing, [&] { kreplay_gather_found<<<(unsigned)std::min<u64>(chunks, 2048), 256>>>(found, count); }, nothing), moved);
            row("  found copy alone, one block per chunk, 4 loads",
                median_ms(reps, nothing, [&] { kreplay_gather<<<(unsigned)runs, 256>>>(found, runs); }, nothing), moved);
            row("  found copy alone, one block per chunk, 8 loads",
                median_ms(reps, nothing, [&] { gather8<<<(unsigned)runs, 256>>>(found, runs); }, nothing), moved);
            row("  found copy alone, 2048 blocks, 8 loads",
                median_ms(reps, nothing, [&] { gather8<<<(unsigned)std::min<u64>(runs, 2048), 256>>>(found, runs); }, nothing), moved);
            // Restore the live footprint for the next fraction.
            CK(cudaMemcpy(live, shadow, bytes, cudaMemcpyDeviceToDevice));
        }
    }
    CK(cudaDeviceSynchronize());
    printf(ok ? "all restores verified\n" : "FAILED\n");
    return ok ? 0 : 1;
}
