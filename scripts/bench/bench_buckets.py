"""What a gradient bucket trades, measured: staging memory against calls and step time.

    mpirun -n 4 python scripts/bench/bench_buckets.py [--stage 2] [--steps 30] [--d-model 64]

At stages 1-3 the gradients are reduce-scattered a bucket at a time
(zero_ref/layout/buckets.py): a bucket of B elements is staged as W rows of
B / W columns, so the staging buffer grows with B, while the number of
Reduce_scatter calls per step falls as B grows (each call pays MPI's latency
once). For each --bucket-numel value this trains the default GPT (the model
`python -m zero_ref.train` trains; --d-model widens it) for --steps steps after
3 warm-up steps and reports, per rank: the staging bytes the memory ledger holds,
the reduce-scatter calls per step and their seconds in the last step (the
communication ledger), and the step time (median over steps of the slowest rank).
The values are run round-robin, one step each in turn, so a noisy machine affects
all of them alike. JSON last.
"""

from __future__ import annotations

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.cli import parse_args
from zero_ref.app.data import encode_corpus, load_text
from zero_ref.app.tasks import build_task
from zero_ref.comm.choose import comm_for
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine

SIZES = [1024, 4096, 8192, 32768, 131072, 1 << 20]


def build(bucket_numel: int, a: argparse.Namespace, world: MPI.Comm):
    flags = ["--stage", str(a.stage), "--bucket-numel", str(bucket_numel)]
    flags += ["--d-model", str(a.d_model), "--deterministic"]
    parsed = parse_args(flags, world_size=world.size)
    vocab, tokens = encode_corpus(load_text(None))
    task = build_task(parsed.run, vocab, tokens, world.size, parsed.zero.grad_accum)
    comm = comm_for(world.Dup(), parsed.zero)
    engine = make_engine(task.model, RandomInit(task.model, 0), parsed.zero, comm)
    return engine, task


def one_step(engine, task, step: int, world: MPI.Comm) -> float:
    """The slowest rank's seconds for one training step."""
    inputs, targets = task.batches(step)
    world.Barrier()
    t0 = time.perf_counter()
    engine.train_step(inputs[:, world.rank], targets[:, world.rank])
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    add_record_flag(p, "bench_buckets")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    runs = {b: build(b, a, world) for b in a.sizes}
    times: dict[int, list[float]] = {b: [] for b in a.sizes}
    for step in range(3 + a.steps):
        for b, (engine, task) in runs.items():
            t = one_step(engine, task, step, world)
            if step >= 3:
                times[b].append(t)
    rows = []
    for b, (engine, _) in runs.items():
        last = engine.comm.ledger.last_step().get("reduce_scatter", {})
        staging = engine.memory.held["buffers"]["bucket_staging"].nbytes
        rows.append(
            {
                "bucket_numel": b,
                "staging_bytes": int(staging),
                "reduce_scatter_calls_per_step": int(last.get("calls", 0)),
                "reduce_scatter_s_last_step": last.get("seconds", 0.0),
                "step_s": statistics.median(times[b]),
            }
        )
    if world.rank != 0:
        return
    numel = runs[a.sizes[0]][0].layout.full_numel
    print(f"stage {a.stage}, {world.size} ranks, GPT of {numel:,} padded parameters")
    print("bucket_numel  staging bytes  reduce-scatters/step  their s (last step)  step ms")
    for r in rows:
        print(
            f"{r['bucket_numel']:>12,} {r['staging_bytes']:>14,} "
            f"{r['reduce_scatter_calls_per_step']:>21} {r['reduce_scatter_s_last_step']:>20.4f} "
            f"{1e3 * r['step_s']:>8.1f}",
            flush=True,
        )
    emit(
        {
            "stage": a.stage,
            "ranks": world.size,
            "d_model": a.d_model,
            "steps": a.steps,
            "padded_numel": numel,
            "rows": rows,
            "load_average": load_average(),
        },
        a.record,
        world.size,
    )


if __name__ == "__main__":
    main()
