"""A 1 GiB footprint and a handful of kernels, for timing Nsight Compute's kernel replay against
kreplay's on the same launches: x (1 GiB) += 1, three times, then a checksum."""
from common import checksum, torch

x = torch.zeros(256 << 20, device="cuda")  # 1 GiB
for _ in range(3):
    x += 1
torch.cuda.synchronize()
print(f"checksum small.x sum={x.sum().item():.17g}", flush=True)
