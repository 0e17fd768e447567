// Device writes that are not ordinary kernel launches, made on one thread while another thread's
// kernels are replayed.
//
// Thread A launches x += 1 over its own buffer `launches` times on its own stream (each launch is
// replayed under kreplay). Once A's first launch has returned, thread B, on a stream of its own,
// runs `rounds` rounds of four writes into buffers of its own, none of them a cuLaunchKernel:
//   - cuStreamWriteValue32: marks[r] = r + 1;
//   - a graph launch of a graph holding one kernel node: g[] += 1;
//   - a cooperative launch (cudaLaunchCooperativeKernel): c[] += 1, replayed in a window of its
//     own, which waits for A's;
//   - cuMemcpyAtoD from a CUDA array holding 1, 2, 3, ...: copied[r] = r + 1.
// Every buffer's sum is known in advance; the program prints them and exits 2 on any difference.
//
// Under `kreplay run --passes N --check` (the default snapshot scope holds every allocation of
// the device, B's buffers too) the output must be the same as without kreplay: a write of B's
// that landed between a snapshot of A's launch and a restore would be undone by the restore.
//
// Build: nvcc -O2 -o concurrent_writers concurrent_writers.cu -lcuda
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

// Grid-stride, so a small cooperative grid covers the whole buffer.
__global__ void bump(uint32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1;
}

static uint64_t sum(const uint32_t *d, size_t n) {
    std::vector<uint32_t> h(n);
    if (cudaMemcpy(h.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost) != cudaSuccess)
        return ~0ull;
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    return s;
}

static std::string runtime_error(const char *what, cudaError_t e) {
    return std::string(what) + ": " + cudaGetErrorName(e);
}

