"""What a rank's RAM costs per added parameter with everything offloaded (ZeRO-Infinity).

    python scripts/bench/bench_offload_slope.py --nvme-path /tmp/zero_ref_slope
    python scripts/bench/bench_offload_slope.py --nvme-path /tmp/x --d-model 512 --layers 4 16

Runs `mpirun -n 4 python -m zero_ref.train` at stage 3, fp32, with
`--offload-optimizer nvme --offload-param nvme` and activation checkpointing,
at one width and two depths, and reads each run's final --log-jsonl record:
every rank's peak resident set above its baseline (the trainer's, taken after
imports), max over the phases. It reports that peak per rank (max and mean over
ranks) for each depth, and the marginal cost of the deeper model,

    slope = delta(peak RSS per rank) / delta(padded parameters)
          (bytes per added parameter per rank),

with the ledger's RAM and on-disk bytes beside it. With every model state on
disk a rank's RAM should grow by one unit's buffers and the pool, not with the
depth: the target is a slope <= 0.1 (it was 1.04 with the fp32 gradient shard
in RAM). Run it before and after a change with PYTHONPATH pointing at each
tree; one JSON line last (--record writes docs/results/NAME.json).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
import zero_ref
from scripts.bench.bench_common import add_record_flag, emit
from scripts.bench.bench_memory import run_one

TARGET = 0.1  # bytes per added parameter per rank


def flags(d_model: int, n_layer: int, a: argparse.Namespace) -> list[str]:
    """The zero_ref.train flags of one run (without the log path)."""
    return [
        *("--stage", "3", "--precision", "fp32", "--checkpoint-activations"),
        *("--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path", a.nvme_path),
        *("--d-model", str(d_model), "--n-layer", str(n_layer), "--n-head", str(a.n_head)),
        *("--context", str(a.context), "--micro-batch-size", "1", "--steps", str(a.steps)),
        *("--grad-accum", str(a.grad_accum), "--batch-size", str(a.ranks * a.grad_accum)),
        *("--quiet", "--sample-chars", "0"),
    ]


def one_depth(d_model: int, n_layer: int, a: argparse.Namespace, tmp: Path) -> dict:
    """Peak RSS per rank above baseline (max over phases), and the ledger, of one run."""
    t0 = time.perf_counter()
    final = run_one(flags(d_model, n_layer, a), a, tmp)
    wall = time.perf_counter() - t0
    ranks = final["ranks"]
    peaks = [max(r["rss_peak_bytes"].values()) for r in ranks]
    return {
        "n_layer": n_layer,
        "run_s": wall,  # the whole mpirun: start, init, the steps, the report
        "numel_padded": final["numel_padded"],
        "peak_rss_max_bytes": max(peaks),
        "peak_rss_mean_bytes": sum(peaks) / len(peaks),
        "ledger_ram_peak_bytes": max(r["peak_bytes"] for r in ranks),
        "ledger_ram_bytes": max(sum(r["memory_bytes"].values()) for r in ranks),
        "ledger_disk_bytes": max(sum(r.get("disk_bytes", {}).values()) for r in ranks),
        "ledger_disk_by_category": ranks[0].get("disk_bytes", {}),
        "ledger_ram_by_category": ranks[0]["memory_bytes"],
    }


def slope(small: dict, big: dict, key: str) -> float:
    return (big[key] - small[key]) / (big["numel_padded"] - small["numel_padded"])


def _commit(tree: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nvme-path", required=True, help="folder for the swap files (absolute)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, nargs=2, default=[4, 16], metavar=("SMALL", "BIG"))
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per mpirun")
    add_record_flag(p, "bench_offload_slope")
    a = p.parse_args()
    a.nvme_path = os.path.abspath(a.nvme_path)
    a.export = False  # run_one's flag: no --export
    Path(a.nvme_path).mkdir(parents=True, exist_ok=True)
    # `python -m zero_ref.train` imports from its working folder first: run the ranks
    # from the tree this script imported, so that PYTHONPATH picks the code they run
    tree = Path(zero_ref.__file__).parent.parent
    os.chdir(tree)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_depth(a.d_model, n, a, Path(tmp)) for n in a.layers]
    small, big = runs
    out = {
        "zero_ref": str(tree),  # which tree ran, at which commit
        "zero_ref_commit": _commit(tree),
        "d_model": a.d_model,
        "ranks": a.ranks,
        "steps": a.steps,
        "grad_accum": a.grad_accum,
        "context": a.context,
        "runs": runs,
        "slope_max_bytes_per_param": slope(small, big, "peak_rss_max_bytes"),
        "slope_mean_bytes_per_param": slope(small, big, "peak_rss_mean_bytes"),
        "ledger_ram_slope_bytes_per_param": slope(small, big, "ledger_ram_peak_bytes"),
        "target": TARGET,
        "load_average": os.getloadavg()[0],
    }
    out["meets_target"] = out["slope_max_bytes_per_param"] <= TARGET
    for r in runs:
        print(
            f"d_model {a.d_model}, {r['n_layer']:>2} layers, {r['numel_padded']:>11,} params: "
            f"peak RSS per rank above baseline {r['peak_rss_max_bytes'] / 2**20:7.1f} MiB (max), "
            f"{r['peak_rss_mean_bytes'] / 2**20:7.1f} MiB (mean); ledger RAM "
            f"{r['ledger_ram_peak_bytes'] / 2**20:.1f} MiB, on disk "
            f"{r['ledger_disk_bytes'] / 2**20:.1f} MiB; {r['run_s']:.0f} s",
            file=sys.stderr,
        )
    print(
        f"slope: {out['slope_max_bytes_per_param']:.3f} bytes per added parameter per rank "
        f"(max over ranks; mean {out['slope_mean_bytes_per_param']:.3f}; ledger's RAM "
        f"{out['ledger_ram_slope_bytes_per_param']:.3f}); target <= {TARGET}",
        file=sys.stderr,
    )
    emit(out, a.record, None)


if __name__ == "__main__":
    main()
