"""Where hpZ's gathers run, and what its secondary copy holds; run by tests/test_hpz.py as

    mpirun -n W python tests/mpi_hpz_check.py PARTITION_SIZE OVERLAP PRECISION

Every rank builds a stage-3 engine with hpZ (PARTITION_SIZE: an integer or "host") and
records, for each all-gather of parameters, which Comm ran it (the world's or the
partition group's) and in which phase of the step (the world Comm's context label:
"micro-step j forward u" / "backward u"). After a step (an update) and a forward, each
rank's secondary copy is compared with the gathered parameters: its group slice of each
unit, bit for bit; and the memory ledger against the estimate (state_bytes), the copy
among the buffers. Rank 0 prints one JSON line, every rank's result.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from zero_ref.app.rank_estimate import state_bytes
from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OverlapConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

UNITS = [("u0", [("w", (37, 5))]), ("u1", [("w", (9,)), ("b", (4, 4))]), ("u2", [("w", (30,))])]


def record_gathers(engine, comm, calls: list, who: str) -> None:
    """Wrap comm's allgather / iallgather so each call notes (who, the step's phase)."""
    for name in ("allgather", "iallgather"):
        original = getattr(comm, name)

        def wrapped(*args, _original=original, **kwargs):
            calls.append((who, engine.comm.where))
            return _original(*args, **kwargs)

        setattr(comm, name, wrapped)


def main() -> None:
    size, overlap, precision = sys.argv[1], sys.argv[2] == "overlap", sys.argv[3]
    partition = size if size == "host" else int(size)
    cfg = ZeroConfig(
        stage=3,
        deterministic=True,
        grad_accum=2,
        mixed_precision=MixedPrecisionConfig(dtype=precision),
        overlap=OverlapConfig(comm=overlap),
        zeropp=ZeroPPConfig(hpz_partition_size=partition),
    )
    world = MPI.COMM_WORLD
    model = ReplayModel(UNITS)
    comm = comm_for(world, cfg)
    engine = make_engine(model, init_params(model, 0), cfg, comm)
    hpz = secondary_copy(engine)
    calls: list[tuple[str, str]] = []
    record_gathers(engine, comm, calls, "world")
    if hpz is not None:
        record_gathers(engine, hpz.group, calls, "group")
    k, w = cfg.grad_accum, comm.size
    for step in range(2):
        x = model.contexts(0, step, k, w)
        engine.train_step(x[:, comm.rank], np.zeros((k, 1)))
    engine.forward(model.contexts(0, 9, 1, w)[0, comm.rank])  # fills the copy again
    engine.settle()
    kinds = sorted(comm.ledger.last_step())
    result = {"calls": calls, "kinds": kinds, "copy_equals_params": copy_matches(engine)}
    result["group_size"] = None if hpz is None else hpz.size
    sizes = engine.precision.bytes
    estimate = state_bytes(engine.layout, 3, cfg.bucket_numel, k, sizes, cfg)
    result["memory"] = [engine.memory.bytes_by_category(), estimate]
    result["secondary_bytes"] = int(
        engine.memory.held["buffers"].get("hpZ secondary", np.empty(0)).nbytes
    )
    result["psi"] = engine.layout.full_numel
    everyone = world.gather(result, root=0)
    engine.close()
    if world.rank == 0:
        print(json.dumps(everyone))


def secondary_copy(engine):
    """hpZ's secondary copy (engine/secondary_copy.py) in stage 3's gather policy, or None."""
    return getattr(engine.unit_gather, "copy", None)


def copy_matches(engine) -> bool | None:
    """Each unit's slice in the secondary copy equals its gathered parameters (the
    world's shards gathered here, outside the engine, after the update)."""
    hpz = secondary_copy(engine)
    if hpz is None:
        return None
    ok = True
    for i, unit in enumerate(engine.layout.units):
        shard = np.ascontiguousarray(engine.shard_params[unit.shard_slice()])
        full = np.empty(unit.padded_numel, shard.dtype)
        engine.comm.mpi.Allgather(shard.view(np.uint8), full.view(np.uint8))
        m = unit.padded_numel // hpz.size
        mine = full[hpz.g * m : (hpz.g + 1) * m]
        ok &= hpz.serves(i) and bool(
            np.array_equal(hpz.slice_of(i).view(np.uint8), mine.view(np.uint8))
        )
    return ok


if __name__ == "__main__":
    main()
