// An application that needs the device memory kreplay's kept snapshot shadow holds.
//
// A buffer A of a quarter of the device's free memory is set to 0 and incremented by a kernel
// (x += 1) before each of the steps below; under `kreplay run` every such launch is replayed
// and, with the snapshot on the device, leaves a shadow of A's size kept for the next launch.
// Each step then allocates R = free_at_start - |A| - 1 GiB bytes in one of the ways an
// application takes device memory (cudaMalloc, cudaMallocPitch, cudaMallocAsync, cuMemCreate
// mapped and accessible, CUDA arrays), writes it where it can, and frees it. Without kreplay R
// fits beside A; with a shadow of A's size kept it does not, so every step needs kreplay to give
// its shadow back before the allocation is made. Any failed allocation ends the program with
// exit status 3.
//
// Last, a mapping that cuMemUnmap refuses (a part of a mapped range): the mapping stays, and
// kernels incrementing it are replayed like any other launch (a refused unmap keeps the memory
// tracked; its launches are not declined as untracked_memory in the run's table).
//
// Every sum is known in advance; the program prints them and exits 2 on any difference.
// Build: nvcc -O2 -o shadow_room shadow_room.cu -lcuda
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1;
}

__global__ void sum_words(const uint32_t *x, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += x[i];
    atomicAdd(out, s);
}

static const char *drv_name(CUresult r) {
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define RT(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorName(e_)); exit(1); } } while (0)
#define DRV(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s failed: %s\n", #call, drv_name(r_)); exit(1); } } while (0)
#define ROOM(what, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("%s: no room: %s\n", what, cudaGetErrorName(e_)); \
    fprintf(stderr, "%s: %.2f GiB\n", what, gib(R)); exit(3); } \
    } while (0)
#define ROOM_DRV(what, call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    printf("%s: no room: %s\n", what, drv_name(r_)); \
    fprintf(stderr, "%s: %.2f GiB\n", what, gib(R)); exit(3); } \
    } while (0)

static size_t R;
static double gib(size_t b) { return (double)b / (1u << 30); }

