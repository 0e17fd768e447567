// cudaDeviceReset between two phases of a program, and a second context created and destroyed.
//
// Phase 1 allocates, launches x += 1 a few times (each replayed under kreplay, which then holds
// memory of its own in the device's primary context) and checks the result. cudaDeviceReset
// then destroys the primary context and everything in it, kreplay's memory and kernels too.
// Phase 2 allocates again (the driver may hand out the same addresses) and launches again.
// Phase 3 does the same in a context of its own (cuCtxCreate), which also holds a managed
// allocation it never frees (while managed memory is live kreplay runs launches once), destroyed
// at its end, and phase 4 once more in the primary context. Every buffer is checked against its count of launches;
// the program prints the sums and exits 2 on any difference.
//
// Under `kreplay run --passes N --check` the output must be the same as without kreplay: after
// a reset or a context's destruction kreplay must not use what it held there (its kept
// snapshot memory, scratch buffers, kernels), nor snapshot allocations that died with it.
//
// Build: nvcc -O2 -o device_reset device_reset.cu -lcuda
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

static int bad = 0;

// Allocates `buffers` buffers of n words in the current context, launches x += 1 on buffer k
// (k + 1) times, and checks every sum.
static bool phase(const char *name, int buffers, size_t n) {
    std::vector<uint32_t *> b(buffers, nullptr);
    for (int k = 0; k < buffers; k++) {
        if (cudaMalloc(&b[k], n * 4) || cudaMemset(b[k], 0, n * 4)) {
            fprintf(stderr, "%s: allocation: %s\n", name, cudaGetErrorName(cudaGetLastError()));
            return false;
        }
    }
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < buffers; k++)
        for (int j = 0; j <= k; j++) add_one<<<blocks, 256>>>(b[k], n);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: launches: %s\n", name, cudaGetErrorName(e));
        return false;
    }
    std::vector<uint32_t> h(n);
    for (int k = 0; k < buffers; k++) {
        if (cudaMemcpy(h.data(), b[k], n * 4, cudaMemcpyDeviceToHost)) return false;
        uint64_t s = 0;
        for (uint32_t v : h) s += v;
        uint64_t want = (uint64_t)(k + 1) * n;
        printf("%s buffer %d sum=%llu%s\n", name, k, (unsigned long long)s,
               s == want ? "" : " MISMATCH");
        bad += s != want;
    }
    return true;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (1u << 20);
    if (!phase("before reset", 2, n)) return 1;
    cudaError_t e = cudaDeviceReset();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceReset: %s\n", cudaGetErrorName(e));
        return 1;
    }
    if (!phase("after reset", 4, n)) return 1;
    CUdevice dev;
    CUcontext ctx, primary;
    if (cuCtxGetCurrent(&primary) || cuDeviceGet(&dev, 0)) return 1;
#if CUDA_VERSION >= 13000
    CUresult r = cuCtxCreate(&ctx, nullptr, 0, dev);
#else
    CUresult r = cuCtxCreate(&ctx, 0, dev);
#endif
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuCtxCreate failed: %d\n", (int)r);
        return 1;
    }
    if (!phase("own context", 3, n)) return 1;
    uint32_t *managed = nullptr;
    if (cudaMallocManaged(&managed, 4096) != cudaSuccess) return 1;
    if (cuCtxDestroy(ctx) || cuCtxSetCurrent(primary)) {
        fprintf(stderr, "cuCtxDestroy failed\n");
        return 1;
    }
    if (!phase("primary again", 3, n)) return 1;
    return bad ? 2 : 0;
}
