"""Per-step collective time of the ZeRO engine against raw mpi4py moving the same bytes.

Four measurements of one optimizer step's collectives, interleaved step by
step and each a median over the same --steps steps after --warmup steps:

  engine   train_step on a ReplayModel; the seconds its CommLedger records
           (every collective of the step, summed over kinds).
  synced   the same, with a Comm that calls Barrier before each collective,
           outside the ledger's timing, so ranks enter every collective
           together; `wait` is the seconds spent in those Barriers.
  wrapper  the same calls through zero_ref.comm.collectives.Comm (checks, lambda, ledger)
           back to back on preallocated buffers: Barrier, Wtime, calls, Wtime.
  raw      the same calls straight to mpi4py on preallocated buffers of
           identical sizes: Barrier, Wtime, calls, Wtime.

overhead_ratio = synced / raw: the engine's collectives, timed as the raw ones
are (ranks entering together), against raw mpi4py moving the same bytes.
wrapper / raw is what comm.py's own code costs. engine / raw is also reported
(ledger_ratio_with_arrival_wait): engine - synced is ranks arriving at a
collective at different moments (after unequal compute, worse with 4 ranks on
2 cores) and waiting inside it, which the ledger counts as communication.

    mpirun -n 4 python scripts/bench/bench_comm.py [--params 4e6] [--units 4] [--stage 2]

Rank 0 prints a table; the last line is one JSON object.
"""

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import sys
from pathlib import Path

import numpy as np

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
from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.layout.buckets import bucket_columns
from zero_ref.models.unit import init_params


def call_plan(engine) -> list[tuple[str, int]]:
    """The engine's collectives of one step, in order: (kind, numel of the full buffer)."""
    units, stage, w = engine.layout.units, engine.stage, engine.world
    if stage == 0:  # the gradient all-reduced in chunks of bucket_numel
        n, chunk = engine.layout.full_numel, bucket_columns(engine.cfg.bucket_numel, w) * w
        return [*[("allreduce", min(chunk, n - s)) for s in range(0, n, chunk)], ("loss", 1)]
    fires = {i: [] for i in range(len(units))}  # buckets a unit's backward completes
    for bucket in engine.buckets.plan:
        fires[bucket.first_unit].append(("reduce_scatter", bucket.shard_numel * w))
    gathered = [i for i, u in enumerate(units) if u.padded_numel]
    plan = [("gather", units[i].padded_numel) for i in gathered] if stage == 3 else []
    for i in reversed(range(len(units))):  # backward
        if stage == 3 and i in gathered and i != gathered[-1]:  # the last one is still held
            plan.append(("gather", units[i].padded_numel))
        if stage >= 2:
            plan += fires[i]
    if stage == 1:
        plan += [call for i in reversed(range(len(units))) for call in fires[i]]
    plan.append(("norm", 1))
    if stage in (1, 2):
        plan += [("gather_in_place", u.padded_numel) for u in units if u.padded_numel]
    return [*plan, ("loss", 1)]


def raw_step(mpi, plan, bufs) -> None:
    """One step's collectives straight to mpi4py, on preallocated buffers."""
    for kind, numel in plan:
        full, shard = bufs[numel]
        if kind == "allreduce":
            mpi.Allreduce(MPI.IN_PLACE, full, op=MPI.SUM)
        elif kind == "reduce_scatter":
            mpi.Reduce_scatter_block(full, shard, op=MPI.SUM)
        elif kind == "gather":
            mpi.Allgather(shard, full)
        elif kind == "gather_in_place":
            mpi.Allgather(MPI.IN_PLACE, full)
        else:  # norm, loss: one float64 per rank
            out = np.empty(1, np.float64)
            mpi.Allreduce(np.ones(1, np.float64), out, op=MPI.SUM)


def wrapper_step(comm: Comm, plan, bufs) -> None:
    """The same step through zero_ref.comm.collectives.Comm (its checks and its ledger)."""
    for kind, numel in plan:
        full, shard = bufs[numel]
        if kind == "allreduce":
            comm.allreduce_sum(full)
        elif kind == "reduce_scatter":
            comm.reduce_scatter_sum(full, shard)
        elif kind == "gather":
            comm.allgather(shard, full)
        elif kind == "gather_in_place":
            comm.allgather_in_place(full)
        else:
            comm.allreduce_float64(1.0, kind=kind)
    comm.ledger.end_step()


class SyncedComm(Comm):
    """A Comm whose blocking collectives first Barrier, outside the ledger's timing;
    wait_s adds up the seconds spent in those Barriers (how far apart ranks arrive)."""

    wait_s = 0.0

    def _barrier(self) -> None:
        t0 = MPI.Wtime()
        self.mpi.Barrier()
        self.wait_s += MPI.Wtime() - t0

    def _timed(self, *args) -> None:
        self._barrier()
        super()._timed(*args)

    def allreduce_float64(self, value: float, kind: str) -> float:
        self._barrier()
        return super().allreduce_float64(value, kind)


def timed(mpi, fn) -> float:
    """Barrier, Wtime, fn(), Wtime."""
    mpi.Barrier()
    t0 = MPI.Wtime()
    fn()
    return MPI.Wtime() - t0


