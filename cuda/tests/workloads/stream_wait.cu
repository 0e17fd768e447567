// Another thread queues waits on the stream whose launches are replayed, and then sets what they
// wait for with a stream write on a stream of its own.
//
// Thread A launches x += 1 over its buffer `launches` times on stream sa (each launch replayed
// under kreplay). Once A's first launch has returned, thread B runs `rounds` rounds of:
//   - cuStreamWaitValue32(sa, flag >= r): A's later work waits for round r;
//   - cuStreamWriteValue32(sb, flag = r): round r is done.
// Without kreplay every wait ends as soon as B's write after it runs. Under kreplay the write
// waits for any replay window open on the device (it writes device memory); a wait queued inside
// A's window stood between A's launch and its re-launches, so the passes waited for the write and
// the write for the passes, and the program hung. The wait must wait for the window too, so that
// it is queued after the last pass. Prints the sums; exit status 2 when they differ from one
// run's.
//
// Build: nvcc -O2 -o stream_wait stream_wait.cu -lcuda
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

static std::string driver_error(const char *what, CUresult r) {
    const char *name = nullptr;
    cuGetErrorName(r, &name);
    return std::string(what) + ": " + (name ? name : "?");
}

int main() {
    const size_t n = 1u << 22;
    const int launches = 200, rounds = 20;
    uint32_t *x, *flag;
    cudaStream_t sa, sb;
    if (cudaMalloc(&x, n * 4) || cudaMalloc(&flag, 4) || cudaMemset(x, 0, n * 4) ||
        cudaMemset(flag, 0, 4) || cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    // Stream memory operations: tried once, since the device attribute that used to announce
    // them is deprecated.
    CUresult probe = cuStreamWriteValue32((CUstream)sb, (CUdeviceptr)flag, 0, 0);
    if (probe == CUDA_ERROR_NOT_SUPPORTED) {
        printf("stream_wait x_sum=%llu flag=%d (no stream memory operations)\n",
               (unsigned long long)launches * n, rounds);
        return 0;
    }
    if (probe != CUDA_SUCCESS || cudaStreamSynchronize(sb) != cudaSuccess) {
        fprintf(stderr, "%s\n", driver_error("cuStreamWriteValue32", probe).c_str());
        return 1;
    }
    std::atomic<bool> a_started{false};
    std::string b_error;
    std::thread tb([&] {
        if (cudaSetDevice(0) != cudaSuccess) { b_error = "cudaSetDevice"; return; }
        for (long spins = 0; !a_started.load(); spins++) {
            if (spins > 2000000000L) { b_error = "A never launched"; return; }
        }
        for (int r = 1; r <= rounds && b_error.empty(); r++) {
            CUresult w = cuStreamWaitValue32((CUstream)sa, (CUdeviceptr)flag, (cuuint32_t)r,
                                             CU_STREAM_WAIT_VALUE_GEQ);
            if (w != CUDA_SUCCESS) b_error = driver_error("cuStreamWaitValue32", w);
            w = cuStreamWriteValue32((CUstream)sb, (CUdeviceptr)flag, (cuuint32_t)r, 0);
            if (w != CUDA_SUCCESS) b_error = driver_error("cuStreamWriteValue32", w);
        }
        if (cudaStreamSynchronize(sb) != cudaSuccess && b_error.empty()) b_error = "thread B";
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
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess || !b_error.empty()) {
        fprintf(stderr, "errors: [%s] [%s]\n", cudaGetErrorName(e), b_error.c_str());
        return 1;
    }
    std::vector<uint32_t> h(n);
    uint32_t hflag = 0;
    cudaMemcpy(h.data(), x, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hflag, flag, 4, cudaMemcpyDeviceToHost);
    unsigned long long s = 0;
    for (uint32_t v : h) s += v;
    printf("stream_wait x_sum=%llu flag=%u (one run: %llu, %d)\n", s, hflag,
           (unsigned long long)launches * n, rounds);
    return s == (unsigned long long)launches * n && hflag == (uint32_t)rounds ? 0 : 2;
}
