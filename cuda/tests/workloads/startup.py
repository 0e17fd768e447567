"""CUDA start-up and one small kernel: what an injected library costs a program before any
replay (compare.py with 1 pass measures interception alone; with this program nearly all of it
is start-up)."""
from common import checksum, torch

x = torch.ones(1024, device="cuda")
x += 1
torch.cuda.synchronize()
checksum("startup.x", x)
