// Launches kreplay must replay in two unusual places, with checksums replay must leave
// unchanged:
//  * from a thread-local destructor at thread exit (a pthread key's destructor runs after the
//    thread's C++ and Rust thread-locals, kreplay's included, were destroyed);
//  * on memory whose cuMemFree failed: a free made while a global-mode capture is in progress
//    on the thread is refused (and ends the capture), so the buffer stays live; kernels then
//    write it through a pointer kept in device memory (no argument names it), so only the
//    device's tracked memory covers it.
// Build: nvcc -O2 -o thread_exit thread_exit.cu
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <pthread.h>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

// x[i] += 1 through the pointer stored at *table.
__global__ void add_one_indirect(uint32_t *const *table, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) table[0][i] += 1;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); exit(1); } } while (0)

static const size_t N = 16u << 20;  // words
static const int LAUNCHES = 3;
static uint32_t *late_buf;
static pthread_key_t key;

static void launch_at_exit(void *) {
    for (int k = 0; k < LAUNCHES; k++) add_one<<<(unsigned)((N + 255) / 256), 256>>>(late_buf, N);
    CHECK(cudaDeviceSynchronize());
}

static void *worker(void *) {
    add_one<<<(unsigned)((N + 255) / 256), 256>>>(late_buf, N);
    CHECK(cudaDeviceSynchronize());
    pthread_setspecific(key, &key);
    return nullptr;
}

static uint64_t sum_of(const uint32_t *d, uint64_t *wrong, uint32_t expect_plus) {
    std::vector<uint32_t> host(N);
    CHECK(cudaMemcpy(host.data(), d, N * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    uint64_t sum = 0;
    *wrong = 0;
    for (size_t i = 0; i < N; i++) {
        sum += host[i];
        if (host[i] != (uint32_t)i + expect_plus) (*wrong)++;
    }
    return sum;
}

static void fill(uint32_t *d) {
    std::vector<uint32_t> host(N);
    for (size_t i = 0; i < N; i++) host[i] = (uint32_t)i;
    CHECK(cudaMemcpy(d, host.data(), N * sizeof(uint32_t), cudaMemcpyHostToDevice));
}

int main() {
    unsigned blocks = (unsigned)((N + 255) / 256);
    // A launch from a thread-local destructor.
    CHECK(cudaMalloc(&late_buf, N * sizeof(uint32_t)));
    fill(late_buf);
    pthread_key_create(&key, launch_at_exit);
    pthread_t t;
    pthread_create(&t, nullptr, worker, nullptr);
    pthread_join(t, nullptr);
    uint64_t wrong;
    uint64_t sum = sum_of(late_buf, &wrong, 1 + LAUNCHES);
    printf("checksum destructor sum=%llu wrong_words=%llu\n", (unsigned long long)sum,
           (unsigned long long)wrong);
    uint64_t total_wrong = wrong;

    // A free refused during a capture.
    uint32_t *x;
    uint32_t **table;
    CHECK(cudaMalloc(&x, N * sizeof(uint32_t)));
    CHECK(cudaMalloc(&table, sizeof(uint32_t *)));
    fill(x);
    CHECK(cudaMemcpy(table, &x, sizeof(x), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaError_t freed = cudaFree(x);
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);  // invalidated by the refused free
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    printf("free during capture refused=%d\n", freed != cudaSuccess);
    for (int k = 0; k < LAUNCHES; k++) add_one_indirect<<<blocks, 256>>>(table, N);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    sum = sum_of(x, &wrong, freed != cudaSuccess ? LAUNCHES : 0);
    printf("checksum failed_free sum=%llu wrong_words=%llu\n", (unsigned long long)sum,
           (unsigned long long)wrong);
    total_wrong += wrong;
    return total_wrong == 0 ? 0 : 2;
}
