// Stream capture on one thread while another thread launches non-idempotent kernels.
//
// Thread A captures stream sa into a graph in cudaStreamCaptureModeGlobal (the default mode,
// the one PyTorch's CUDA graphs use): x += 1 kernels on sa are captured, with a stream-ordered
// allocation the graph makes, uses and frees, and while capturing it also launches one kernel
// on another stream (sc), which runs. Thread B launches x += 1 on its
// own stream (sb) `during` times, all of them while A's capture is open (A begins the capture
// before it lets B start, and ends it only after B has issued them all: flags, no sleeps), then
// `after` times once the capture has ended. A instantiates the graph and launches it `graphs`
// times. Every buffer is checked against the count of kernels that ran; the program prints
// checksums and whether the capture succeeded, and exits 2 on any difference.
//
// Under `kreplay run --passes N --check` the output must be the same as without kreplay: a
// replay must neither break the capture (cuStreamEndCapture failing) nor leave a buffer with
// more or fewer increments.
//
// Build: nvcc -O2 -o capture_overlap capture_overlap.cu
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

__global__ void add_one(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

// Phases A and B hand over, each waited for with a deadline.
static std::mutex mu;
static std::condition_variable cv;
// 1: B is set up; 2: A's capture is open; 3: B issued its launches; 4: A's capture ended.
static int phase = 0;

static void set_phase(int p) {
    {
        std::lock_guard<std::mutex> g(mu);
        phase = p;
    }
    cv.notify_all();
}

static bool wait_phase(int p) {
    std::unique_lock<std::mutex> g(mu);
    return cv.wait_for(g, std::chrono::seconds(60), [&] { return phase >= p; });
}

static std::string err(const char *what, cudaError_t e) {
    return std::string(what) + ": " + cudaGetErrorName(e);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (1u << 20);  // words per buffer
    const int captured = 3, during = 20, after = 5, graphs = 4;
    unsigned blocks = (unsigned)((n + 255) / 256);
    size_t bytes = n * sizeof(uint32_t);
    uint32_t *a, *b, *c, *w;
    cudaStream_t sa, sb, sc;
    if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes) || cudaMalloc(&c, bytes) ||
        cudaMalloc(&w, bytes) || cudaMemset(a, 0, bytes) || cudaMemset(b, 0, bytes) ||
        cudaMemset(c, 0, bytes) || cudaMemset(w, 0, bytes) ||
        cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&sc, cudaStreamNonBlocking) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    // One ordinary launch before any capture (replayed under kreplay).
    add_one<<<blocks, 256>>>(w, n);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;

    std::string a_error, b_error;
    std::thread tb([&] {
        // The thread's runtime state is set up before the capture begins.
        cudaError_t e = cudaSetDevice(0);
        if (e == cudaSuccess) e = cudaStreamSynchronize(sb);
        if (e != cudaSuccess) b_error = err("thread setup", e);
        set_phase(1);
        if (!wait_phase(2)) { b_error = "no capture began"; set_phase(3); return; }
        for (int k = 0; k < during; k++) {
            add_one<<<blocks, 256, 0, sb>>>(b, n);
            e = cudaGetLastError();
            if (e != cudaSuccess && b_error.empty()) b_error = err("launch during capture", e);
        }
        set_phase(3);
        if (!wait_phase(4)) { b_error = "the capture never ended"; return; }
        for (int k = 0; k < after; k++) add_one<<<blocks, 256, 0, sb>>>(b, n);
        e = cudaStreamSynchronize(sb);
        if (e != cudaSuccess && b_error.empty()) b_error = err("after capture", e);
    });

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaSuccess;
    if (!wait_phase(1)) a_error = "thread B never started";
    if (a_error.empty()) e = cudaStreamBeginCapture(sa, cudaStreamCaptureModeGlobal);
    if (!a_error.empty() || e != cudaSuccess) {
        if (a_error.empty()) a_error = err("cudaStreamBeginCapture", e);
        set_phase(4);
    } else {
        for (int k = 0; k < captured - 1; k++) add_one<<<blocks, 256, 0, sa>>>(a, n);
        // A graph allocation: allocated, used and freed by the graph itself.
        uint32_t *scratch = nullptr;
        e = cudaMallocAsync((void **)&scratch, bytes, sa);
        if (e == cudaSuccess) e = cudaMemsetAsync(scratch, 0, bytes, sa);
        if (e == cudaSuccess) add_one<<<blocks, 256, 0, sa>>>(scratch, n);
        if (e == cudaSuccess) e = cudaFreeAsync(scratch, sa);
        if (e != cudaSuccess) a_error = err("graph allocation", e);
        // From the capturing thread, on a stream that is not captured: runs now, once.
        add_one<<<blocks, 256, 0, sc>>>(c, n);
        set_phase(2);
        if (!wait_phase(3)) a_error = "thread B never launched";
        add_one<<<blocks, 256, 0, sa>>>(a, n);
        e = cudaStreamEndCapture(sa, &graph);
        set_phase(4);
        if (e != cudaSuccess && a_error.empty()) a_error = err("cudaStreamEndCapture", e);
    }
    tb.join();
    if (a_error.empty()) {
        e = cudaGraphInstantiate(&exec, graph, 0);
        if (e != cudaSuccess) a_error = err("cudaGraphInstantiate", e);
    }
    if (a_error.empty()) {
        for (int k = 0; k < graphs; k++) cudaGraphLaunch(exec, sa);
        e = cudaStreamSynchronize(sa);
        if (e != cudaSuccess) a_error = err("graph launches", e);
    }
    cudaError_t synced = cudaDeviceSynchronize();

    struct Buf { const char *name; uint32_t *dev; uint32_t expect; };
    Buf bufs[] = {{"graph", a, (uint32_t)(captured * graphs)},
                  {"other_thread", b, (uint32_t)(during + after)},
                  {"capturing_thread_other_stream", c, 1},
                  {"before_capture", w, 1}};
    std::vector<uint32_t> host(n);
    bool ok = a_error.empty() && b_error.empty() && synced == cudaSuccess;
    printf("capture: %s\n", a_error.empty() ? "ok" : a_error.c_str());
    printf("other thread: %s\n", b_error.empty() ? "ok" : b_error.c_str());
    for (const Buf &buf : bufs) {
        if (cudaMemcpy(host.data(), buf.dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
            printf("checksum %s: copy failed\n", buf.name);
            ok = false;
            continue;
        }
        uint64_t sum = 0, wrong = 0;
        for (size_t i = 0; i < n; i++) {
            sum += host[i];
            if (host[i] != buf.expect) wrong++;
        }
        printf("checksum %s sum=%llu wrong_words=%llu\n", buf.name, (unsigned long long)sum,
               (unsigned long long)wrong);
        if (wrong) ok = false;
    }
    return ok ? 0 : 2;
}
