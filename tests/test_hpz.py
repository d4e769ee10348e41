"""ZeRO++'s hpZ (zero_hpz_partition_size): backward's all-gathers run in the partition
group from a secondary copy (zero_ref/engine/secondary_copy.py), the copy equals the
parameters after an update, its bytes are in the ledger and the estimate, and what hpZ
cannot do is refused by name. Parity with the oracle is tests/test_parity.py's (drawn
"hpz" and pinned examples)."""

from __future__ import annotations

import json
import re
import tempfile

import pytest
from mpi4py import MPI

from tests.mpi_pool import REPO, mpi_env, mpirun_command, run_watched
from tests.test_parity import MLP, QWZ, TINY_UNITS, check_bitwise, pinned, run
from zero_ref.app.cli import parse_args
from zero_ref.app.report import comm_table
from zero_ref.comm.choose import comm_for
from zero_ref.comm.groups import group_ranks
from zero_ref.config import OffloadConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.gathered_unit import gathers_by_kind
from zero_ref.engine.ladder import make_engine
from zero_ref.formulas.memory import prefetch_plan
from zero_ref.formulas.traffic import HierarchicalGathers
from zero_ref.layout.grad_blocks import GradientWire
from zero_ref.models.unit import init_params
from zero_ref.numerics.dtypes import ElementBytes
from zero_ref.testing.replay import ReplayModel


@pytest.mark.parametrize(
    ("size", "schedule", "precision"),
    [("2", "blocking", "bf16"), ("host", "overlap", "fp32"), ("2", "overlap", "fp16")],
)
def test_backward_gathers_run_in_the_group_and_the_copy_is_the_parameters(
    size, schedule, precision
):
    """4 ranks, two micro-steps: each unit is gathered across the world once per step
    (micro-step 0's forward, which fills the copy); every backward gather, and micro-step
    1's forwards, run in the group Comm under the ledger kind allgather_hpz. After an
    update and a forward the copy is each rank's group slice of the parameters, bit for
    bit; its bytes (2 Psi / G for 16-bit parameters) are in the ledger as estimated."""
    command = mpirun_command(4, str(REPO / "tests" / "mpi_hpz_check.py"), size, schedule, precision)
    done = run_watched(command, env=mpi_env())
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout.strip().splitlines()[-1])
    group = 2 if size == "2" else 4  # "host": one host holds all 4 ranks here
    for r in ranks:
        assert r["group_size"] == group
        assert "allgather_hpz" in r["kinds"]
        assert r["copy_equals_params"] is True
        steps = [c for c in r["calls"] if c[1] != "loss"]  # the last forward: no step label
        backward = [who for who, where in steps if "backward" in where]
        assert backward and set(backward) == {"group"}, steps
        world = [where for who, where in steps if who == "world"]
        assert world and all(w.startswith("micro-step 0 forward") for w in world), world
        held, estimate = r["memory"]
        assert held == {k: estimate[k] for k in held}
        itemsize = 4 if precision == "fp32" else 2
        assert r["secondary_bytes"] == itemsize * r["psi"] // group


def test_group_counts_of_the_blocking_schedule():
    """gathers_by_kind with hpz: one world gather per unit per step, then the group's
    (the last unit's forward serves its backward; unit 0's backward the next forward)."""
    plan = prefetch_plan([8, 8, 8], False, None, None, 0)
    full, quantized, group = gathers_by_kind(plan, [8, 8, 8], 2, False, hpz=True)
    assert (full, quantized) == ([1, 1, 1], [0, 0, 0])
    assert group == [2, 3, 1]  # backward u1 u0; forward u1 u2 again; backward u1 u0
    full, quantized, group = gathers_by_kind(plan, [8, 8, 8], 2, True, hpz=True)
    assert (full, quantized, group) == ([0, 0, 0], [1, 1, 1], [2, 3, 1])


def test_a_partition_size_that_does_not_divide_the_world_is_refused():
    with pytest.raises(ValueError, match="does not divide the world size 6.*1, 2, 3, 6"):
        group_ranks(6, 4)
    assert group_ranks(4, 2) == [range(0, 2), range(2, 4)]  # DeepSpeed's consecutive groups
    model = ReplayModel([("u0", [("w", (6,))])])
    cfg = ZeroConfig(stage=3, zeropp=ZeroPPConfig(hpz_partition_size=2))
    with pytest.raises(ValueError, match="hpz_partition_size 2 does not divide .* 1"):
        make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))


