"""In-place updates: non-idempotent kernels (x += 1, x *= c, clamp_) over ~256 MiB."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(1)
x = torch.rand(64 << 20, device="cuda", generator=g)
n = torch.arange(64 << 20, device="cuda", dtype=torch.int32)
for step in range(10):
    x += 1
    x.mul_(1.0001)
    n += step
    x.clamp_(max=12.0)
torch.cuda.synchronize()
checksum("inplace.x", x)
checksum("inplace.n", n)
