"""Embedding update with index_add_ (duplicate indices), plus softmax and layer_norm."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(3)
vocab, dim = 200_000, 256
emb = torch.randn(vocab, dim, device="cuda", generator=g)
counts = torch.zeros(vocab, device="cuda", dtype=torch.int64)
for step in range(8):
    idx = torch.randint(0, vocab, (65536,), device="cuda", generator=g)
    grad = torch.randn(65536, dim, device="cuda", generator=g)
    emb.index_add_(0, idx, grad, alpha=-0.01)
    counts.index_add_(0, idx, torch.ones_like(idx))
    rows = emb[idx[:4096]]
    probs = torch.softmax(rows, dim=-1)
    normed = torch.nn.functional.layer_norm(rows, (dim,))
torch.cuda.synchronize()
checksum("index_add.emb", emb)
checksum("index_add.counts", counts)
checksum("index_add.probs", probs)
checksum("index_add.normed", normed)
