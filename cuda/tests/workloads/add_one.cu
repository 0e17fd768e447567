// A plain CUDA C program (no PyTorch): x += 1 over a buffer, launched a few times with the
// runtime API, then a kernel with accumulation (y += a * x). Prints checksums that replay must
// leave unchanged. Build: nvcc -O2 -o add_one add_one.cu
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

__global__ void axpy_acc(float *y, const float *x, float a, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (64u << 20);  // words
    int launches = argc > 2 ? atoi(argv[2]) : 5;
    std::vector<uint32_t> host(n);
    for (size_t i = 0; i < n; i++) host[i] = (uint32_t)(i * 2654435761u);
    uint32_t *x; float *fx, *fy;
    CHECK(cudaMalloc(&x, n * sizeof(uint32_t)));
    CHECK(cudaMalloc(&fx, n * sizeof(float)));
    CHECK(cudaMalloc(&fy, n * sizeof(float)));
    CHECK(cudaMemcpy(x, host.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    std::vector<float> hf(n);
    for (size_t i = 0; i < n; i++) hf[i] = (float)(i % 1000) * 0.001f;
    CHECK(cudaMemcpy(fx, hf.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(fy, 0, n * sizeof(float)));
    unsigned blocks = (unsigned)((n + 255) / 256);
    for (int k = 0; k < launches; k++) {
        add_one<<<blocks, 256>>>(x, n);
        axpy_acc<<<blocks, 256>>>(fy, fx, 0.5f, n);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host.data(), x, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hf.data(), fy, n * sizeof(float), cudaMemcpyDeviceToHost));
    uint64_t sum = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        sum += host[i];
        if (host[i] != (uint32_t)(i * 2654435761u) + (uint32_t)launches) wrong++;
    }
    double fsum = 0;
    for (size_t i = 0; i < n; i++) fsum += hf[i];
    printf("checksum add_one sum=%llu wrong_words=%llu\n", (unsigned long long)sum, (unsigned long long)wrong);
    printf("checksum axpy_acc sum=%.17g\n", fsum);
    return wrong == 0 ? 0 : 2;
}
