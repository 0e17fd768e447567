// Kernels that write a CUDA array through a surface object, which kreplay does not snapshot
// (the object is an opaque handle, a small number in the kernel's arguments), and a kernel that
// writes a __managed__ module-scope variable. Replayed without care, every pass would add 1 to
// the array again. After the surface object is destroyed, launches are replayed again.
// With the argument `reset`, a second surface object is then left live when the program calls
// cudaDeviceReset, and two more x += 1 launches follow in the new context: the surface ended
// with its context, so they are replayed (run_checks.sh reads the per-kernel CSV).
// Prints what one run gives; exit status 2 when the values differ from one run's.
// Build: nvcc -O2 -o surface surface.cu
#include <cstdio>
#include <cuda_runtime.h>

__managed__ int launches;  // a managed module-scope variable

__global__ void count() {
    if (threadIdx.x == 0 && blockIdx.x == 0) launches += 1;
}

__global__ void bump_surface(cudaSurfaceObject_t s, int w) {
    int x = threadIdx.x;
    if (x < w) {
        int v;
        surf2Dread(&v, s, x * (int)sizeof(int), 0);
        surf2Dwrite(v + 1, s, x * (int)sizeof(int), 0);
    }
}

__global__ void bump(int *p, int n) {
    int i = threadIdx.x;
    if (i < n) p[i] += 1;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    const int w = 64;
    bool reset = argc > 1 && argv[1][0] == 'r';
    launches = 0;
    for (int k = 0; k < 3; k++) count<<<1, 32>>>();
    CHECK(cudaDeviceSynchronize());
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<int>();
    cudaArray_t array;
    CHECK(cudaMallocArray(&array, &desc, w, 1, cudaArraySurfaceLoadStore));
    int host[w] = {0};
    CHECK(cudaMemcpy2DToArray(array, 0, 0, host, w * sizeof(int), w * sizeof(int), 1,
                              cudaMemcpyHostToDevice));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    cudaSurfaceObject_t surface;
    CHECK(cudaCreateSurfaceObject(&surface, &res));
    for (int k = 0; k < 3; k++) bump_surface<<<1, w>>>(surface, w);
    CHECK(cudaMemcpy2DFromArray(host, w * sizeof(int), array, 0, 0, w * sizeof(int), 1,
                                cudaMemcpyDeviceToHost));
    CHECK(cudaDestroySurfaceObject(surface));
    long surface_sum = 0;
    for (int i = 0; i < w; i++) surface_sum += host[i];
    // With the surface object gone, an ordinary x += 1 (replayed again under kreplay).
    int *p;
    CHECK(cudaMalloc(&p, w * sizeof(int)));
    CHECK(cudaMemset(p, 0, w * sizeof(int)));
    for (int k = 0; k < 2; k++) bump<<<1, w>>>(p, w);
    CHECK(cudaMemcpy(host, p, sizeof(host), cudaMemcpyDeviceToHost));
    long plain_sum = 0;
    for (int i = 0; i < w; i++) plain_sum += host[i];
    printf("surface launches=%d surface_sum=%ld plain_sum=%ld (one run: 3, %d, %d)\n", launches,
           surface_sum, plain_sum, 3 * w, 2 * w);
    bool ok = launches == 3 && surface_sum == 3 * w && plain_sum == 2 * w;
    if (reset) {
        // A surface object left live in the context that the reset destroys.
        CHECK(cudaCreateSurfaceObject(&surface, &res));
        CHECK(cudaDeviceReset());
        CHECK(cudaMalloc(&p, w * sizeof(int)));
        CHECK(cudaMemset(p, 0, w * sizeof(int)));
        for (int k = 0; k < 2; k++) bump<<<1, w>>>(p, w);
        CHECK(cudaMemcpy(host, p, sizeof(host), cudaMemcpyDeviceToHost));
        long reset_sum = 0;
        for (int i = 0; i < w; i++) reset_sum += host[i];
        printf("after reset plain_sum=%ld (one run: %d)\n", reset_sum, 2 * w);
        ok = ok && reset_sum == 2 * w;
    }
    return ok ? 0 : 2;
}
