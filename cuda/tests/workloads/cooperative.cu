// Cooperative launches, replayed: a kernel that adds 1 to every word of x, synchronises the whole
// grid, then folds each word's neighbour (written by another block) into y. A pass that saw x or
// y as an earlier pass left them gives other values, so the checksums are only right if every
// pass started from the same bytes. The kernel is launched through each entry point that makes a
// cooperative launch: cudaLaunchCooperativeKernel, cuLaunchCooperativeKernel and its per-thread
// default stream variant (_ptsz), and cudaLaunchKernelEx with the cooperative attribute.
// Build: nvcc -O2 -o cooperative cooperative.cu -lcuda
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

// The per-thread default stream form of cuLaunchCooperativeKernel, which cuda.h names only when
// a translation unit is compiled for per-thread default streams.
extern "C" CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                   unsigned gz, unsigned bx, unsigned by,
                                                   unsigned bz, unsigned shared, CUstream s,
                                                   void **params);

extern "C" __global__ void coop_step(uint32_t *x, uint32_t *y, size_t n) {
    cg::grid_group grid = cg::this_grid();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < n; i += stride) x[i] += 1;
    grid.sync();
    for (size_t i = first; i < n; i += stride) y[i] = y[i] * 3u + x[(i + 1) % n];
}

static uint32_t start_x(size_t i) { return (uint32_t)(i * 2654435761u); }

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)
#define CHECK_CU(call) do { CUresult r = (call); if (r != CUDA_SUCCESS) { \
    const char *name = nullptr; cuGetErrorName(r, &name); \
    fprintf(stderr, "%s failed: %s\n", #call, name ? name : "?"); return 1; } } while (0)

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (16u << 20);  // words
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    CHECK(cudaSetDevice(0));
    int can_coop = 0, sms = 0, per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&can_coop, cudaDevAttrCooperativeLaunch, 0));
    if (!can_coop) {
        fprintf(stderr, "device 0 has no cooperative launches\n");
        return 1;
    }
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const unsigned threads = 256;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_step, threads, 0));
    unsigned blocks = (unsigned)(sms * (per_sm < 2 ? per_sm : 2));
    if (blocks == 0) return 1;

    uint32_t *x, *y;
    CHECK(cudaMalloc(&x, n * sizeof(uint32_t)));
    CHECK(cudaMalloc(&y, n * sizeof(uint32_t)));
    std::vector<uint32_t> hx(n), hy(n, 7);
    for (size_t i = 0; i < n; i++) hx[i] = start_x(i);
    CHECK(cudaMemcpy(x, hx.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, hy.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUfunction f;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)coop_step));

    void *args[] = {&x, &y, &n};
    const int ways = 4;
    for (int r = 0; r < rounds; r++) {
        for (int way = 0; way < ways; way++) {
            switch (way) {
            case 0:
                CHECK(cudaLaunchCooperativeKernel((void *)coop_step, dim3(blocks), dim3(threads),
                                                  args, 0, stream));
                break;
            case 1:
                CHECK_CU(cuLaunchCooperativeKernel(f, blocks, 1, 1, threads, 1, 1, 0,
                                                   (CUstream)stream, args));
                break;
            case 2:
                // The calling thread's default stream: synchronise with the other stream first.
                CHECK(cudaStreamSynchronize(stream));
                CHECK_CU(cuLaunchCooperativeKernel_ptsz(f, blocks, 1, 1, threads, 1, 1, 0,
                                                        nullptr, args));
                CHECK(cudaStreamSynchronize(cudaStreamPerThread));
                break;
            default: {
                cudaLaunchConfig_t config = {};
                config.gridDim = dim3(blocks);
                config.blockDim = dim3(threads);
                config.stream = stream;
                cudaLaunchAttribute attr;
                attr.id = cudaLaunchAttributeCooperative;
                attr.val.cooperative = 1;
                config.attrs = &attr;
                config.numAttrs = 1;
                CHECK(cudaLaunchKernelEx(&config, coop_step, x, y, n));
            }
            }
        }
    }
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    std::vector<uint32_t> gx(n), gy(n);
    CHECK(cudaMemcpy(gx.data(), x, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(gy.data(), y, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    // The same steps on the host.
    for (int step = 0; step < rounds * ways; step++) {
        for (size_t i = 0; i < n; i++) hx[i] += 1;
        for (size_t i = 0; i < n; i++) hy[i] = hy[i] * 3u + hx[(i + 1) % n];
    }
    uint64_t sx = 0, sy = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        sx += gx[i];
        sy += gy[i];
        if (gx[i] != hx[i] || gy[i] != hy[i]) wrong++;
    }
    printf("cooperative launches=%d blocks=%u threads=%u\n", rounds * ways, blocks, threads);
    printf("checksum x sum=%llu\n", (unsigned long long)sx);
    printf("checksum y sum=%llu wrong_words=%llu\n", (unsigned long long)sy,
           (unsigned long long)wrong);
    return wrong == 0 ? 0 : 2;
}
