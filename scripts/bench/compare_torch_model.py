"""zero_ref's GPT beside the same GPT in torch: forward + backward, one thread each.

    pip install -e '.[torch]' && python scripts/bench/compare_torch_model.py [--rounds 5]

The same architecture (pre-LN blocks, causal attention, tanh GELU, untied head),
the same sizes as the default `python -m zero_ref.train` run at its per-rank
micro-batch (vocab 103, context 64, 2 layers, 4 heads, d_model 64, 8 sequences),
one BLAS/OpenMP thread for both, as each of 4 ranks on 2 cores gets. The two
alternate in one process over --rounds rounds of --reps steps, so a busy
neighbour slows both alike; the medians and their ratio are printed, JSON last.
Issue 7 set the default model's target at 1.3x torch.
"""

# isort: off
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads BLAS
# isort: on
import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from zero_ref.models.gpt import GPT, GPTConfig  # noqa: E402
from zero_ref.models.unit import init_params, loss_and_grads  # noqa: E402

V, T, L, H, C, B = 103, 64, 2, 4, 64, 8


class TorchBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln2, self.fc, self.fc2 = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(self.mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([TorchBlock() for _ in range(L)])
        self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x)).view(-1, V), targets.view(-1))


def timed(step, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    ours = GPT(GPTConfig(V, T, L, H, C))
    params = init_params(ours, 0)
    theirs = TorchGPT()
    t_ids, t_targets = torch.from_numpy(ids), torch.from_numpy(targets)

    def torch_step() -> None:
        theirs.zero_grad(set_to_none=True)
        theirs(t_ids, t_targets).backward()

    steps = {"zero_ref": lambda: loss_and_grads(ours, params, ids, targets), "torch": torch_step}
    times = {name: [] for name in steps}
    for step in steps.values():
        timed(step, 3)  # warm-up: kernels compiled, buffers allocated
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name] += timed(step, args.reps)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    ratio = ms["zero_ref"] / ms["torch"]
    print(f"zero_ref {ms['zero_ref']:.2f} ms, torch {ms['torch']:.2f} ms: {ratio:.2f}x torch")
    load = os.getloadavg()[0]
    result = {"torch": torch.__version__, "fwd_bwd_ms": ms, "ratio": ratio, "load": load}
    print(json.dumps({**result, "target_ratio": 1.3, "met": ratio <= 1.3}))


if __name__ == "__main__":
    main()
