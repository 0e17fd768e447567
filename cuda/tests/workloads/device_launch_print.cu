// A kernel that launches, from the device, a child that prints (dynamic parallelism with
// device-side printf).
//
// `announce` starts one `say` grid per launch; `say` prints one line and adds 1 to a buffer.
// The call graph of the image has no edge from `announce` to `say` (a device launch is no
// call), so only the launch functions show that `announce` may reach printf. Replayed N times,
// `announce` would print each line N times: under `kreplay run --passes N --check` it must be
// declined (run once) and the output must be the same as without kreplay.
//
// Build: nvcc -O2 -rdc=true -o device_launch_print device_launch_print.cu -lcudadevrt
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

__global__ void say(uint32_t *x, int k) {
    if (threadIdx.x == 0) printf("child of launch %d\n", k);
    x[threadIdx.x] += 1;
}

__global__ void announce(uint32_t *x, int k) {
    if (threadIdx.x == 0) say<<<1, 32>>>(x, k);
}

int main() {
    const int launches = 5;
    uint32_t *x;
    if (cudaMalloc(&x, 32 * 4) || cudaMemset(x, 0, 32 * 4) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    for (int k = 0; k < launches; k++) {
        announce<<<1, 1>>>(x, k);
        // The children's lines are printed at this synchronisation, in launch order.
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "launch %d failed\n", k);
            return 1;
        }
    }
    std::vector<uint32_t> h(32);
    if (cudaMemcpy(h.data(), x, 32 * 4, cudaMemcpyDeviceToHost)) {
        fprintf(stderr, "read back failed\n");
        return 1;
    }
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    printf("x_sum=%llu%s\n", (unsigned long long)s, s == 32u * launches ? "" : " MISMATCH");
    return s == 32u * launches ? 0 : 2;
}
