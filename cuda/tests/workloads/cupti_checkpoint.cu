// CUPTI's checkpoint API (cuptiCheckpointSave / cuptiCheckpointRestore) on the footprint and
// written fractions kreplay's restore_bench uses, for a side-by-side comparison: one allocation
// of FOOTPRINT_GIB, written fractions of it as evenly spread 64 KiB runs of `x += 1`, and the
// time of each restore (host wall clock around cuptiCheckpointRestore and a device
// synchronize). Each restore is verified: a checksum kernel over the footprint must give the
// checkpoint's value again.
//
//   nvcc -O2 -arch=sm_90 -o cupti_checkpoint cuda/tests/workloads/cupti_checkpoint.cu \
//        -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti -lcuda
//   ./cupti_checkpoint 32 3      # footprint in GiB, restores timed per fraction (median)
//   ./cupti_checkpoint 32 3 device_none,host_none   # only the configurations named
//
// Four configurations: checkpoint kept in device memory where it fits (reserveDeviceMB 0) or in
// host memory (reserveDeviceMB = the device's total memory in MiB, so none of it may be used;
// the documented -1 was refused with CUPTI_ERROR_INVALID_PARAMETER on CUDA 13.0), each with
// CUPTI_CHECKPOINT_OPT_NONE and
// with CUPTI_CHECKPOINT_OPT_TRANSFER (restore only blocks that changed). With TRANSFER, CUPTI
// says the restore must be called at the same point each time; a fresh checkpoint is saved for
// each fraction.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_checkpoint.h>

using namespace NV::Cupti::Checkpoint;

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static const char *cupti_err(CUptiResult r) {
    const char *s = "?";
    cuptiGetResultString(r, &s);
    return s;
}

typedef unsigned long long u64;

__global__ void fill(u64 *p, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 x = (i + 1) * 0x9E3779B97F4A7C15ULL;
        x ^= x >> 29;
        p[i] = x;
    }
}

__global__ void add_one_runs(unsigned *p, u64 runs, u64 run_words, u64 stride_words) {
    const u64 total = runs * run_words;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / run_words;
        p[r * stride_words + (i - r * run_words)] += 1;
    }
}

__global__ void checksum(const u64 *p, u64 n, u64 *out) {
    u64 s = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        s += p[i] * (2 * i + 1);
    }
    atomicAdd(out, s);
}

static u64 sum(const u64 *p, u64 n, u64 *d_out) {
    CK(cudaMemset(d_out, 0, 8));
    checksum<<<132 * 8, 256>>>(p, n, d_out);
    u64 h = 0;
    CK(cudaMemcpy(&h, d_out, 8, cudaMemcpyDeviceToHost));
    return h;
}

static double now_ms() {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int main(int argc, char **argv) {
    const u64 gib = argc > 1 ? strtoull(argv[1], 0, 10) : 32;
    const int reps = argc > 2 ? atoi(argv[2]) : 3;
    const char *only = argc > 3 ? argv[3] : nullptr;
    const u64 bytes = gib << 30;
    const u64 chunk = 64 << 10;
    const u64 chunks = bytes / chunk;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    u64 *buf, *d_sum;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&d_sum, 8));
    fill<<<132 * 8, 256>>>(buf, bytes / 8);
    CK(cudaDeviceSynchronize());
    const u64 reference = sum(buf, bytes / 8, d_sum);
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const size_t all_mb = total_b >> 20;
    printf("config,footprint_gib,fraction,metric,ms,verified\n");
    struct Cfg {
        const char *name;
        size_t reserve_device_mb;
        CUpti_CheckpointOptimizations opt;
    } cfgs[] = {
        {"device_none", 0, CUPTI_CHECKPOINT_OPT_NONE},
        {"device_transfer", 0, CUPTI_CHECKPOINT_OPT_TRANSFER},
        {"host_none", all_mb, CUPTI_CHECKPOINT_OPT_NONE},
        {"host_transfer", all_mb, CUPTI_CHECKPOINT_OPT_TRANSFER},
    };
    const char *labels[] = {"0.1%", "1%", "10%", "100%"};
    const double fractions[] = {0.001, 0.01, 0.1, 1.0};
    int failures = 0;
    for (const Cfg &c : cfgs) {
        if (only && !strstr(only, c.name)) {
            continue;
        }
        for (int f = 0; f < 4; ++f) {
            CUpti_Checkpoint cp = {CUpti_Checkpoint_STRUCT_SIZE};
            cp.ctx = ctx;
            cp.reserveDeviceMB = c.reserve_device_mb;
            cp.reserveHostMB = 0;
            cp.allowOverwrite = 1;
            cp.optimizations = c.opt;
            double t0 = now_ms();
            CUptiResult r = cuptiCheckpointSave(&cp);
            CK(cudaDeviceSynchronize());
            double save = now_ms() - t0;
            if (r != CUPTI_SUCCESS) {
                printf("%s,%llu,%s,save_failed,%s,0\n", c.name, gib, labels[f], cupti_err(r));
                ++failures;
                break;
            }
            printf("%s,%llu,%s,save,%.3f,1\n", c.name, gib, labels[f], save);
            const u64 dirty = std::max<u64>(1, (u64)(chunks * fractions[f] + 0.5));
            const u64 stride = chunks / dirty;
            std::vector<double> times;
            bool ok = true;
            for (int i = 0; i < reps + 1; ++i) {
                add_one_runs<<<132 * 16, 256>>>((unsigned *)buf, dirty, chunk / 4, stride * chunk / 4);
                CK(cudaDeviceSynchronize());
                t0 = now_ms();
                r = cuptiCheckpointRestore(&cp);
                CK(cudaDeviceSynchronize());
                const double t = now_ms() - t0;
                if (r != CUPTI_SUCCESS) {
                    printf("%s,%llu,%s,restore_failed,%s,0\n", c.name, gib, labels[f], cupti_err(r));
                    ok = false;
                    break;
                }
                const bool same = sum(buf, bytes / 8, d_sum) == reference;
                ok = ok && same;
                if (i > 0) times.push_back(t);  // the first restore is not timed (warm-up)
                else printf("%s,%llu,%s,first_restore,%.3f,%d\n", c.name, gib, labels[f], t, same);
            }
            if (!times.empty()) {
                std::sort(times.begin(), times.end());
                printf("%s,%llu,%s,restore_median,%.3f,%d\n", c.name, gib, labels[f],
                       times[times.size() / 2], ok);
                printf("%s,%llu,%s,restore_min,%.3f,%d\n", c.name, gib, labels[f], times[0], ok);
            }
            failures += !ok;
            cuptiCheckpointFree(&cp);
            // Start the next fraction from the reference bytes.
            fill<<<132 * 8, 256>>>(buf, bytes / 8);
            CK(cudaDeviceSynchronize());
            fflush(stdout);
        }
    }
    printf(failures ? "RESULT: %d failures\n" : "RESULT: all restores verified\n", failures);
    return 0;
}
