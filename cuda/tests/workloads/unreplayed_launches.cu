// Kernel launches kreplay does not replay, made on one thread while another thread's kernels are
// replayed: the legacy cuLaunchGridAsync (with cuFuncSetBlockShape / cuParamSetv) and the
// deprecated cuLaunchCooperativeKernelMultiDevice (over one device).
//
// Thread A launches x += 1 over its own buffer `launches` times on its own stream (each launch is
// replayed under kreplay). Once A's first launch has returned, thread B, on a stream of its own,
// runs `rounds` rounds of: a legacy launch of bump over l[] and a multi-device cooperative launch
// of bump over c[], each += 1 over its buffer. Both entry points are looked up in libcuda at run
// time (CUDA 13 headers may no longer declare them); one the driver does not have or refuses is
// reported as unsupported, the same with and without kreplay. Every buffer's sum is known in
// advance; the program prints them and exits 2 on any difference.
//
// Under `kreplay run --passes N --check` (the default snapshot scope holds every allocation of
// the device, B's buffers too) the output must be the same as without kreplay. Before these
// launches were fenced, one landing between a snapshot of A's launch and a restore was undone by
// the restore: l_sum or c_sum below rounds * m, marked MISMATCH.
//
// Build: nvcc -O2 -o unreplayed_launches unreplayed_launches.cu -lcuda -ldl
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <string>
#include <thread>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

// Grid-stride, so a small grid covers the whole buffer.
__global__ void bump(uint32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1;
}

// cuda.h's CUDA_LAUNCH_PARAMS, declared here as the driver takes it.
struct LaunchParams {
    CUfunction function;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
};

typedef CUresult (*SetBlockShape)(CUfunction, int, int, int);
typedef CUresult (*ParamSetSize)(CUfunction, unsigned);
typedef CUresult (*ParamSetv)(CUfunction, int, void *, unsigned);
typedef CUresult (*LaunchGridAsync)(CUfunction, int, int, CUstream);
typedef CUresult (*LaunchMultiDevice)(LaunchParams *, unsigned, unsigned);

