"""What deterministic mode costs, per stage.

For each stage it builds the same engine twice on a ReplayModel: once fast
(ZeroConfig(deterministic=False), Comm with MPI_SUM reductions and a float32
norm) and once deterministic (rank-order sums through Alltoall, the exact
float64 gradient norm). Steps of the two alternate, so machine load hits both
alike; each is timed as Barrier, Wtime, train_step, Wtime, and the median over
--steps steps after --warmup is taken per rank, then the median over ranks.
comm_s is the part of the step the engine's CommLedger records; norm_fast_s
and norm_exact_s time the two gradient-norm partials alone on the gradient a
rank owns (all of it at stage 0, its shard above).

    mpirun -n 4 python scripts/bench/bench_determinism.py [--stages 0 1 2 3] [--params 2e6]

Rank 0 prints a table; the last line is one JSON object.
"""

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

from scripts.bench.bench_common import (
    add_record_flag,
    emit,
    gather_medians,
    load_average,
    median,
    model_numel,
    replay_model,
    step_inputs,
)
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.optim.gradnorm import sumsq_bins, sumsq_fast

MODES = {"fast": False, "deterministic": True}


def time_stage(mpi, model, params, stage: int, args) -> dict[str, list[float]]:
    """Per-step seconds of train_step and of its collectives, for both modes."""
    configs = {
        mode: ZeroConfig(stage=stage, bucket_numel=args.bucket_numel, deterministic=det)
        for mode, det in MODES.items()
    }
    engines = {
        mode: make_engine(model, params, cfg, comm_for(mpi, cfg)) for mode, cfg in configs.items()
    }
    samples = {f"{mode}_{k}": [] for mode in MODES for k in ("s", "comm_s")}
    for step in range(args.warmup + args.steps):
        x, y = step_inputs(model, args.seed, step, mpi.Get_rank(), mpi.Get_size())
        for mode, engine in engines.items():
            mpi.Barrier()
            t0 = MPI.Wtime()
            engine.train_step(x, y)
            dt = MPI.Wtime() - t0
            if step >= args.warmup:
                samples[f"{mode}_s"].append(dt)
                comm = engine.comm.ledger.last_step().values()
                samples[f"{mode}_comm_s"].append(sum(k["seconds"] for k in comm))
    samples.update(norm_seconds(engines["fast"], args.steps))
    return samples


def norm_seconds(engine, repeats: int) -> dict[str, list[float]]:
    """Seconds of this rank's norm partial over the gradient it owns, fast vs exact."""
    grads = [owned[1] for owned in engine.owned_slices()]  # (param, grad, master, m, v)
    out = {}
    for name, partial in (("norm_fast_s", sumsq_fast), ("norm_exact_s", sumsq_bins)):
        out[name] = []
        for _ in range(repeats):
            t0 = MPI.Wtime()
            for g in grads:
                partial(g)
            out[name].append(MPI.Wtime() - t0)
    return out


def print_table(rows: list[dict]) -> None:
    print(
        f"{'stage':>5} {'fast ms':>9} {'determ. ms':>11} {'ratio':>6}"
        f" {'comm fast':>10} {'comm det':>9} {'norm fast':>10} {'norm exact':>11}   (ms)"
    )
    for r in rows:
        print(
            f"{r['stage']:>5} {r['fast_s'] * 1e3:>9.1f} {r['deterministic_s'] * 1e3:>11.1f}"
            f" {r['ratio']:>6.2f} {r['fast_comm_s'] * 1e3:>10.1f}"
            f" {r['deterministic_comm_s'] * 1e3:>9.1f} {r['norm_fast_s'] * 1e3:>10.2f}"
            f" {r['norm_exact_s'] * 1e3:>11.1f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=(0, 1, 2, 3))
    p.add_argument("--params", type=float, default=2e6)
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--bucket-numel", type=int, default=1 << 20)  # docs/determinism.md's runs
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    add_record_flag(p, "bench_determinism")
    args = p.parse_args()
    mpi = MPI.COMM_WORLD.Dup()
    model = replay_model(int(args.params), args.units)
    params = init_params(model, args.seed)
    rows = []
    for stage in args.stages:
        per_rank = gather_medians(mpi, time_stage(mpi, model, params, stage, args))
        if per_rank is not None:
            row = {"stage": stage, **{k: median(v) for k, v in per_rank.items()}}
            row["ratio"] = row["deterministic_s"] / row["fast_s"]
            rows.append(row)
    if mpi.Get_rank() == 0:
        print_table(rows)
        emit(
            {
                "bench": "determinism",
                "world": mpi.Get_size(),
                "params": model_numel(model),
                "steps": args.steps,
                "stages": rows,
                "load_average": load_average(),
            },
            args.record,
            mpi.Get_size(),
        )


if __name__ == "__main__":
    main()
