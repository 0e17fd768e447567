"""Half-precision matmuls with accumulation on Hopper: C += A @ B in place (addmm_, baddbmm_)
in bf16 and fp16. On an H100/H200 cuBLAS picks kernels that load and store through Tensor
Memory Accelerator descriptors (CUtensorMap, 128 bytes passed by value) rather than plain
pointer arguments, so a kernel's output may be reached only through such a descriptor."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(5)
for dtype in (torch.bfloat16, torch.float16):
    a = (torch.randn(4096, 4096, device="cuda", generator=g) / 64).to(dtype)
    b = (torch.randn(4096, 4096, device="cuda", generator=g) / 64).to(dtype)
    c = torch.zeros(4096, 4096, device="cuda", dtype=dtype)
    x = (torch.randn(8, 512, 256, device="cuda", generator=g) / 16).to(dtype)
    y = (torch.randn(8, 256, 512, device="cuda", generator=g) / 16).to(dtype)
    z = torch.ones(8, 512, 512, device="cuda", dtype=dtype)
    for _ in range(4):
        c.addmm_(a, b)
        z.baddbmm_(x, y, beta=0.5)
    torch.cuda.synchronize()
    checksum(f"matmul_bf16.{str(dtype)[6:]}.c", c)
    checksum(f"matmul_bf16.{str(dtype)[6:]}.z", z)
