// The device half of a verified restore and of a full restore, kernel against kernel, on one
// GPU, in one run: the committed detection and copy pair (kreplay_restore_verified listing the
// changed chunks, kreplay_gather_found copying them, queued behind it) against a fused variant
// that copies each changed chunk with its block right after checking it; the copy launch alone
// in several shapes; copy kernels and the gather against the copy engine over the whole
// footprint (the full restore's method).
// The detection in slices is timed too: slice i's copies (kreplay_gather_found over the slice's
// own list and count) queued on a copy stream of the greatest priority as soon as slice i's
// detection is done, while the next slices are hashed (the slices alternate between two
// streams, so one slice's last blocks overlap the next one's first); and detection kernels
// built with other launch bounds. Given a PTX file (the crate's, JIT-compiled by the driver as
// kreplay loads it), the same kernels are timed from it too.
// Built and run on the GPU machine:
//
//   nvcc -O3 -arch=sm_90 -o restore_kernel_bench cuda/examples/restore_kernel_bench.cu -lcuda
//   ./restore_kernel_bench 32 5 [PTX]  # footprint in GiB, timed repetitions (median reported)
//
// A live footprint and its shadow (the snapshot's store) of FOOTPRINT_GIB each, 64 KiB chunks,
// pseudo-random bytes; a written fraction is evenly spread 64 KiB runs of x += 1 (as the
// crate's bench writes them). Times are CUDA events around the device work only (the bitmap's
// zeroing included, the host's bookkeeping not). After every timed restore the live footprint
// is compared with the shadow word by word and the bitmap's bits are counted: a difference, or
// a count other than the chunks written, fails the run.
#include <algorithm>
#include <cuda.h>
#include <cstdio>
#include <string>
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

// The committed detection built with launch bounds asking for 3 and 4 resident blocks per SM.
extern "C" __global__ void __launch_bounds__(256, 3)
    detect_b3(const KrRestoreRange *list, u64 count, u64 work, u64 chunk_size, const u64 *snap,
              u64 *changed, KrCopy *found, u64 *found_count) {
    kr_detect(list, count, work, chunk_size, snap, changed, found, found_count);
}
extern "C" __global__ void __launch_bounds__(256, 4)
    detect_b4(const KrRestoreRange *list, u64 count, u64 work, u64 chunk_size, const u64 *snap,
              u64 *changed, KrCopy *found, u64 *found_count) {
    kr_detect(list, count, work, chunk_size, snap, changed, found, found_count);
}
typedef void (*DetectFn)(const KrRestoreRange *, u64, u64, u64, const u64 *, u64 *, KrCopy *,
                         u64 *);