static unsigned long long sum_of(const uint32_t *x, size_t n) {
    unsigned long long *d, h = 0;
    RT(cudaMalloc(&d, sizeof *d));
    RT(cudaMemset(d, 0, sizeof *d));
    sum_words<<<1024, 256>>>(x, n, d);
    RT(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    RT(cudaFree(d));
    return h;
}

int main() {
    RT(cudaFree(nullptr));
    CUdevice dev;
    DRV(cuCtxGetDevice(&dev));
    size_t free0 = 0, total = 0;
    RT(cudaMemGetInfo(&free0, &total));
    const size_t gig = (size_t)1 << 30;
    const size_t a_bytes = free0 / 4 / gig * gig;
    R = free0 - a_bytes - gig;
    const size_t n = a_bytes / 4;
    uint32_t *a;
    RT(cudaMalloc(&a, a_bytes));
    RT(cudaMemset(a, 0, a_bytes));
    // Sizes go to standard error: they depend on what else holds the device's memory.
    fprintf(stderr, "A %.1f GiB; each step allocates %.1f GiB\n", gib(a_bytes), gib(R));
    int launches = 0;
    auto touch_a = [&]() {
        add_one<<<4096, 256>>>(a, n);
        RT(cudaGetLastError());
        RT(cudaDeviceSynchronize());
        launches++;
    };

    // cudaMalloc (cuMemAlloc_v2)
    touch_a();
    {
        void *p;
        ROOM("cudaMalloc", cudaMalloc(&p, R));
        RT(cudaMemset(p, 1, R));
        RT(cudaFree(p));
        printf("cudaMalloc: ok\n");
    }
    // cudaMallocPitch (cuMemAllocPitch_v2)
    touch_a();
    {
        void *p;
        size_t pitch = 0, width = 1u << 20;
        ROOM("cudaMallocPitch", cudaMallocPitch(&p, &pitch, width, R / width));
        RT(cudaMemset2D(p, pitch, 2, width, R / width));
        RT(cudaFree(p));
        printf("cudaMallocPitch: ok\n");
    }
    // cudaMallocAsync (cuMemAllocAsync), the default pool giving memory back at each sync
    touch_a();
    {
        void *p;
        cudaStream_t s;
        RT(cudaStreamCreate(&s));
        ROOM("cudaMallocAsync", cudaMallocAsync(&p, R, s));
        RT(cudaMemsetAsync(p, 3, R, s));
        RT(cudaFreeAsync(p, s));
        RT(cudaStreamSynchronize(s));
        RT(cudaStreamDestroy(s));
        RT(cudaDeviceSynchronize());
        printf("cudaMallocAsync: ok\n");
    }
    // cuMemCreate, mapped and made accessible
    touch_a();
    {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)dev;
        size_t gran = 0;
        DRV(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        size_t size = R / gran * gran;
        CUdeviceptr va;
        DRV(cuMemAddressReserve(&va, size, 0, 0, 0));
        CUmemGenericAllocationHandle h;
        ROOM_DRV("cuMemCreate", cuMemCreate(&h, size, &prop, 0));
        DRV(cuMemMap(va, size, 0, h, 0));
        CUmemAccessDesc rw = {};
        rw.location = prop.location;
        rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        DRV(cuMemSetAccess(va, size, &rw, 1));
        DRV(cuMemsetD8(va, 4, size));
        DRV(cuCtxSynchronize());
        DRV(cuMemUnmap(va, size));
        DRV(cuMemRelease(h));
        DRV(cuMemAddressFree(va, size));
        printf("cuMemCreate: ok\n");
    }
    // CUDA arrays (cuArrayCreate_v2), in pieces of at most 32 GiB
    touch_a();
    {
        cudaChannelFormatDesc desc = cudaCreateChannelDesc<float4>();
        const size_t width = 65536, row = width * sizeof(float4);
        cudaArray_t arrays[16];
        int made = 0;
        for (size_t left = R; left >= row && made < 16; made++) {
            size_t rows = left / row < 32768 ? left / row : 32768;
            ROOM("cudaMallocArray", cudaMallocArray(&arrays[made], &desc, width, rows));
            left -= rows * row;
        }
        for (int i = 0; i < made; i++) RT(cudaFreeArray(arrays[i]));
        printf("cudaMallocArray: ok\n");
    }
    touch_a();
    unsigned long long got = sum_of(a, n), want = (unsigned long long)n * launches;
    // A's size depends on the free memory at the start: only the verdict is printed.
    if (got == want) printf("A after %d launches: every word %d\n", launches, launches);
    else printf("A after %d launches: sum %llu, expected %llu\n", launches, got, want);
    RT(cudaFree(a));

    // A mapping whose unmap is refused: the range stays mapped and in use.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t gran = 0;
    DRV(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = 2 * gran;
    CUdeviceptr va;
    DRV(cuMemAddressReserve(&va, size, 0, 0, 0));
    CUmemGenericAllocationHandle h;
    DRV(cuMemCreate(&h, size, &prop, 0));
    DRV(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc rw = {};
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DRV(cuMemSetAccess(va, size, &rw, 1));
    DRV(cuMemsetD32(va, 0, size / 4));
    CUresult refused = cuMemUnmap(va, gran);
    printf("cuMemUnmap of half the mapping: %s\n", drv_name(refused));
    const int more = 5;
    for (int k = 0; k < more; k++) add_one<<<64, 256>>>((uint32_t *)va, size / 4);
    RT(cudaDeviceSynchronize());
    unsigned long long got_v = sum_of((const uint32_t *)va, size / 4);
    unsigned long long want_v = (unsigned long long)(size / 4) * more;
    printf("mapping after %d launches: sum %llu (expected %llu)\n", more, got_v, want_v);
    DRV(cuMemUnmap(va, size));
    DRV(cuMemRelease(h));
    DRV(cuMemAddressFree(va, size));
    return got == want && got_v == want_v ? 0 : 2;
}
