// Kernels that use the device runtime's own memory, which no allocation call returns and no
// kernel argument points into: device-side printf (the driver's printf buffer, printed by the
// host at the next synchronisation) and device-side malloc (the driver's device heap).
// Replaying such a kernel N times would print its lines N times, and would allocate from the
// heap N times while a restore of the tracked memory puts back only the pointer: the heap
// fills up and the program sees a NULL that one run never gives. Prints what one run gives;
// exit status 2 when the values differ from one run's.
// Build: nvcc -O2 -o device_runtime device_runtime.cu
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ int *heap_block;  // a pointer into the device heap, kept between launches

// printf once per launch, from a counter kept in tracked memory.
__global__ void say(int *launches) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int k = atomicAdd(launches, 1);
        printf("say: launch %d\n", k);
    }
}

// Allocates `bytes` from the device heap once per launch and keeps it (no free): a program
// that sizes its heap for its own allocations gets NULL only if the kernel runs more often.
__global__ void grab(size_t bytes, int **slots, int slot) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int *p = (int *)malloc(bytes);
        slots[slot] = p;
        if (p) {
            for (size_t i = 0; i < bytes / sizeof(int); i++) p[i] = slot;
            heap_block = p;
        }
    }
}

// Non-idempotent on heap memory reached through a module-scope pointer.
__global__ void bump_heap(int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (heap_block && i < n) heap_block[i] += 1;
}

__global__ void sum_heap(int n, long long *out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        long long s = 0;
        if (heap_block)
            for (int i = 0; i < n; i++) s += heap_block[i];
        *out = s;
    }
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    const int slots = 3;
    const size_t bytes = 256 << 10;  // 256 KiB per grab
    // A heap that fits this program's grabs (3 x 256 KiB) with some room, not 4 times as many.
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 1 << 20));
    int *launches;
    int **slot_ptrs;
    long long *sum;
    CHECK(cudaMalloc(&launches, sizeof(int)));
    CHECK(cudaMalloc(&slot_ptrs, slots * sizeof(int *)));
    CHECK(cudaMalloc(&sum, sizeof(long long)));
    CHECK(cudaMemset(launches, 0, sizeof(int)));
    CHECK(cudaMemset(slot_ptrs, 0, slots * sizeof(int *)));
    for (int k = 0; k < 3; k++) say<<<1, 32>>>(launches);
    CHECK(cudaDeviceSynchronize());
    for (int s = 0; s < slots; s++) grab<<<1, 1>>>(bytes, slot_ptrs, s);
    const int n = 1024;
    for (int k = 0; k < 5; k++) bump_heap<<<(n + 255) / 256, 256>>>(n);
    sum_heap<<<1, 1>>>(n, sum);
    int *host_slots[slots];
    long long hsum = 0;
    int hl = 0;
    CHECK(cudaMemcpy(host_slots, slot_ptrs, sizeof(host_slots), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hsum, sum, sizeof(hsum), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&hl, launches, sizeof(hl), cudaMemcpyDeviceToHost));
    int granted = 0;
    for (int s = 0; s < slots; s++) granted += host_slots[s] != nullptr;
    // One run: 3 launches of say; every grab granted; the last block holds slot 2, bumped 5 times.
    long long want = (long long)n * (2 + 5);
    printf("device_runtime launches=%d granted=%d/%d heap_sum=%lld (one run: 3, %d/%d, %lld)\n",
           hl, granted, slots, hsum, slots, slots, want);
    return hl == 3 && granted == slots && hsum == want ? 0 : 2;
}
