"""About 1 GiB of live tensors, a mix of the kernels a model step launches: in-place updates,
matmuls accumulating into their output, softmax and layer_norm, an embedding update with
index_add_ (duplicate indices), and a loop feeding its output back as input. 6 steps."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(7)
x = torch.rand(96 << 20, device="cuda", generator=g)  # 384 MiB
emb = torch.zeros(100000, 512, device="cuda")  # 195 MiB
a = torch.randn(2048, 2048, device="cuda", generator=g)
b = torch.randn(2048, 2048, device="cuda", generator=g)
c = torch.zeros(2048, 2048, device="cuda")
h = torch.randn(8192, 2048, device="cuda", generator=g)  # 64 MiB
w = torch.randn(2048, 2048, device="cuda", generator=g) / 45
idx = torch.randint(0, 100000, (65536,), device="cuda", generator=g)
rows = torch.randn(65536, 512, device="cuda", generator=g)  # 128 MiB
for step in range(6):
    x += 1
    x.mul_(0.999)
    c.addmm_(a, b, alpha=1e-3)
    emb.index_add_(0, idx, rows)
    h = torch.nn.functional.layer_norm(torch.softmax(h @ w, dim=1) + h, (2048,))
torch.cuda.synchronize()
checksum("mixed.x", x)
checksum("mixed.c", c)
checksum("mixed.emb", emb)
checksum("mixed.h", h)