static uint64_t sum(const uint32_t *d, size_t n) {
    std::vector<uint32_t> h(n);
    if (cudaMemcpy(h.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost) != cudaSuccess)
        return ~0ull;
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    return s;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (4u << 20);  // words of A's buffer
    const int launches = 300, rounds = 300;
    size_t m = 1u << 18;  // words of l and c
    uint32_t *x, *l, *c;
    cudaStream_t sa, sb;
    if (cudaMalloc(&x, n * 4) || cudaMalloc(&l, m * 4) || cudaMalloc(&c, m * 4) ||
        cudaMemset(x, 0, n * 4) || cudaMemset(l, 0, m * 4) || cudaMemset(c, 0, m * 4) ||
        cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda) cuda = dlopen("libcuda.so.1", RTLD_NOW);
    auto sym = [&](const char *name) { return cuda ? dlsym(cuda, name) : nullptr; };
    SetBlockShape set_block_shape = (SetBlockShape)sym("cuFuncSetBlockShape");
    ParamSetSize param_set_size = (ParamSetSize)sym("cuParamSetSize");
    ParamSetv param_setv = (ParamSetv)sym("cuParamSetv");
    LaunchGridAsync launch_grid_async = (LaunchGridAsync)sym("cuLaunchGridAsync");
    LaunchMultiDevice launch_multi = (LaunchMultiDevice)sym("cuLaunchCooperativeKernelMultiDevice");
    // The same function for both entry points: the legacy parameters are kept on the handle,
    // the multi-device launch passes its own.
    CUfunction legacy_f = nullptr, multi_f = nullptr;
    if (cudaGetFuncBySymbol(&legacy_f, (const void *)bump) != cudaSuccess) legacy_f = nullptr;
    multi_f = legacy_f;
    // Each entry point is tried once (on a throw-away launch with 0 words) before the threads
    // start: what the driver refuses is left out of the rounds, the same with and without kreplay.
    size_t zero = 0;
    int legacy = legacy_f && set_block_shape && param_set_size && param_setv && launch_grid_async;
    if (legacy) {
        uint32_t *p = l;
        legacy = set_block_shape(legacy_f, 256, 1, 1) == CUDA_SUCCESS &&
                 param_setv(legacy_f, 0, &p, sizeof p) == CUDA_SUCCESS &&
                 param_setv(legacy_f, 8, &zero, sizeof zero) == CUDA_SUCCESS &&
                 param_set_size(legacy_f, 16) == CUDA_SUCCESS &&
                 launch_grid_async(legacy_f, 32, 1, (CUstream)sb) == CUDA_SUCCESS &&
                 cudaStreamSynchronize(sb) == cudaSuccess;
    }
    int multi = multi_f && launch_multi;
    if (multi) {
        uint32_t *p = c;
        void *args[] = {&p, &zero};
        LaunchParams lp = {multi_f, 32, 1, 1, 256, 1, 1, 0, (CUstream)sb, args};
        multi = launch_multi(&lp, 1, 0) == CUDA_SUCCESS && cudaStreamSynchronize(sb) == cudaSuccess;
    }
    cudaGetLastError();

    std::atomic<bool> a_started{false};
    std::string a_error, b_error;
    std::thread tb([&] {
        cudaError_t e = cudaSetDevice(0);
        if (e != cudaSuccess) { b_error = std::string("thread setup: ") + cudaGetErrorName(e); return; }
        // Bounded spin: A's first launch returns within seconds, replayed or not.
        for (long spins = 0; !a_started.load(); spins++) {
            if (spins > 2000000000L) { b_error = "A never launched"; return; }
        }
        for (int r = 0; r < rounds && b_error.empty(); r++) {
            if (legacy) {
                uint32_t *p = l;
                if (param_setv(legacy_f, 0, &p, sizeof p) || param_setv(legacy_f, 8, &m, sizeof m) ||
                    launch_grid_async(legacy_f, 32, 1, (CUstream)sb))
                    b_error = "cuLaunchGridAsync";
            }
            if (multi) {
                uint32_t *p = c;
                void *args[] = {&p, &m};
                LaunchParams lp = {multi_f, 32, 1, 1, 256, 1, 1, 0, (CUstream)sb, args};
                if (launch_multi(&lp, 1, 0)) b_error = "cuLaunchCooperativeKernelMultiDevice";
            }
        }
        e = cudaStreamSynchronize(sb);
        if (e != cudaSuccess && b_error.empty()) b_error = std::string("thread B: ") + cudaGetErrorName(e);
    });

    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) {
        add_one<<<blocks, 256, 0, sa>>>(x, n);
        if (k == 0) {
            cudaError_t e = cudaStreamSynchronize(sa);
            if (e != cudaSuccess) a_error = std::string("first launch: ") + cudaGetErrorName(e);
            a_started.store(true);
        }
    }
    cudaError_t e = cudaStreamSynchronize(sa);
    if (e != cudaSuccess && a_error.empty()) a_error = std::string("thread A: ") + cudaGetErrorName(e);
    tb.join();
    if (!a_error.empty() || !b_error.empty()) {
        fprintf(stderr, "errors: A [%s] B [%s]\n", a_error.c_str(), b_error.c_str());
        return 1;
    }
    struct Check {
        const char *name;
        uint64_t got, want;
    } checks[] = {
        {"x", sum(x, n), (uint64_t)launches * n},
        {"l", sum(l, m), legacy ? (uint64_t)rounds * m : 0},
        {"c", sum(c, m), multi ? (uint64_t)rounds * m : 0},
    };
    int bad = 0;
    for (const Check &k : checks) {
        printf("%s_sum=%llu%s\n", k.name, (unsigned long long)k.got,
               k.got == k.want ? "" : " MISMATCH");
        bad += k.got != k.want;
    }
    printf("legacy_launch=%d multi_device_launch=%d\n", legacy, multi);
    return bad ? 2 : 0;
}