def measure(mpi, args) -> tuple[dict, dict, dict]:
    """Per-step seconds of every series, per-kind medians, and the engine's last ledger step."""
    model = replay_model(int(args.params), args.units)
    cfg = ZeroConfig(stage=args.stage, bucket_numel=args.bucket_numel, deterministic=False)
    params = init_params(model, args.seed)
    engine = make_engine(model, params, cfg, Comm(mpi))
    synced = make_engine(model, params, cfg, SyncedComm(mpi))
    wrapper, plan, w = Comm(mpi), call_plan(engine), mpi.Get_size()
    bufs = {n: (np.ones(n, np.float32), np.ones(n // w, np.float32)) for _, n in plan}
    series = {k: [] for k in ("step", "wait", "raw", "wrapper")}
    for step in range(args.warmup + args.steps):  # interleaved, so load hits all alike
        x, y = step_inputs(model, args.seed, step, mpi.Get_rank(), w)
        synced.comm.wait_s = 0.0
        t = {"step": timed(mpi, lambda x=x, y=y: engine.train_step(x, y))}
        timed(mpi, lambda x=x, y=y: synced.train_step(x, y))
        t["wait"] = synced.comm.wait_s
        t["raw"] = timed(mpi, lambda: raw_step(mpi, plan, bufs))
        t["wrapper"] = timed(mpi, lambda: wrapper_step(wrapper, plan, bufs))
        if step >= args.warmup:
            for k, v in t.items():
                series[k].append(v)
    last = engine.comm.ledger.last_step()
    assert _calls_and_bytes(wrapper.ledger.last_step()) == _calls_and_bytes(last), "plan differs"
    ledgers = {
        "engine": engine.comm.ledger,
        "synced": synced.comm.ledger,
        "wrapper": wrapper.ledger,
    }
    kinds = {}
    for name, ledger in ledgers.items():
        timed_steps = ledger.history[args.warmup :]
        # engine, synced: the ledger's seconds; wrapper keeps its Wtime series, as raw does
        series.setdefault(name, [sum(k["seconds"] for k in t.values()) for t in timed_steps])
        kinds[name] = {k: median([t[k]["seconds"] for t in timed_steps]) for k in last}
    return series, kinds, last


def _calls_and_bytes(totals: dict) -> dict:
    return {k: (v["calls"], v["sent_bytes"], v["recv_bytes"]) for k, v in totals.items()}


def print_table(per_rank: dict, kinds: dict, last: dict) -> None:
    cols = ("engine", "synced", "wrapper", "raw", "wait", "step")
    print(f"{'rank':>4}" + "".join(f" {c + ' ms':>11}" for c in cols))
    for r in range(len(per_rank["raw"])):
        print(f"{r:>4}" + "".join(f" {per_rank[c][r] * 1e3:>11.2f}" for c in cols))
    print(
        f"{'rank 0, by kind':>15} {'calls':>6} {'sent MB':>8}"
        + "".join(f" {c + ' ms':>11}" for c in cols[:3])
    )
    for kind, t in last.items():
        ms = "".join(f" {kinds[c].get(kind, float('nan')) * 1e3:>11.2f}" for c in cols[:3])
        print(f"{kind:>15} {t['calls']:>6} {t['sent_bytes'] / 1e6:>8.2f}" + ms)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=4e6, help="parameters in the model")
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--stage", type=int, default=2, choices=(0, 1, 2, 3))
    p.add_argument("--bucket-numel", type=int, default=None, help="default: one bucket")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    add_record_flag(p, "bench_comm")
    args = p.parse_args()
    args.bucket_numel = args.bucket_numel or int(2 * args.params)
    return args


def main() -> None:
    args = parse_args()
    mpi = MPI.COMM_WORLD.Dup()
    series, kinds, last = measure(mpi, args)
    per_rank = gather_medians(mpi, series)
    if mpi.Get_rank() != 0:
        return
    print_table(per_rank, kinds, last)
    s = {k: median(v) for k, v in per_rank.items()}  # median over ranks of per-rank medians
    emit(
        {
            "bench": "comm",
            "world": mpi.Get_size(),
            "stage": args.stage,
            "params": model_numel(replay_model(int(args.params), args.units)),
            "units": args.units,
            "bucket_numel": args.bucket_numel,
            "steps": args.steps,
            "engine_s": s["engine"],
            "synced_s": s["synced"],
            "wrapper_s": s["wrapper"],
            "synced_barrier_wait_s": s["wait"],
            "raw_s": s["raw"],
            "train_step_s": s["step"],
            "overhead_ratio": s["synced"] / s["raw"],
            "ledger_ratio_with_arrival_wait": s["engine"] / s["raw"],
            "wrapper_ratio": s["wrapper"] / s["raw"],
            "per_rank_s": per_rank,
            "rank0_kind_s": kinds,
            "ledger_bytes": {
                k: {f: v[f] for f in ("calls", "sent_bytes", "recv_bytes")} for k, v in last.items()
            },
            "load_average": load_average(),
        },
        args.record,
        mpi.Get_size(),
    )


if __name__ == "__main__":
    main()
