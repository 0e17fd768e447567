// cudaDeviceReset with stream-ordered allocations (cudaMallocAsync) still live, then launches
// in the device's new primary context.
//
// Phase 1 allocates two buffers from the device's default pool with cudaMallocAsync, frees
// neither, and runs x += 1 over one of them `launches` times; cudaDeviceReset then ends the
// primary context. Phase 2 allocates a smaller buffer with cudaMalloc and runs x += 1 over it
// `launches` times. Each phase prints its checksum; the program exits 2 on a wrong one.
//
// Under `kreplay run --passes N --check` the output must be the same as without kreplay, and
// phase 2's launches should be replayed (the run's table). kreplay forgets the cudaMalloc
// allocations of a context that ends, not its stream-ordered ones: if the reset took them with
// the context, phase 2's snapshots (default scope: every tracked allocation of the device) still
// name them. Expect then phase 2's launches declined as snapshot_failed in the table, or the
// program to fail with an illegal-address error where a snapshot copies them with a kernel.
//
// Build: nvcc -O2 -o reset_async reset_async.cu
#include <cstdint>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorName(e_)); return 1; } } while (0)

static int run(uint32_t *x, size_t n, int launches, cudaStream_t s, uint64_t *out) {
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) add_one<<<blocks, 256, 0, s>>>(x, n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    std::vector<uint32_t> h(n);
    CHECK(cudaMemcpy(h.data(), x, n * 4, cudaMemcpyDeviceToHost));
    uint64_t sum = 0;
    for (uint32_t v : h) sum += v;
    *out = sum;
    return 0;
}

int main() {
    const int launches = 10;
    const size_t n = 8u << 20;  // words
    int pools = 0;
    CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
    if (!pools) {
        printf("memory pools not supported\n");
        return 0;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *x, *y;
    CHECK(cudaMallocAsync((void **)&x, n * 4, s));
    CHECK(cudaMallocAsync((void **)&y, n * 4, s));
    CHECK(cudaMemsetAsync(x, 0, n * 4, s));
    CHECK(cudaMemsetAsync(y, 0, n * 4, s));
    uint64_t first = 0;
    if (run(x, n, launches, s, &first)) return 1;
    printf("phase1_sum=%llu%s\n", (unsigned long long)first,
           first == (uint64_t)launches * n ? "" : " MISMATCH");
    // Neither x nor y is freed: the reset ends the context with them live.
    CHECK(cudaDeviceReset());

    const size_t m = n / 4;
    uint32_t *z;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&z, m * 4));
    CHECK(cudaMemset(z, 0, m * 4));
    uint64_t second = 0;
    if (run(z, m, launches, s, &second)) return 1;
    printf("phase2_sum=%llu%s\n", (unsigned long long)second,
           second == (uint64_t)launches * m ? "" : " MISMATCH");
    CHECK(cudaFree(z));
    return first == (uint64_t)launches * n && second == (uint64_t)launches * m ? 0 : 2;
}
