"""A few training steps of a two-layer MLP whose weights, gradients and momentum make about
1 GiB: the shape of a model step (matmuls forward and backward, an activation, a loss, an SGD
update with momentum in place), with few launches of a lot of work each, unlike mixed_1g.py's
many small ones. 4 steps; prints the checksums of the weights and the losses."""
from common import checksum, torch

g = torch.Generator(device="cuda").manual_seed(11)
d, hidden, batch = 4096, 8192, 2048
w1 = (torch.randn(d, hidden, device="cuda", generator=g) / d**0.5).requires_grad_()  # 128 MiB
w2 = (torch.randn(hidden, d, device="cuda", generator=g) / hidden**0.5).requires_grad_()
x = torch.randn(batch, d, device="cuda", generator=g)  # 32 MiB
target = torch.randn(batch, d, device="cuda", generator=g)
opt = torch.optim.SGD([w1, w2], lr=1e-2, momentum=0.9, foreach=False)
losses = []
for step in range(4):
    opt.zero_grad(set_to_none=False)
    h = torch.relu(x @ w1)  # 64 MiB
    out = h @ w2
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
torch.cuda.synchronize()
checksum("train.w1", w1)
checksum("train.w2", w2)
checksum("train.losses", torch.stack(losses))
