// Memory CUDA graphs allocate, written by kernels outside the graphs, directly and through a
// pointer kept in device memory.
//
// Graph A is captured: cudaMallocAsync of `a` on the capturing stream (an allocation node) and
// a kernel that fills it with 1. Between the end of the capture and A's first launch, `a` has
// no memory behind it: a kernel is launched then on another buffer (kreplay replays it, and
// its snapshot must not copy `a`), and one whose argument is `a` but that does not touch it
// (kreplay must decline it, never copy `a`). After A has run, `add_direct` (a as an argument)
// and `add_through` (a read from a table in device memory) each add 1 to every word of `a`,
// LAUNCHES times. Graph F, captured too, frees `a` (cudaFreeAsync: a free node); it is
// launched once the sum of `a` is read.
//
// Graph B is built node by node: cudaGraphAddMemAllocNode of `b`, then a memset node setting it
// to 1; instantiated with auto-free on launch and launched twice (the relaunch frees `b` and
// allocates it again at the same address), then `add_through` adds 1 to `b` LAUNCHES times
// through the table, and cudaFree frees it.
//
// Under `kreplay run --passes N --check` the sums must be the same as without kreplay: replayed
// with graph memory unrestored, `add_through` would add N per launch; a snapshot copying `a`
// before A ran would be an illegal address, and the program would die.
//
// Build: nvcc -O2 -o graph_alloc graph_alloc.cu
#include <cstdint>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

__global__ void fill(uint32_t *x, size_t n, uint32_t v) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

__global__ void add_direct(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

__global__ void add_through(uint32_t *const *table, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) table[0][i] += 1;
}

// Given a pointer it never follows when `go` is 0.
__global__ void add_if(uint32_t *x, size_t n, int go) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (go && i < n) x[i] += 1;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

static const size_t N = 1 << 20;
static const int LAUNCHES = 8;

static unsigned long long sum(const uint32_t *d, std::vector<uint32_t> &host) {
    if (cudaMemcpy(host.data(), d, N * sizeof(uint32_t), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    unsigned long long s = 0;
    for (size_t i = 0; i < N; i++) s += host[i];
    return s;
}

int main() {
    const unsigned blocks = (unsigned)((N + 255) / 256);
    const size_t bytes = N * sizeof(uint32_t);
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<uint32_t> host(N);
    uint32_t *other = nullptr, **table = nullptr;
    CHECK(cudaMalloc(&other, bytes));
    CHECK(cudaMalloc(&table, sizeof(uint32_t *)));
    CHECK(cudaMemsetAsync(other, 0, bytes, s));

    // Graph A, captured: allocation node and a fill.
    uint32_t *a = nullptr;
    cudaGraph_t ga;
    cudaGraphExec_t ea;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync((void **)&a, bytes, s));
    fill<<<blocks, 256, 0, s>>>(a, N, 1);
    CHECK(cudaStreamEndCapture(s, &ga));
    CHECK(cudaGraphInstantiate(&ea, ga, 0));

    // Before A's first launch `a` has no memory: a launch on another buffer, and one given `a`
    // that does not follow it.
    add_direct<<<blocks, 256, 0, s>>>(other, N);
    add_if<<<blocks, 256, 0, s>>>(a, N, 0);
    CHECK(cudaGetLastError());

    CHECK(cudaGraphLaunch(ea, s));
    CHECK(cudaMemcpyAsync(table, &a, sizeof(a), cudaMemcpyHostToDevice, s));
    for (int k = 0; k < LAUNCHES; k++) {
        add_direct<<<blocks, 256, 0, s>>>(a, N);
        add_through<<<blocks, 256, 0, s>>>(table, N);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    unsigned long long a_sum = sum(a, host);

    // Graph F frees `a` (a free node in a later graph).
    cudaGraph_t gf;
    cudaGraphExec_t ef;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaStreamEndCapture(s, &gf));
    CHECK(cudaGraphInstantiate(&ef, gf, 0));
    CHECK(cudaGraphLaunch(ef, s));
    add_direct<<<blocks, 256, 0, s>>>(other, N);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));

    // Graph B, node by node: allocation node, memset node; auto-free on relaunch.
    cudaGraph_t gb;
    cudaGraphExec_t eb;
    CHECK(cudaGraphCreate(&gb, 0));
    cudaMemAllocNodeParams alloc = {};
    alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    alloc.poolProps.location.id = dev;
    alloc.bytesize = bytes;
    cudaGraphNode_t alloc_node, set_node;
    CHECK(cudaGraphAddMemAllocNode(&alloc_node, gb, nullptr, 0, &alloc));
    uint32_t *b = (uint32_t *)alloc.dptr;
    cudaMemsetParams set = {};
    set.dst = b;
    set.value = 1;
    set.elementSize = sizeof(uint32_t);
    set.width = N;
    set.height = 1;
    CHECK(cudaGraphAddMemsetNode(&set_node, gb, &alloc_node, 1, &set));
    CHECK(cudaGraphInstantiate(&eb, gb, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    add_direct<<<blocks, 256, 0, s>>>(other, N);
    CHECK(cudaGraphLaunch(eb, s));
    CHECK(cudaGraphLaunch(eb, s));
    CHECK(cudaMemcpyAsync(table, &b, sizeof(b), cudaMemcpyHostToDevice, s));
    for (int k = 0; k < LAUNCHES; k++) add_through<<<blocks, 256, 0, s>>>(table, N);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    unsigned long long b_sum = sum(b, host);
    CHECK(cudaFree(b));

    // Every graph gone; one more launch on the ordinary buffer.
    CHECK(cudaGraphExecDestroy(ea));
    CHECK(cudaGraphExecDestroy(ef));
    CHECK(cudaGraphExecDestroy(eb));
    CHECK(cudaGraphDestroy(ga));
    CHECK(cudaGraphDestroy(gf));
    CHECK(cudaGraphDestroy(gb));
    add_direct<<<blocks, 256, 0, s>>>(other, N);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    unsigned long long other_sum = sum(other, host);

    const unsigned long long want_a = N * (1ull + 2 * LAUNCHES), want_b = N * (1ull + LAUNCHES),
                             want_other = N * 4ull;
    bool ok = a_sum == want_a && b_sum == want_b && other_sum == want_other;
    printf("captured_sum=%llu node_sum=%llu other_sum=%llu%s\n", a_sum, b_sum, other_sum,
           ok ? "" : " MISMATCH");
    return ok ? 0 : 2;
}
