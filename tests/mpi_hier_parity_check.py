"""Every stage on the two-level collectives against the oracle's two-level order; run by
tests/test_hierarchical.py as `mpirun -n 6 python tests/mpi_hier_parity_check.py`, and by
tests/test_netns_hier.py across namespace hosts with `--real-hosts` (the hosts MPI's
COMM_TYPE_SHARED split finds, in whatever placement the launcher gave).

Fake hosts on one machine (test-only host_of): 3 hosts of 2 in blocks, 2 hosts of 3
placed cyclically, and hosts of 4 and 2 interleaved (unequal); stages 0-3, overlap off
and on, two steps of two micro-steps each; the full parameters bit for bit the oracle's
with `hosts`, and (so the check can fail) not all of them the flat oracle's. Then the
16-bit sums (each host's partial crosses rounded to 16 bits): bf16 at every stage,
overlap off and on, in blocks, and fp16 (loss scaling) at stages 0 and 3 cyclic, bf16 at
stages 0 and 3 on the unequal hosts; not all of them the flat oracle's either."""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks

from zero_ref.comm.reduction import OrderedReduction
from zero_ref.comm.two_level import two_level_comm
from zero_ref.config import AdamWConfig, MixedPrecisionConfig, OverlapConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel

WORLD = MPI.COMM_WORLD
UNITS = [("u0", [("w", (37, 5))]), ("u1", [("w", (9,)), ("b", (4, 4))]), ("u2", [("w", (30,))])]
PLACEMENTS = {
    "3x2 blocks": lambda r: r // 2,
    "2x3 cyclic": lambda r: r % 2,
    "4+2 interleaved": [0, 1, 0, 0, 1, 0].__getitem__,
}
STAGES = range(4)
if "--real-hosts" in sys.argv:
    PLACEMENTS = {"real hosts": None}
if "--stages" in sys.argv:  # e.g. --stages 1,3: fewer cases for a larger job
    STAGES = [int(x) for x in sys.argv[sys.argv.index("--stages") + 1].split(",")]


def same(a: dict, b: dict) -> bool:
    return all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def run_case(stage: int, overlap: bool, host_of, precision: str = "fp32") -> tuple[bool, bool]:
    """(bitwise the two-level oracle at every step, bitwise the flat one at every step)."""
    cfg = ZeroConfig(stage=stage, bucket_numel=64, grad_accum=2, deterministic=True,
                     overlap=OverlapConfig(comm=overlap, collectives="hierarchical"),
                     mixed_precision=MixedPrecisionConfig(dtype=precision),
                     optimizer=AdamWConfig(lr=1e-2, weight_decay=0.1))  # fmt: skip
    comm = two_level_comm(WORLD, OrderedReduction(), host_of=host_of)
    model = ReplayModel(UNITS)
    ok, like_flat = against_oracles(cfg, comm, model, init_params(model, 3))
    comm.free()
    return ok, like_flat


def against_oracles(cfg: ZeroConfig, comm, model, init) -> tuple[bool, bool]:
    """Two steps of an engine on comm: (bitwise the oracle with comm's hosts at every
    step, bitwise the flat oracle at every step); shared with mpi_hier_groups_check.py."""
    engine = make_engine(model, init, cfg, comm)
    two_level = Oracle.for_config(init, cfg, model, hosts=comm.world_of)
    flat = Oracle.for_config(init, cfg, model)
    ok, like_flat = True, True
    for step in range(2):
        inputs = model.contexts(7, step, 2, comm.size)
        targets = np.zeros((2, comm.size))
        engine.train_step(inputs[:, comm.rank], targets[:, comm.rank])
        full = full_parameters(engine)
        two_level.model_step(model, inputs, targets)
        flat.model_step(model, inputs, targets)
        ok &= same(full, two_level.parameters())  # the master weights (16-bit too)
        like_flat &= same(full, flat.parameters())
    engine.close()
    return ok, like_flat


def checks() -> list[str]:
    fails: list[str] = []
    all_like_flat = True
    for name, host_of in PLACEMENTS.items():
        for stage in STAGES:
            for overlap in (False, True):
                ok, like_flat = run_case(stage, overlap, host_of)
                all_like_flat &= like_flat
                if not ok:
                    fails.append(f"{name} stage {stage} overlap {overlap}: not the oracle's")
    if all_like_flat:
        fails.append("every case also equals the flat oracle: the check cannot tell orders")
    fails += sixteen_bit_checks()
    return fails


def sixteen_bit_checks() -> list[str]:
    """bf16 in blocks at every stage, fp16 cyclic and bf16 on unequal hosts at stages 0
    and 3 (fake hosts only)."""
    if "--real-hosts" in sys.argv:
        return []
    fails, all_like_flat = [], True
    cases = [("bf16", "3x2 blocks", s, o) for s in STAGES for o in (False, True)]
    cases += [("fp16", "2x3 cyclic", s, True) for s in (0, 3) if s in STAGES]
    cases += [("bf16", "4+2 interleaved", s, True) for s in (0, 3) if s in STAGES]
    for precision, name, stage, overlap in cases:
        ok, like_flat = run_case(stage, overlap, PLACEMENTS[name], precision)
        all_like_flat &= like_flat
        if not ok:
            fails.append(f"{precision} {name} stage {stage} overlap {overlap}: not the oracle's")
    if cases and all_like_flat:
        fails.append("16-bit: every case also equals the flat oracle: the check cannot tell")
    return fails


if __name__ == "__main__":
    run_checks(WORLD, checks)
