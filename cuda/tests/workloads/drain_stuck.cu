// A kernel that waits for the host on one stream while the host launches other work on another
// stream: the waiting kernel ends only when the host writes a flag after that work is done.
// A replay that drains every stream of the device before its snapshot (cuCtxSynchronize)
// would wait for the waiting kernel, which waits for the host, which waits in the launch:
// the program would never end. Within the drain timeout (KREPLAY_DRAIN_TIMEOUT_MS) the launch
// must be declined (agent_drain_stuck) and run once.
// Prints what one run gives; exit status 2 when the values differ from one run's.
// Build: nvcc -O2 -o drain_stuck drain_stuck.cu
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void wait_for_host(volatile int *flag, int *seen) {
    while (*flag == 0) {
    }
    *seen = *flag;
}

__global__ void bump(int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    // Lazy loading would load `bump` at its first launch, which waits for the device to idle:
    // with the waiting kernel running, the program would hang on its own. Load eagerly, and
    // launch both kernels once before the waiting starts.
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    const int n = 1 << 20;
    int *flag_host, *flag_dev, *seen, *x;
    CHECK(cudaHostAlloc(&flag_host, sizeof(int), cudaHostAllocMapped));
    *(volatile int *)flag_host = 0;
    CHECK(cudaHostGetDevicePointer(&flag_dev, flag_host, 0));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CHECK(cudaMalloc(&x, n * sizeof(int)));
    CHECK(cudaMemset(seen, 0, sizeof(int)));
    CHECK(cudaMemset(x, 0, n * sizeof(int)));
    cudaStream_t waiting, working;
    CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&working, cudaStreamNonBlocking));
    bump<<<1, 1, 0, working>>>(x, 0);
    CHECK(cudaDeviceSynchronize());
    wait_for_host<<<1, 1, 0, waiting>>>(flag_dev, seen);
    for (int k = 0; k < 3; k++) bump<<<n / 256, 256, 0, working>>>(x, n);
    CHECK(cudaStreamSynchronize(working));
    *(volatile int *)flag_host = 7;
    CHECK(cudaDeviceSynchronize());
    // After the waiting kernel ended, the device drains again: replayed as usual.
    for (int k = 0; k < 2; k++) bump<<<n / 256, 256, 0, working>>>(x, n);
    int hseen = 0;
    long long sum = 0;
    static int hx[1 << 20];
    CHECK(cudaMemcpy(&hseen, seen, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hx, x, sizeof(hx), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) sum += hx[i];
    printf("drain_stuck seen=%d sum=%lld (one run: 7, %lld)\n", hseen, sum, 5LL * n);
    return hseen == 7 && sum == 5LL * n ? 0 : 2;
}
