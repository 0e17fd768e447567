"""Four Python threads, each on a CUDA stream of its own, updating tensors of their own in place
(x += 1, x *= c, an index_add_ accumulation, a matmul added back) while the others do the same:
kernels, allocations of PyTorch's caching allocator and frees from several threads at once.
Each thread's tensors end as its own sequence of operations leaves them, whatever the
interleaving, so the checksums are the same in every run."""
import threading

from common import checksum, torch

THREADS, STEPS = 4, 25
results = [None] * THREADS
errors = []
start = threading.Barrier(THREADS)


def work(k):
    try:
        stream = torch.cuda.Stream()
        g = torch.Generator(device="cuda").manual_seed(100 + k)
        with torch.cuda.stream(stream):
            x = torch.rand(4 << 20, device="cuda", generator=g)
            a = torch.rand(512, 512, device="cuda", generator=g)
            acc = torch.zeros(1024, device="cuda")
            idx = torch.randint(0, 1024, (4 << 20,), device="cuda", generator=g)
            start.wait(timeout=60)
            for step in range(STEPS):
                x += 1
                x.mul_(1.0001)
                acc.index_add_(0, idx, x)
                # A temporary of the caching allocator, freed at the end of the statement.
                a += (a @ a) * 1e-6
                x.clamp_(max=50.0)
        stream.synchronize()
        results[k] = (x, a, acc)
    except Exception as e:  # reported below, so a failure changes the output
        errors.append(f"thread {k}: {e!r}")


threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=300)
torch.cuda.synchronize()
print(f"errors: {errors}")
for k, r in enumerate(results):
    if r is None:
        print(f"thread {k}: no result")
        continue
    x, a, acc = r
    checksum(f"threads.{k}.x", x)
    checksum(f"threads.{k}.a", a)
    checksum(f"threads.{k}.acc", acc)
