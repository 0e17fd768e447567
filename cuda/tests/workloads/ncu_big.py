"""A 32 GiB footprint (one tensor) updated in place once: x += 1, then a strided checksum."""
from common import checksum, torch

x = torch.zeros(8 << 30, device="cuda")  # 32 GiB
x += 1
torch.cuda.synchronize()
print(f"checksum big1.x sum={x[::4096].double().sum().item():.17g}", flush=True)
