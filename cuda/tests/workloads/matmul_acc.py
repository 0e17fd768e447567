"""Matmul with accumulation: C += A @ B (addmm_ in place) and a GEMM chain, 4096^2 fp32."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(2)
a = torch.randn(4096, 4096, device="cuda", generator=g) / 64
b = torch.randn(4096, 4096, device="cuda", generator=g) / 64
c = torch.zeros(4096, 4096, device="cuda")
for _ in range(6):
    c.addmm_(a, b)
    c += a @ b.T
torch.cuda.synchronize()
checksum("matmul_acc.c", c)
