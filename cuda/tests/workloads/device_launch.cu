// Kernels launched from device code (dynamic parallelism): a parent kernel launches child
// grids that add 1 to a buffer and to a __device__ counter.
//
// Each parent launch starts `children` child grids, each adding 1 to every word of x, and one
// more child that adds 1 to the __device__ counter. The parent itself writes nothing. Under
// `kreplay run --passes N --check` the output must be the same as without kreplay: every pass
// of a parent starts its children again, so the children's writes must be restored with the
// parent's (x is an argument, the counter a variable of the module).
//
// Build: nvcc -O2 -rdc=true -o device_launch device_launch.cu -lcudadevrt
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

__device__ uint32_t counter;

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

__global__ void count_one() { atomicAdd(&counter, 1u); }

__global__ void parent(uint32_t *x, size_t n, int children) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned blocks = (unsigned)((n + 255) / 256);
        for (int k = 0; k < children; k++) add_one<<<blocks, 256>>>(x, n);
        count_one<<<1, 1>>>();
    }
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (1u << 20);
    const int launches = 20, children = 3;
    uint32_t *x;
    uint32_t zero = 0;
    if (cudaMalloc(&x, n * 4) || cudaMemset(x, 0, n * 4) ||
        cudaMemcpyToSymbol(counter, &zero, 4) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    for (int k = 0; k < launches; k++) parent<<<1, 32>>>(x, n, children);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "launches failed: %s\n", cudaGetErrorName(e));
        return 1;
    }
    std::vector<uint32_t> h(n);
    uint32_t count = 0;
    if (cudaMemcpy(h.data(), x, n * 4, cudaMemcpyDeviceToHost) ||
        cudaMemcpyFromSymbol(&count, counter, 4)) {
        fprintf(stderr, "read back failed\n");
        return 1;
    }
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    uint64_t want = (uint64_t)launches * children * n;
    printf("x_sum=%llu%s\n", (unsigned long long)s, s == want ? "" : " MISMATCH");
    printf("child_count=%u%s\n", count, count == (uint32_t)launches ? "" : " MISMATCH");
    return s == want && count == (uint32_t)launches ? 0 : 2;
}