#define CKD(x)                                                                             \
    do {                                                                                   \
        CUresult r_ = (x);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                          \
            const char *n_ = "?";                                                          \
            cuGetErrorName(r_, &n_);                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, n_);                 \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

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
    // The bitmap, the committed pair's count, then one count per slice.
    CK(cudaMalloc(&bits, (chunks / 64 + 1 + 64) * 8));
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
    const char *detect_names[] = {"kreplay_restore_verified", "detect_b3", "detect_b4"};
    const void *detect_fns[] = {(const void *)kreplay_restore_verified, (const void *)detect_b3,
                                (const void *)detect_b4};
    for (int i = 0; i < 3; ++i) {
        cudaFuncAttributes a;
        CK(cudaFuncGetAttributes(&a, detect_fns[i]));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, detect_fns[i], 256, 0));
        printf("%s: %d registers, %d bytes local, %d blocks of 256 per SM\n", detect_names[i],
               a.numRegs, (int)a.localSizeBytes, per_sm);
    }
    // Streams for the sliced detection: two for the slices, one of the greatest priority (and
    // one of the default) for the copies. Blocking streams, so that the timing events on the
    // legacy stream wait for them.
    int least = 0, greatest = 0;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s0, s1, sc, sc_low;
    CK(cudaStreamCreateWithPriority(&s0, cudaStreamDefault, least));
    CK(cudaStreamCreateWithPriority(&s1, cudaStreamDefault, least));
    CK(cudaStreamCreateWithPriority(&sc, cudaStreamDefault, greatest));
    CK(cudaStreamCreateWithPriority(&sc_low, cudaStreamDefault, least));
    cudaEvent_t evs[16];
    for (auto &e : evs) {
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    // Each slice count's list: slice i is chunks [chunks * i / K, chunks * (i + 1) / K).
    KrRestoreRange *slist[17] = {};
    for (int K : {2, 4, 8, 16}) {
        std::vector<KrRestoreRange> l;
        for (int i = 0; i < K; ++i) {
            const u64 lo = chunks * i / K, hi = chunks * (i + 1) / K;
            l.push_back({(u64)live + lo * cs, (u64)shadow + lo * cs, (hi - lo) * cs, lo, 0});
        }
        CK(cudaMalloc(&slist[K], K * sizeof(KrRestoreRange)));
        CK(cudaMemcpy(slist[K], l.data(), K * sizeof(KrRestoreRange), cudaMemcpyHostToDevice));
    }
    // A PTX file, loaded through the driver (JIT) as kreplay loads it.
    CUmodule mod = nullptr;
    CUfunction p_read = nullptr, p_detect = nullptr, p_found = nullptr;
    if (argc > 3) {
        FILE *f = fopen(argv[3], "rb");
        if (!f) {
            perror(argv[3]);
            return 1;
        }
        std::string text;
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            text.append(buf, n);
        }
        fclose(f);
        CKD(cuModuleLoadData(&mod, text.c_str()));
        CKD(cuModuleGetFunction(&p_read, mod, "kreplay_read_once"));
        CKD(cuModuleGetFunction(&p_detect, mod, "kreplay_restore_verified"));
        CKD(cuModuleGetFunction(&p_found, mod, "kreplay_gather_found"));
        int regs = 0;
        CKD(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, p_detect));
        printf("PTX %s: kreplay_restore_verified JIT-compiled to %d registers\n", argv[3], regs);
    }
    auto ptx_detect = [&](CUstream st, const KrRestoreRange *l, u64 n, u64 w, u64 *bits_, KrCopy *fd, u64 *cnt) {
        u64 c = cs;
        const u64 *sn = snap;
        void *args[] = {&l, &n, &w, &c, &sn, &bits_, &fd, &cnt};
        CKD(cuLaunchKernel(p_detect, (unsigned)((w + 31) / 32), 1, 1, 256, 1, 1, 0, st, args, nullptr));
    };
    auto ptx_found = [&](CUstream st, KrCopy *fd, u64 *cnt, u64 w) {
        void *args[] = {&fd, &cnt};
        CKD(cuLaunchKernel(p_found, (unsigned)std::min<u64>(w, 2048), 1, 1, 256, 1, 1, 0, st, args, nullptr));
    };

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
    if (mod) {
        row("PTX (JIT): kreplay_read_once, 16 blocks/SM", median_ms(reps, nothing, [&] {
            const uint4 *p = (const uint4 *)live;
            u64 w = words;
            u64 *sink = (u64 *)diff;
            void *args[] = {&p, &w, &sink};
            CKD(cuLaunchKernel(p_read, sms * 16, 1, 1, 256, 1, 1, 0, 0, args, nullptr));
        }, nothing), B);
    }
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
        auto zero = [&] { CK(cudaMemsetAsync(bits, 0, (chunks / 64 + 1 + 64) * 8)); };
        // K slices: slice i's detection on s0 or s1 (alternating when `two`), then its copies on
        // `copy` once it is done; slice i lists its copies at found[lo..] and counts them in
        // word 1 + i after the bitmap. `ptx`: the kernels of the loaded PTX.
        auto sliced = [&](DetectFn det, bool ptx, int K, bool two, cudaStream_t copy) {
            zero();
            for (int i = 0; i < K; ++i) {
                const u64 lo = chunks * i / K, hi = chunks * (i + 1) / K;
                cudaStream_t d = (two && (i & 1)) ? s1 : s0;
                if (ptx) {
                    ptx_detect((CUstream)d, slist[K] + i, 1, hi - lo, bits, found + lo, count + 1 + i);
                } else {
                    det<<<(unsigned)((hi - lo + 31) / 32), 256, 0, d>>>(slist[K] + i, 1, hi - lo, cs, snap, bits,
                                                                       found + lo, count + 1 + i);
                }
                CK(cudaEventRecord(evs[i], d));
                CK(cudaStreamWaitEvent(copy, evs[i], 0));
                if (ptx) {
                    ptx_found((CUstream)copy, found + lo, count + 1 + i, hi - lo);
                } else {
                    kreplay_gather_found<<<(unsigned)std::min<u64>(hi - lo, 2048), 256, 0, copy>>>(found + lo,
                                                                                            count + 1 + i);
                }
            }
        };
        for (int K : {2, 4, 8, 16}) {
            char name[96];
            snprintf(name, sizeof name, "  %d slices, 2 detection streams, copies on a high-priority stream", K);
            row(name, median_ms(reps, write, [&] { sliced(kreplay_restore_verified, false, K, true, sc); }, check), B);
        }
        row("  8 slices, 1 detection stream, high-priority copies",
            median_ms(reps, write, [&] { sliced(kreplay_restore_verified, false, 8, false, sc); }, check), B);
        row("  8 slices, 2 detection streams, copies at default priority",
            median_ms(reps, write, [&] { sliced(kreplay_restore_verified, false, 8, true, sc_low); }, check), B);
        row("  launch bounds (256, 3): detection + copy behind it",
            median_ms(reps, write, [&] {
                zero();
                detect_b3<<<hash_blocks, 256>>>(dlist, 1, chunks, cs, snap, bits, found, count);
                kreplay_gather_found<<<(unsigned)std::min<u64>(chunks, 2048), 256>>>(found, count);
            }, check), B);
        row("  launch bounds (256, 4): detection + copy behind it",
            median_ms(reps, write, [&] {
                zero();
                detect_b4<<<hash_blocks, 256>>>(dlist, 1, chunks, cs, snap, bits, found, count);
                kreplay_gather_found<<<(unsigned)std::min<u64>(chunks, 2048), 256>>>(found, count);
            }, check), B);
        row("  launch bounds (256, 3), 8 slices, 2 streams, high-priority copies",
            median_ms(reps, write, [&] { sliced(detect_b3, false, 8, true, sc); }, check), B);
        if (mod) {
            row("  PTX (JIT): detection + copy behind it",
                median_ms(reps, write, [&] {
                    zero();
                    ptx_detect(0, dlist, 1, chunks, bits, found, count);
                    ptx_found(0, found, count, chunks);
                }, check), B);
            row("  PTX (JIT): 8 slices, 2 streams, high-priority copies",
                median_ms(reps, write, [&] { sliced(nullptr, true, 8, true, sc); }, check), B);
        }
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
