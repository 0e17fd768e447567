// Launches across two GPUs linked by peer access, every kernel non-idempotent: under
// `kreplay run --passes N --check` each must print the same checksums as without kreplay, so a
// replay that restored one device's memory and not the other's (a kernel on GPU 0 writing GPU
// 1's memory through peer access, or GPU 1's kernels running while GPU 0's are replayed) shows
// as a different line.
//
// Build: nvcc -O2 -o two_gpus two_gpus.cu
// With fewer than two GPUs, or without peer access between the first two, it says so and
// exits 0 (the same output with and without kreplay).
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,          \
                         cudaGetErrorString(err_));                                    \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

// On GPU 0: its own buffer and the peer's, both read and written.
__global__ void mix_into_peer(uint32_t *local, uint32_t *peer, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        local[i] += 1;
        peer[i] = peer[i] * 3 + local[i];
    }
}

// On GPU 1: reads GPU 0's buffer through peer access, writes its own.
__global__ void gather_from_peer(uint32_t *local, const uint32_t *peer, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        local[i] = local[i] * 5 + peer[(i * 7) % n];
    }
}

__global__ void add_one(uint32_t *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] += 1;
    }
}

static uint64_t checksum(const std::vector<uint32_t> &v) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t x : v) {
        h = (h ^ x) * 1099511628211ull;
    }
    return h;
}

static int read_back(int device, const uint32_t *p, int n, uint64_t *sum) {
    std::vector<uint32_t> host(n);
    CHECK(cudaSetDevice(device));
    CHECK(cudaMemcpy(host.data(), p, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    *sum = checksum(host);
    return 0;
}

// One thread per device: `launches` increments of its own buffer, on its own stream.
static int own_device_loop(int device, uint32_t *x, int n, int launches) {
    CHECK(cudaSetDevice(device));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k = 0; k < launches; ++k) {
        add_one<<<(n + 255) / 256, 256, 0, s>>>(x, n);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
    return 0;
}

int main() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
        std::printf("two_gpus: needs two GPUs, found %d\n", count);
        return 0;
    }
    int can01 = 0, can10 = 0;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    if (!can01 || !can10) {
        std::printf("two_gpus: no peer access between GPU 0 and GPU 1\n");
        return 0;
    }
    const int n = 1 << 22;  // 16 MiB per buffer
    const size_t bytes = n * sizeof(uint32_t);
    std::vector<uint32_t> init(n);
    for (int i = 0; i < n; ++i) {
        init[i] = static_cast<uint32_t>(i * 2654435761u);
    }
    uint32_t *a0, *t0, *b1, *t1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    CHECK(cudaMalloc(&a0, bytes));
    CHECK(cudaMalloc(&t0, bytes));
    CHECK(cudaMemcpy(a0, init.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(t0, 0, bytes));
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    CHECK(cudaMalloc(&b1, bytes));
    CHECK(cudaMalloc(&t1, bytes));
    CHECK(cudaMemcpy(b1, init.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(t1, 0, bytes));

    // Peer writes and reads, alternating devices.
    const int blocks = (n + 255) / 256;
    for (int round = 0; round < 6; ++round) {
        CHECK(cudaSetDevice(0));
        mix_into_peer<<<blocks, 256>>>(a0, b1, n);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(1));
        gather_from_peer<<<blocks, 256>>>(b1, a0, n);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    // A peer copy between them, then one more kernel on each.
    CHECK(cudaMemcpyPeer(t1, 1, a0, 0, bytes));
    CHECK(cudaSetDevice(1));
    gather_from_peer<<<blocks, 256>>>(t1, b1, n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    mix_into_peer<<<blocks, 256>>>(t0, t1, n);
    CHECK(cudaDeviceSynchronize());

    // Two threads, one per device, launching at the same time.
    int rc0 = 0, rc1 = 0;
    std::thread first([&] { rc0 = own_device_loop(0, t0, n, 40); });
    std::thread second([&] { rc1 = own_device_loop(1, t1, n, 40); });
    first.join();
    second.join();
    if (rc0 || rc1) {
        return 1;
    }

    uint64_t sa0, st0, sb1, st1;
    if (read_back(0, a0, n, &sa0) || read_back(0, t0, n, &st0) || read_back(1, b1, n, &sb1) ||
        read_back(1, t1, n, &st1)) {
        return 1;
    }
    std::printf("two_gpus: a0 %016llx t0 %016llx b1 %016llx t1 %016llx\n",
                (unsigned long long)sa0, (unsigned long long)st0, (unsigned long long)sb1,
                (unsigned long long)st1);
    return 0;
}
