"""A 32 GiB footprint: two 16 GiB tensors updated in place (x += 1, y = y * 0.5 + x), 3 steps."""
from common import checksum, torch

x = torch.ones(4 << 30, device="cuda")  # 16 GiB
y = torch.zeros(4 << 30, device="cuda")  # 16 GiB
for step in range(3):
    x += 1
    y.mul_(0.5).add_(x)
torch.cuda.synchronize()
print(f"checksum big.x sum={x[::4096].double().sum().item():.17g}", flush=True)
print(f"checksum big.y sum={y[::4096].double().sum().item():.17g}", flush=True)