HPZ = ZeroPPConfig(hpz_partition_size=2)
ALL_ON_NVME = OffloadConfig(optimizer="nvme", param="nvme", nvme_path="/tmp")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ZeroConfig(stage=2, zeropp=HPZ), "1 below stage 3"),
        (lambda: ZeroConfig(stage=3, zeropp=HPZ, offload=ALL_ON_NVME), "offload_param 'nvme'"),
        (lambda: ZeroConfig(stage=3, zeropp=ZeroPPConfig(hpz_partition_size=0)), "an integer >= 1"),
        (lambda: ZeroConfig(stage=3, zeropp=ZeroPPConfig(hpz_partition_size="node")), "or 'host'"),
    ],
)
def test_config_refuses_what_hpz_cannot_do(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_deepspeed_key_and_flag_turn_hpz_on(tmp_path):
    """zero_optimization.zero_hpz_partition_size (deepspeed/runtime/zero/config.py, an
    int, 1 = off) feeds ZeroPPConfig.hpz_partition_size; --hpz-partition-size takes 'host'."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}))
    assert parse_args(["--config", str(path)], 4).zero.zeropp.hpz_partition_size == 2
    assert (
        parse_args(
            ["--stage", "3", "--hpz-partition-size", "host"], 4
        ).zero.zeropp.hpz_partition_size
        == "host"
    )
    assert parse_args(["--stage", "3"], 4).zero.zeropp.hpz_partition_size == 1
    with pytest.raises((ValueError, SystemExit)):
        parse_args(["--stage", "3", "--hpz-partition-size", "two"], 4)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"world": 4, "hpz": 2, "qwz": QWZ}, {"world": 2, "hpz": "host", "qwz": None}),
        ({"world": 2, "hpz": None}, {"world": 4, "hpz": 2}),
    ],
)
def test_checkpoint_of_an_hpz_run_resumes_and_reshards(mpi_pools, first, second):
    """The secondary copy is derived state: not saved, filled again by the resumed run's
    first forward, at another world size and group too; both runs bitwise the oracle
    (which replays the saved run with its hpZ+qwZ backward)."""
    drawn = pinned(MLP, stage=3, grad_accum=2, steps=2, **first)
    folder = tempfile.mkdtemp(prefix="zero_ref_hpz_ckpt_")
    saved = run(mpi_pools, {**drawn, "save_to": folder})
    phase = {"world": first["world"], "lrs": drawn["lrs"][:2], "qwz": first.get("qwz")}
    history = [phase | {"hpz": first["hpz"]}]
    resumed = run(mpi_pools, {**drawn, **second, "resume_from": folder, "history": history})
    for result in (saved, resumed):
        check_bitwise(result)
        assert result["optimizer_state_bitwise"]


@pytest.mark.parametrize(
    "qgz", [None, QWZ | {"bits": 4, "local": "world"}, QWZ | {"bits": 4, "local": 2}]
)
def test_the_reports_two_parts_are_what_the_ledger_counted_at_4_ranks(mpi_pools, qgz):
    """The run report's hpZ line ("X of the bytes [inside the groups]; Y across the
    world") against the ledger of a real 4-rank bf16 run, groups of 2, with qwZ, without
    and with qgZ (whose gradients are its int4 rows, in one hop or two, not a 16-bit
    reduce-scatter): X is allgather_hpz's bytes, Y every other kind's, and the two add
    up to the schedule's total."""
    bf16 = {"precision": "bf16"}
    drawn = pinned(TINY_UNITS, stage=3, world=4, hpz=2, qwz=QWZ, qgz=qgz, precision=bf16)
    result = run(mpi_pools, drawn)
    check_bitwise(result)
    g = result["gathers"]
    gathers = HierarchicalGathers(
        *(tuple(g[k]) for k in ("full", "quantized", "group")), g["block"], g["group_size"]
    )
    wire = result["grad_blocks"] and GradientWire(**result["grad_blocks"])
    step = result["ledger"][-1]
    table = comm_table(
        [{"rank": 0, "comm_last_step": step}],
        3,
        result["unit_padded_numels"],
        4,
        drawn["grad_accum"],
        ElementBytes(**result["element_bytes"]),
        gathers,
        wire or None,
    )
    found = re.search(r"([\d,]+) of the bytes; ([\d,]+) across the world.*: ([\d,]+) bytes", table)
    assert found, table
    inside, across, total = (int(x.replace(",", "")) for x in found.groups())
    zero = ("allgather", "reduce_scatter")  # not the loss, the norm, the test's consolidation
    sent = {kind: v["sent_bytes"] for kind, v in step.items() if kind.startswith(zero)}
    assert inside == sent["allgather_hpz"] > 0
    assert across == sum(v for kind, v in sent.items() if kind != "allgather_hpz"), (sent, table)
    assert total == inside + across
    assert any(kind.startswith("reduce_scatter_int4") for kind in sent) == (qgz is not None)
