// Another thread is inside a synchronous copy that waits for a kernel spinning on a flag the
// main thread sets only after its own launches. A replay window that waited without bound for
// that copy's call to return (the copy holds the device while it is in progress) would never
// open, and the program would never end. Within the drain timeout (KREPLAY_DRAIN_TIMEOUT_MS) the
// main thread's launches must be declined (agent_drain_stuck) and run once; once the flag is set
// and the copy returned, the later launches are replayed as usual.
// Prints what one run gives; exit status 2 when the values differ from one run's.
// Build: nvcc -O2 -o copy_stuck copy_stuck.cu
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <unistd.h>
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
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); exit(1); } } while (0)

static int *seen;
static cudaStream_t waiting;
static int copied = 0;
static volatile int copying = 0;

// The copy to pageable memory returns only once the spinning kernel before it has ended.
static void *copier(void *) {
    CHECK(cudaSetDevice(0));
    copying = 1;
    CHECK(cudaMemcpyAsync(&copied, seen, sizeof(int), cudaMemcpyDeviceToHost, waiting));
    return nullptr;
}

int main() {
    // Load eagerly (as drain_stuck.cu): a lazy load at the first launch of `bump` would wait
    // for the device to idle, with the spinning kernel running.
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    const int n = 1 << 20;
    int *flag_host, *flag_dev, *x;
    CHECK(cudaHostAlloc(&flag_host, sizeof(int), cudaHostAllocMapped));
    *(volatile int *)flag_host = 0;
    CHECK(cudaHostGetDevicePointer(&flag_dev, flag_host, 0));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CHECK(cudaMalloc(&x, n * sizeof(int)));
    CHECK(cudaMemset(seen, 0, sizeof(int)));
    CHECK(cudaMemset(x, 0, n * sizeof(int)));
    cudaStream_t working;
    CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&working, cudaStreamNonBlocking));
    bump<<<1, 1, 0, working>>>(x, 0);
    CHECK(cudaDeviceSynchronize());
    wait_for_host<<<1, 1, 0, waiting>>>(flag_dev, seen);
    pthread_t t;
    pthread_create(&t, nullptr, copier, nullptr);
    while (!copying) {
    }
    // Give the copy time to be inside its call (the program's result does not depend on it).
    usleep(200 * 1000);
    for (int k = 0; k < 3; k++) bump<<<n / 256, 256, 0, working>>>(x, n);
    CHECK(cudaStreamSynchronize(working));
    *(volatile int *)flag_host = 7;
    pthread_join(t, nullptr);
    CHECK(cudaDeviceSynchronize());
    // With the copy returned, the device drains again: replayed as usual.
    for (int k = 0; k < 2; k++) bump<<<n / 256, 256, 0, working>>>(x, n);
    long long sum = 0;
    static int hx[1 << 20];
    CHECK(cudaMemcpy(hx, x, sizeof(hx), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) sum += hx[i];
    printf("copy_stuck copied=%d sum=%lld (one run: 7, %lld)\n", copied, sum, 5LL * n);
    return copied == 7 && sum == 5LL * n ? 0 : 2;
}
