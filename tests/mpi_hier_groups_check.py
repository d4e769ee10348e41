"""hpZ's and hybrid sharding's groups on the two-level collectives (issue 33): run by
tests/test_hierarchical.py as `mpirun -n 8 python tests/mpi_hier_groups_check.py`.

Fake hosts on one machine (test-only host_of, which the groups inherit from the world's
Comm). Each case: the full parameters bit for bit the oracle's with `hosts` at every
step, the ledger showing which groups went two-level (their hops' "_cross" kinds), and,
where the two-level sums change the order, not all of them the flat oracle's:

- hybrid shard groups of 4 on 4 hosts of 2 (a shard group spans 2 hosts: its sums and
  gathers in two levels), stage 3 blocking and stage 1 overlapped;
- hybrid shard groups of 2 on 2 hosts of 4 (each group inside a host; the replica
  groups, 2 ranks a host, all-reduce in two levels), stage 2, in fp32 and in bf16
  overlapped (the replicas' 16-bit partials cross rounded);
- hpZ groups of 4 with qwZ on 4 hosts of 2, stage 3 overlapped (the secondary copy's
  gathers and qwZ's int8 gathers in two levels; gathers only move bytes);
- shard groups of 4 on hosts holding 3 and 1 of a group's ranks (each group alike): two
  levels over hosts of unequal sizes;
- shard groups placed differently on the hosts (one 2 + 2 in blocks, the other
  interleaved): refused on every rank with collectives 'hierarchical', flat groups (and a
  two-level world) with 'auto'.
"""

from __future__ import annotations

from mpi4py import MPI
from mpi_checks import run_checks
from mpi_hier_parity_check import against_oracles

from zero_ref.comm.reduction import OrderedReduction
from zero_ref.comm.two_level import two_level_comm
from zero_ref.config import (
    AdamWConfig,
    HybridConfig,
    MixedPrecisionConfig,
    OverlapConfig,
    ZeroConfig,
    ZeroPPConfig,
)
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

WORLD = MPI.COMM_WORLD
UNITS = [("u0", [("w", (37, 5))]), ("u1", [("w", (9,)), ("b", (4, 4))]), ("u2", [("w", (30,))])]
FOUR_BY_TWO = lambda r: r // 2  # noqa: E731
TWO_BY_FOUR = lambda r: r // 4  # noqa: E731
UNEVEN = [0, 0, 1, 0, 1, 1, 0, 1].__getitem__  # 2 hosts of 4; ranks 0-3: 3 on one host
UNLIKE = [0, 0, 1, 1, 0, 1, 0, 1].__getitem__  # ranks 0-3 two a host in blocks, 4-7 not


def config(stage: int, overlap: bool, collectives: str = "hierarchical", **groups) -> ZeroConfig:
    return ZeroConfig(stage=stage, bucket_numel=64, grad_accum=2, deterministic=True,
                      overlap=OverlapConfig(comm=overlap, collectives=collectives),
                      optimizer=AdamWConfig(lr=1e-2, weight_decay=0.1), **groups)  # fmt: skip


def run_case(cfg: ZeroConfig, host_of) -> tuple[bool, bool, set[str]]:
    """(bitwise the two-level oracle at every step, bitwise the flat one at every step,
    the ledger's kinds of the last step)."""
    model = ReplayModel(UNITS)
    strict = cfg.overlap.collectives == "hierarchical"
    comm = two_level_comm(WORLD, OrderedReduction(), host_of=host_of, strict=strict)
    ok, like_flat = against_oracles(cfg, comm, model, init_params(model, 3))
    kinds = set(comm.ledger.last_step())
    comm.free()
    return ok, like_flat, kinds


CASES = [  # name, config, fake hosts, kinds the ledger must show, sums differ from flat
    ("hybrid 4 on 4x2, stage 3", config(3, False, hybrid=HybridConfig(shard_size=4)),
     FOUR_BY_TWO, {"reduce_scatter_cross", "allgather_cross"}, True),
    ("hybrid 4 on 4x2, stage 1 overlapped", config(1, True, hybrid=HybridConfig(shard_size=4)),
     FOUR_BY_TWO, {"reduce_scatter_cross", "allgather_cross"}, True),
    ("hybrid 2 on 2x4, stage 2", config(2, False, hybrid=HybridConfig(shard_size=2)),
     TWO_BY_FOUR, {"allreduce_hybrid", "reduce_scatter"}, True),
    ("hybrid 2 on 2x4, stage 2, bf16",
     config(2, True, hybrid=HybridConfig(shard_size=2),
            mixed_precision=MixedPrecisionConfig(dtype="bf16")),
     TWO_BY_FOUR, {"allreduce_hybrid", "reduce_scatter"}, True),
    ("hpZ 4 + qwZ on 4x2, stage 3 overlapped",
     config(3, True, zeropp=ZeroPPConfig(hpz_partition_size=4, quantized_weights=True)),
     FOUR_BY_TWO, {"allgather_hpz_cross", "allgather_int8_cross", "reduce_scatter_cross"},
     True),
    ("groups of 3 + 1 a host, stage 3", config(3, True, hybrid=HybridConfig(shard_size=4)),
     UNEVEN, {"reduce_scatter_cross", "allgather_cross"}, True),
    ("groups placed unlike, auto: flat groups",
     config(3, False, "auto", hybrid=HybridConfig(shard_size=4)),
     UNLIKE, {"reduce_scatter", "allgather"}, False),
]  # fmt: skip


def refused_on_every_rank() -> str | None:
    """Shard groups placed unlike on the hosts, collectives 'hierarchical'."""
    cfg = config(3, False, hybrid=HybridConfig(shard_size=4))
    model = ReplayModel(UNITS)
    comm = two_level_comm(WORLD, OrderedReduction(), host_of=UNLIKE)
    try:
        make_engine(model, init_params(model, 3), cfg, comm)
    except ValueError as e:
        said = str(e)
    else:
        said = ""
    comm.free()
    if "placed differently" not in said or "collectives 'auto'" not in said:
        return f"groups placed unlike, hierarchical: not refused as it should be ({said!r})"
    return None


def checks() -> list[str]:
    fails: list[str] = []
    for name, cfg, host_of, kinds, differs in CASES:
        ok, like_flat, seen = run_case(cfg, host_of)
        if not ok:
            fails.append(f"{name}: not the two-level oracle's")
        if not kinds <= seen:
            fails.append(f"{name}: the ledger lacks {sorted(kinds - seen)} ({sorted(seen)})")
        if differs and like_flat:
            fails.append(f"{name}: also the flat oracle's (the check cannot tell orders)")
    fails += [f for f in [refused_on_every_rank()] if f]
    return fails


if __name__ == "__main__":
    run_checks(WORLD, checks)