static std::string driver_error(const char *what, CUresult r) {
    const char *name = nullptr;
    cuGetErrorName(r, &name);
    return std::string(what) + ": " + (name ? name : "?");
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (4u << 20);  // words of A's buffer
    const int launches = 300, rounds = 300;
    const size_t m = 1u << 18;  // words of g and c
    uint32_t *x, *g, *c, *marks, *copied;
    cudaStream_t sa, sb;
    if (cudaMalloc(&x, n * 4) || cudaMalloc(&g, m * 4) || cudaMalloc(&c, m * 4) ||
        cudaMalloc(&marks, rounds * 4) || cudaMalloc(&copied, rounds * 4) ||
        cudaMemset(x, 0, n * 4) || cudaMemset(g, 0, m * 4) || cudaMemset(c, 0, m * 4) ||
        cudaMemset(marks, 0, rounds * 4) || cudaMemset(copied, 0, rounds * 4) ||
        cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    // The CUDA array B copies from: one row of `rounds` words holding 1, 2, 3, ...
    CUarray array;
    CUDA_ARRAY_DESCRIPTOR desc = {};
    desc.Width = rounds;
    desc.Height = 0;
    desc.Format = CU_AD_FORMAT_UNSIGNED_INT32;
    desc.NumChannels = 1;
    std::vector<uint32_t> ramp(rounds);
    for (int r = 0; r < rounds; r++) ramp[r] = r + 1;
    CUresult cr = cuArrayCreate(&array, &desc);
    if (cr == CUDA_SUCCESS) cr = cuMemcpyHtoA(array, 0, ramp.data(), rounds * 4);
    if (cr != CUDA_SUCCESS) {
        fprintf(stderr, "%s\n", driver_error("array setup", cr).c_str());
        return 1;
    }
    // The graph B launches: one kernel node, g += 1.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t node;
    size_t mm = m;
    void *graph_args[] = {&g, &mm};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)bump;
    kp.gridDim = dim3(64);
    kp.blockDim = dim3(256);
    kp.kernelParams = graph_args;
    if (cudaGraphCreate(&graph, 0) || cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kp) ||
        cudaGraphInstantiate(&exec, graph, 0)) {
        fprintf(stderr, "graph setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    int can_coop = 0;
    cudaDeviceGetAttribute(&can_coop, cudaDevAttrCooperativeLaunch, 0);
    // Stream memory operations: tried once on B's first mark (rewritten by round 0), since
    // the device attribute that used to announce them is deprecated.
    CUresult probe = cuStreamWriteValue32((CUstream)sb, (CUdeviceptr)marks, 1, 0);
    int can_memops = probe == CUDA_SUCCESS;
    if (!can_memops && probe != CUDA_ERROR_NOT_SUPPORTED) {
        fprintf(stderr, "%s\n", driver_error("cuStreamWriteValue32", probe).c_str());
        return 1;
    }
    if (cudaStreamSynchronize(sb) != cudaSuccess) return 1;

    std::atomic<bool> a_started{false};
    std::string a_error, b_error;
    std::thread tb([&] {
        cudaError_t e = cudaSetDevice(0);
        if (e != cudaSuccess) { b_error = runtime_error("thread setup", e); return; }
        // Bounded spin: A's first launch returns within seconds, replayed or not.
        for (long spins = 0; !a_started.load(); spins++) {
            if (spins > 2000000000L) { b_error = "A never launched"; return; }
        }
        void *coop_args[] = {&c, (void *)&m};
        for (int r = 0; r < rounds && b_error.empty(); r++) {
            if (can_memops) {
                CUresult wr = cuStreamWriteValue32((CUstream)sb, (CUdeviceptr)(marks + r),
                                                   (cuuint32_t)(r + 1), 0);
                if (wr != CUDA_SUCCESS) b_error = driver_error("cuStreamWriteValue32", wr);
            }
            e = cudaGraphLaunch(exec, sb);
            if (e != cudaSuccess) b_error = runtime_error("cudaGraphLaunch", e);
            if (can_coop) {
                e = cudaLaunchCooperativeKernel((void *)bump, dim3(32), dim3(256), coop_args, 0,
                                                sb);
                if (e != cudaSuccess) b_error = runtime_error("cudaLaunchCooperativeKernel", e);
            }
            CUresult ar = cuMemcpyAtoD((CUdeviceptr)(copied + r), array, r * 4, 4);
            if (ar != CUDA_SUCCESS) b_error = driver_error("cuMemcpyAtoD", ar);
        }
        e = cudaStreamSynchronize(sb);
        if (e != cudaSuccess && b_error.empty()) b_error = runtime_error("thread B", e);
    });

    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) {
        add_one<<<blocks, 256, 0, sa>>>(x, n);
        if (k == 0) {
            cudaError_t e = cudaStreamSynchronize(sa);
            if (e != cudaSuccess) a_error = runtime_error("first launch", e);
            a_started.store(true);
        }
    }
    cudaError_t e = cudaStreamSynchronize(sa);
    if (e != cudaSuccess && a_error.empty()) a_error = runtime_error("thread A", e);
    tb.join();
    if (!a_error.empty() || !b_error.empty()) {
        fprintf(stderr, "errors: A [%s] B [%s]\n", a_error.c_str(), b_error.c_str());
        return 1;
    }
    uint64_t expect_ramp = (uint64_t)rounds * (rounds + 1) / 2;
    struct Check {
        const char *name;
        uint64_t got, want;
    } checks[] = {
        {"x", sum(x, n), (uint64_t)launches * n},
        {"marks", sum(marks, rounds), can_memops ? expect_ramp : 0},
        {"graph", sum(g, m), (uint64_t)rounds * m},
        {"cooperative", sum(c, m), can_coop ? (uint64_t)rounds * m : 0},
        {"copied", sum(copied, rounds), expect_ramp},
    };
    int bad = 0;
    for (const Check &k : checks) {
        printf("%s_sum=%llu%s\n", k.name, (unsigned long long)k.got,
               k.got == k.want ? "" : " MISMATCH");
        bad += k.got != k.want;
    }
    printf("stream_mem_ops=%d cooperative_launch=%d\n", can_memops, can_coop);
    return bad ? 2 : 0;
}
