// Kernels that write device memory another process shares with this one (CUDA IPC), directly
// and through a pointer kept in device memory.
//
// The parent allocates x (n words of 0), exports it with cudaIpcGetMemHandle and runs itself
// again as a child with the handle. The child opens the handle, keeps the pointer in a device
// table, and launches `add_direct` (x as an argument) and `add_through` (x read from the
// table) ten times each; each adds 1 to every word. The parent then prints x's sum. Under
// `kreplay run --passes N --check` the sum must be the same as without kreplay: the opened
// memory is the child's to snapshot, though no allocation call of the child returned it, and
// `add_through` names it nowhere in its arguments.
//
// Build: nvcc -O2 -o ipc ipc.cu
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#include <cuda_runtime.h>

extern char **environ;

__global__ void add_direct(uint32_t *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

__global__ void add_through(uint32_t *const *table, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) table[0][i] += 1;
}

static const size_t N = 1 << 20;
static const int LAUNCHES = 10;

static int child(const char *hex) {
    cudaIpcMemHandle_t handle;
    for (size_t k = 0; k < sizeof(handle); k++) {
        unsigned v;
        if (sscanf(hex + 2 * k, "%2x", &v) != 1) return 3;
        ((unsigned char *)&handle)[k] = (unsigned char)v;
    }
    uint32_t *x = nullptr, **table = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle((void **)&x, handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        fprintf(stderr, "child: cudaIpcOpenMemHandle: %s\n", cudaGetErrorName(e));
        return 4;
    }
    if (cudaMalloc(&table, sizeof(uint32_t *)) ||
        cudaMemcpy(table, &x, sizeof(uint32_t *), cudaMemcpyHostToDevice)) {
        fprintf(stderr, "child: setup failed\n");
        return 5;
    }
    unsigned blocks = (unsigned)((N + 255) / 256);
    for (int k = 0; k < LAUNCHES; k++) {
        add_direct<<<blocks, 256>>>(x, N);
        add_through<<<blocks, 256>>>(table, N);
    }
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "child: launches failed: %s\n", cudaGetErrorName(e));
        return 6;
    }
    cudaIpcCloseMemHandle(x);
    cudaFree(table);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
    uint32_t *x;
    cudaIpcMemHandle_t handle;
    if (cudaMalloc(&x, N * 4) || cudaMemset(x, 0, N * 4) || cudaDeviceSynchronize()) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    cudaError_t e = cudaIpcGetMemHandle(&handle, x);
    if (e != cudaSuccess) {
        // Not available here (no IPC in this container): nothing to compare.
        printf("ipc unsupported: %s\n", cudaGetErrorName(e));
        return 0;
    }
    char hex[2 * sizeof(handle) + 1];
    for (size_t k = 0; k < sizeof(handle); k++)
        sprintf(hex + 2 * k, "%02x", ((unsigned char *)&handle)[k]);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) return 1;
    self[len] = 0;
    char *args[] = {self, (char *)"child", hex, nullptr};
    pid_t pid;
    int status = 0;
    if (posix_spawn(&pid, self, nullptr, nullptr, args, environ) != 0 ||
        waitpid(pid, &status, 0) != pid) {
        fprintf(stderr, "cannot run the child\n");
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("child failed: status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 1;
    }
    std::vector<uint32_t> h(N);
    if (cudaMemcpy(h.data(), x, N * 4, cudaMemcpyDeviceToHost)) {
        fprintf(stderr, "read back failed\n");
        return 1;
    }
    uint64_t s = 0;
    for (uint32_t v : h) s += v;
    uint64_t want = (uint64_t)2 * LAUNCHES * N;
    printf("x_sum=%llu%s\n", (unsigned long long)s, s == want ? "" : " MISMATCH");
    return s == want ? 0 : 2;
}
