// Kernels that write module-scope variables (__device__ globals), which no allocation call
// returns: a replay that does not restore them leaves them counted once per pass. Launched
// three ways: the runtime's <<<>>>, cudaLaunchKernelExC (cuLaunchKernelEx underneath), and the
// driver's cuLaunchKernel with its arguments in an `extra` buffer
// (CU_LAUNCH_PARAM_BUFFER_POINTER). Prints checksums and checks them against the values one run
// of each launch gives (exit status 2 when they differ).
// Build: nvcc -O2 -o device_counter device_counter.cu -lcuda
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__device__ unsigned int counter;             // .nv.global
__device__ unsigned long long total = 7;     // .nv.global.init
static __device__ unsigned int local_hits;   // a local symbol
__device__ unsigned int hist[256];

__global__ void bump(const uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i == 0) {
        counter += 1;
        local_hits += 2;
    }
    if (i < n) {
        atomicAdd(&hist[x[i] & 255], 1u);
        atomicAdd(&total, (unsigned long long)x[i]);
    }
}

// Non-idempotent on y, and reads the counter.
__global__ void scale(uint32_t *y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * 3u + counter;
}

__global__ void read_back(unsigned long long *out) {
    out[0] = counter;
    out[1] = local_hits;
    out[2] = total;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)
#define CHECK_CU(call) do { CUresult r = (call); if (r != CUDA_SUCCESS) { \
    fprintf(stderr, "%s failed: %d\n", #call, (int)r); return 1; } } while (0)

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (1u << 20);
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    std::vector<uint32_t> hx(n), hy(n);
    uint64_t xsum = 0;
    for (size_t i = 0; i < n; i++) {
        hx[i] = (uint32_t)(i * 2654435761u) >> 8;
        hy[i] = (uint32_t)i;
        xsum += hx[i];
    }
    uint32_t *x, *y;
    unsigned long long *back;
    CHECK(cudaMalloc(&x, n * sizeof(uint32_t)));
    CHECK(cudaMalloc(&y, n * sizeof(uint32_t)));
    CHECK(cudaMalloc(&back, 3 * sizeof(unsigned long long)));
    CHECK(cudaMemcpy(x, hx.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, hy.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    unsigned blocks = (unsigned)((n + 255) / 256);

    cudaFunction_t bump_fn;
    CHECK(cudaGetFuncBySymbol(&bump_fn, (const void *)bump));
    struct { const uint32_t *x; size_t n; } packed = {x, n};
    size_t packed_size = sizeof(packed);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size, CU_LAUNCH_PARAM_END};

    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(256);
    void *scale_args[] = {&y, &n};

    for (int k = 0; k < rounds; k++) {
        bump<<<blocks, 256>>>(x, n);
        CHECK(cudaLaunchKernelExC(&config, (const void *)scale, scale_args));
        CHECK_CU(cuLaunchKernel((CUfunction)bump_fn, blocks, 1, 1, 256, 1, 1, 0, 0, nullptr, extra));
    }
    read_back<<<1, 1>>>(back);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    unsigned long long got[3];
    unsigned int h[256];
    CHECK(cudaMemcpy(got, back, sizeof(got), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(h, hist, sizeof(h)));
    CHECK(cudaMemcpy(hy.data(), y, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));

    // What one run of every launch leaves.
    unsigned long long launches = 2ull * rounds;
    uint64_t hsum = 0, hwrong = 0, ysum = 0, ywrong = 0;
    std::vector<unsigned> expect_h(256, 0);
    for (size_t i = 0; i < n; i++) expect_h[hx[i] & 255] += (unsigned)launches;
    for (int b = 0; b < 256; b++) {
        hsum += h[b];
        if (h[b] != expect_h[b]) hwrong++;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = (uint32_t)i;
        for (int k = 0; k < rounds; k++) e = e * 3u + (uint32_t)(2 * k + 1);
        ysum += hy[i];
        if (hy[i] != e) ywrong++;
    }
    bool ok = got[0] == launches && got[1] == 2 * launches &&
              got[2] == 7 + launches * xsum && hwrong == 0 && ywrong == 0;
    printf("checksum counter=%llu local_hits=%llu total=%llu\n", got[0], got[1], got[2]);
    printf("checksum hist sum=%llu wrong_bins=%llu\n", (unsigned long long)hsum,
           (unsigned long long)hwrong);
    printf("checksum scale sum=%llu wrong_words=%llu\n", (unsigned long long)ysum,
           (unsigned long long)ywrong);
    printf("%s\n", ok ? "as one run of each launch" : "WRONG: not what one run of each launch leaves");
    return ok ? 0 : 2;
}
