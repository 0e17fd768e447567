// Peer access enabled on one thread while another thread's launches on GPU 0 are replayed.
//
// Thread A launches x += 1 over a buffer of GPU 0 `launches` times (each replayed). Once A's
// first launch has returned, thread B enables peer access from GPU 1 to GPU 0 and then, on GPU 1,
// adds 1 to a buffer `y` of GPU 0 through peer access `rounds` times, with a kernel that also
// reads a word of page-locked host memory: kreplay declines to replay it (untracked_memory), so
// it runs once, as an ordinary launch, holding GPU 1 only. Under the default snapshot scope
// every replay on GPU 0 snapshots `y`; a launch of B's that ran inside such a window had its
// increment undone by the window's restores. kreplay must lock GPU 1 with GPU 0 from the link on
// (the link waits for an open window, and a window asks for the group again once it holds its
// devices). Prints the sums; exit status 2 when they differ from one run's.
// With fewer than two GPUs, or without peer access between the first two, it says so and exits
// 0 (the same output with and without kreplay).
//
// Build: nvcc -O2 -o peer_link peer_link.cu
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

// On GPU 1: y (GPU 0's memory) += one, read from page-locked host memory.
__global__ void add_host_one(uint32_t *y, size_t n, const volatile uint32_t *one) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += *one;
}

static uint64_t sum(const uint32_t *d, size_t n) {
    std::vector<uint32_t> h(n);
    if (cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return ~0ull;
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    return s;
}

int main() {
    int devices = 0, can = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2 ||
        cudaDeviceCanAccessPeer(&can, 1, 0) != cudaSuccess || !can) {
        printf("peer_link needs two GPUs with peer access\n");
        return 0;
    }
    const size_t n = 1u << 22, m = 1u << 16;
    const int launches = 300, rounds = 100;
    uint32_t *x, *y, *one_host, *one_dev;
    cudaStream_t sa;
    if (cudaSetDevice(0) || cudaMalloc(&x, n * 4) || cudaMalloc(&y, m * 4) ||
        cudaMemset(x, 0, n * 4) || cudaMemset(y, 0, m * 4) ||
        cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
        cudaHostAlloc(&one_host, 4, cudaHostAllocMapped | cudaHostAllocPortable) ||
        cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    *one_host = 1;
    if (cudaHostGetDevicePointer(&one_dev, one_host, 0)) return 1;
    std::atomic<bool> a_started{false};
    cudaError_t b_error = cudaSuccess;
    std::thread tb([&] {
        for (long spins = 0; !a_started.load() && spins < 2000000000L; spins++) {
        }
        cudaError_t e = cudaSetDevice(1);
        if (e == cudaSuccess) e = cudaDeviceEnablePeerAccess(0, 0);
        cudaStream_t sb;
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking);
        for (int r = 0; r < rounds && e == cudaSuccess; r++) {
            add_host_one<<<(unsigned)((m + 255) / 256), 256, 0, sb>>>(y, m, one_dev);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaStreamSynchronize(sb);
        b_error = e;
    });
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) {
        add_one<<<blocks, 256, 0, sa>>>(x, n);
        if (k == 0) {
            cudaStreamSynchronize(sa);
            a_started.store(true);
        }
    }
    tb.join();
    if (cudaSetDevice(0) || cudaDeviceSynchronize() || b_error != cudaSuccess) {
        fprintf(stderr, "errors: %s\n", cudaGetErrorName(b_error));
        return 1;
    }
    uint64_t sx = sum(x, n), sy = sum(y, m);
    printf("peer_link x_sum=%llu y_sum=%llu (one run: %llu, %llu)\n", (unsigned long long)sx,
           (unsigned long long)sy, (unsigned long long)launches * n,
           (unsigned long long)rounds * m);
    return sx == (uint64_t)launches * n && sy == (uint64_t)rounds * m ? 0 : 2;
}
