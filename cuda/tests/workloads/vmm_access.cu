// Virtual memory management with a range mapped before it is made accessible: cuMemMap does not
// make memory accessible, cuMemSetAccess does, and an application may launch kernels in between.
//
// Two physical allocations are mapped side by side in one reserved range. The first half is made
// readable and writable at once; the second is mapped but left inaccessible while x += 1 runs
// `launches` times over a cudaMalloc buffer (each launch replayed under kreplay, whose default
// snapshot scope holds every allocation of the device). Then the second half is made accessible
// and x += 1 runs `launches` times over the whole range. Every sum is known in advance; the
// program prints them and exits 2 on any difference.
//
// Under `kreplay run --passes N --check` the output must be the same as without kreplay. Before
// mappings were snapshotted only once their device may write them, the launches over x copied
// the inaccessible half into their snapshots: expect the program to fail with an illegal-address
// error (or those launches declined as snapshot_failed in the run's table).
//
// Build: nvcc -O2 -o vmm_access vmm_access.cu -lcuda
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

static const char *name(CUresult r) {
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define DRV(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s failed: %s\n", #call, name(r_)); return 1; } } while (0)
#define RT(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorName(e_)); return 1; } } while (0)

static uint64_t sum(CUdeviceptr d, size_t words) {
    std::vector<uint32_t> h(words);
    if (cuMemcpyDtoH(h.data(), d, words * 4) != CUDA_SUCCESS) return ~0ull;
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    return s;
}

int main() {
    const int launches = 20;
    RT(cudaFree(nullptr));  // the primary context, current
    CUdevice dev;
    DRV(cuCtxGetDevice(&dev));
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t gran = 0;
    DRV(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    size_t half = ((64u << 20) + gran - 1) / gran * gran;
    CUdeviceptr va;
    DRV(cuMemAddressReserve(&va, 2 * half, 0, 0, 0));
    CUmemGenericAllocationHandle h1, h2;
    DRV(cuMemCreate(&h1, half, &prop, 0));
    DRV(cuMemCreate(&h2, half, &prop, 0));
    CUmemAccessDesc rw = {};
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DRV(cuMemMap(va, half, 0, h1, 0));
    DRV(cuMemSetAccess(va, half, &rw, 1));
    DRV(cuMemsetD32(va, 7, half / 4));
    // The second half: mapped, not accessible yet.
    DRV(cuMemMap(va + half, half, 0, h2, 0));

    size_t n = 4u << 20;
    uint32_t *x;
    RT(cudaMalloc(&x, n * 4));
    RT(cudaMemset(x, 0, n * 4));
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) add_one<<<blocks, 256>>>(x, n);
    RT(cudaGetLastError());
    RT(cudaDeviceSynchronize());

    DRV(cuMemSetAccess(va + half, half, &rw, 1));
    DRV(cuMemsetD32(va + half, 9, half / 4));
    size_t words = 2 * half / 4;
    unsigned vblocks = (unsigned)((words + 255) / 256);
    for (int k = 0; k < launches; k++) add_one<<<vblocks, 256>>>((uint32_t *)va, words);
    RT(cudaGetLastError());
    RT(cudaDeviceSynchronize());

    uint64_t qw = half / 4;
    struct Check {
        const char *name;
        uint64_t got, want;
    } checks[] = {
        {"x", sum((CUdeviceptr)x, n), (uint64_t)launches * n},
        {"first_half", sum(va, half / 4), (7 + (uint64_t)launches) * qw},
        {"second_half", sum(va + half, half / 4), (9 + (uint64_t)launches) * qw},
    };
    int bad = 0;
    for (const Check &k : checks) {
        printf("%s_sum=%llu%s\n", k.name, (unsigned long long)k.got,
               k.got == k.want ? "" : " MISMATCH");
        bad += k.got != k.want;
    }
    DRV(cuMemUnmap(va, half));
    DRV(cuMemUnmap(va + half, half));
    DRV(cuMemRelease(h1));
    DRV(cuMemRelease(h2));
    DRV(cuMemAddressFree(va, 2 * half));
    RT(cudaFree(x));
    return bad ? 2 : 0;
}
