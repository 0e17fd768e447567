"""Shared helpers of the workloads: deterministic setup and exact checksums."""
import hashlib
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def checksum(name, t):
    """Print the sum and a hash of the bytes of `t`: equal runs print equal lines."""
    t = t.detach().contiguous()
    digest = hashlib.sha256(t.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    print(f"checksum {name} sum={t.double().sum().item():.17g} sha256={digest}", flush=True)
