// The application side of tool_work.c's check that work a tool issues from inside a replay
// window is kept: x += 1 over a buffer of zeros, launched a few times, with the buffer's address
// exported (tool_work_target, tool_work_words) for the tool to find. At PASS EXIT of pass 1 of
// the first replayed launch the tool sets the first quarter of the buffer to TOOL_VALUE with
// cuMemsetD32 and the second quarter with cuMemsetD2D32; the passes after it start from that
// work, so after L launches the first two quarters hold TOOL_VALUE + L and the rest L.
// Prints how many words of each part hold that. Without the tool every part holds L.
// Build: nvcc -O2 -Xlinker --export-dynamic -o tool_target tool_target.cu
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define TOOL_VALUE 0x00ABCDEFu

extern "C" {
__attribute__((visibility("default"))) unsigned long long tool_work_target = 0;
__attribute__((visibility("default"))) unsigned long long tool_work_words = 0;
}

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (4u << 20);  // words, a multiple of 4096
    int launches = argc > 2 ? atoi(argv[2]) : 5;
    uint32_t *x;
    CHECK(cudaMalloc(&x, n * sizeof(uint32_t)));
    CHECK(cudaMemset(x, 0, n * sizeof(uint32_t)));
    tool_work_target = (unsigned long long)(uintptr_t)x;
    tool_work_words = n;
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) add_one<<<blocks, 256>>>(x, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> host(n);
    CHECK(cudaMemcpy(host.data(), x, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    size_t q = n / 4, first = 0, second = 0, rest = 0;
    uint32_t set = TOOL_VALUE + (uint32_t)launches, plain = (uint32_t)launches;
    for (size_t i = 0; i < n; i++) {
        if (i < q) first += host[i] == set;
        else if (i < 2 * q) second += host[i] == set;
        else rest += host[i] == plain;
    }
    printf("tool_target: set by cuMemsetD32 %zu of %zu, by cuMemsetD2D32 %zu of %zu, "
           "untouched %zu of %zu\n", first, q, second, q, rest, n - 2 * q);
    return 0;
}
