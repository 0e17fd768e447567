// A kernel that allocates from the device heap runs inside a CUDA graph built node by node;
// ordinary launches then write the heap block through a pointer kept in a module-scope
// variable.
//
// kreplay runs graph launches once and does not see which kernels they run. Once the graph has
// run `grab`, the heap holds the program's data and `bump_heap` writes it: replayed N times
// with the heap unrestored, it would add N per launch. Under `kreplay run --passes N --check`
// the output must be the same as without kreplay (the launches after the graph are declined,
// as after a `grab` launched on its own; see device_runtime.cu).
//
// Build: nvcc -O2 -o device_heap_graph device_heap_graph.cu
#include <cstdio>
#include <cuda_runtime.h>

__device__ int *heap_block;

__global__ void grab(int n) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int *p = (int *)malloc(n * sizeof(int));
        if (p)
            for (int i = 0; i < n; i++) p[i] = 1;
        heap_block = p;
    }
}

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
    const int n = 1024;
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 1 << 20));
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    long long *sum, h = 0;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&sum, sizeof(long long)));
    // Built node by node (no launch of `grab` is ever captured, so none reaches kreplay).
    CHECK(cudaGraphCreate(&graph, 0));
    int count = n;
    void *args[] = {&count};
    cudaKernelNodeParams node = {};
    node.func = (void *)grab;
    node.gridDim = dim3(1);
    node.blockDim = dim3(1);
    node.kernelParams = args;
    cudaGraphNode_t grab_node;
    CHECK(cudaGraphAddKernelNode(&grab_node, graph, nullptr, 0, &node));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int k = 0; k < 5; k++) bump_heap<<<(n + 255) / 256, 256, 0, s>>>(n);
    sum_heap<<<1, 1, 0, s>>>(n, sum);
    CHECK(cudaMemcpyAsync(&h, sum, sizeof(h), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    long long want = (long long)n * (1 + 5);
    printf("heap_sum=%lld%s\n", h, h == want ? "" : " MISMATCH");
    return h == want ? 0 : 2;
}
