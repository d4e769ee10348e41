"""Hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed's MiCS mics_shard_size): ZeRO inside
shard groups of G ranks, the groups replicas, the gradient shard all-reduced across them
(zero_ref/engine/hybrid.py). The cross-group all-reduce's pieces and bytes, the oracle's
two-level sum, what is refused by name, and a `zero_ref.train` run: its first line, the
oracle check, the bytes its schedule says, the estimate equal to the ledger. Parity with
the oracle is tests/test_parity.py's (drawn "hybrid" and pinned examples), and so is a
hybrid checkpoint resuming and resharding bitwise (there, to share its pools of ranks)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi4py import MPI

from tests.test_train import TINY_GPT_MODEL, train
from zero_ref.app.cli import parse_args
from zero_ref.app.rank_estimate import estimate_for, model_for
from zero_ref.comm.choose import comm_for
from zero_ref.comm.groups import HYBRID_KIND
from zero_ref.config import AdamWConfig, HybridConfig, OffloadConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.hybrid import replica_pieces, replica_sent_bytes
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.replay import ReplayModel


def test_pieces_cover_the_view_in_multiples_of_the_replicas():
    """Chunks of a bucket, then the rest cut to a multiple of R, then the < R tail: every
    element once, in order; bytes priced as a ring all-reduce of the view padded to R."""
    assert replica_pieces(15, 2, 4) == [(0, 4), (4, 8), (8, 12), (12, 14), (14, 15)]
    assert replica_pieces(7, 3, 6) == [(0, 6), (6, 7)]
    assert replica_pieces(2, 3, 3) == [(0, 2)]
    assert replica_pieces(0, 2, 4) == []
    for numel, r, chunk in [(0, 1, 1), (1, 2, 2), (13, 4, 8), (64, 3, 9)]:
        pieces = replica_pieces(numel, r, chunk)
        ends = [b for _, b in pieces]
        assert [a for a, _ in pieces] == ([0, *ends[:-1]] if pieces else [])
        assert (pieces[-1][1] if pieces else 0) == numel
        assert all(b - a <= chunk and ((b - a) % r == 0 or b == numel) for a, b in pieces)
    assert replica_sent_bytes([15], 2, 4) == 2 * 1 * 8 * 4  # ceil(15/2) = 8 elements a rank
    assert replica_sent_bytes([4, 5], 4, 2) == 2 * 3 * (1 + 2) * 2
    assert replica_sent_bytes([15], 1, 4) == 0  # one group: nothing crosses


def test_the_oracle_sums_each_group_then_the_groups():
    """shard_size G: g = ((s_00 + s_10) + (s_01 + s_11)) / (W k) for 4 ranks in groups of
    2, 2 micro-steps (s_jg: micro-step j's sum over group g's ranks, in rank order), and
    not the one rank order's (((r0 + r1) + r2) + r3) sums, which differ in the last bits."""
    rng = np.random.default_rng(3)
    init = {"w": np.zeros(4096, np.float32)}
    grads = [[{"w": rng.standard_normal(4096).astype(np.float32)} for _ in range(4)]
             for _ in range(2)]  # fmt: skip
    rows = [[g["w"] for g in micro] for micro in grads]
    group = [[(m[0] + m[1]), (m[2] + m[3])] for m in rows]  # per micro-step, per group
    acc = (group[0][0] + group[1][0]) + (group[0][1] + group[1][1])
    flat = ((((rows[0][0] + rows[0][1]) + rows[0][2]) + rows[0][3])
            + (((rows[1][0] + rows[1][1]) + rows[1][2]) + rows[1][3]))  # fmt: skip
    for size, expected in [(2, acc), (None, flat)]:
        oracle = Oracle(init, AdamWConfig(), shard_size=size)
        oracle.step(grads)
        want = np.divide(expected, np.float32(8), dtype=np.float32)
        assert np.array_equal(oracle.last_detail.grad.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(acc, flat)  # the two orders differ: the test tells them apart


HYBRID = HybridConfig(shard_size=2)
NVME = OffloadConfig(optimizer="nvme", nvme_path="/tmp")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ZeroConfig(stage=0, hybrid=HYBRID), "None at stage 0"),
        (lambda: ZeroConfig(stage=3, hybrid=HybridConfig(shard_size=0)),
         "an integer >= 1 dividing the world size, or 'host'"),
        (lambda: ZeroConfig(stage=3, hybrid=HybridConfig(shard_size="node")), "or 'host'"),
        (lambda: ZeroConfig(stage=3, hybrid=HYBRID, zeropp=ZeroPPConfig(hpz_partition_size=2)),
         "with hpz_partition_size != 1"),
        (lambda: ZeroConfig(stage=3, hybrid=HYBRID, offload=NVME), "with NVMe offload"),
        (lambda: ZeroConfig(stage=3, hybrid=HYBRID, device="gpu"), "with device 'gpu'"),
    ],
)  # fmt: skip
def test_config_refuses_what_hybrid_sharding_cannot_do(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_shard_size_that_does_not_divide_the_world_is_refused():
    model = ReplayModel([("u0", [("w", (6,))])])
    cfg = ZeroConfig(stage=3, hybrid=HybridConfig(shard_size=2))
    with pytest.raises(ValueError, match="hybrid_shard_size 2 does not divide the world size 1"):
        make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))


def test_deepspeed_key_and_flag_turn_hybrid_sharding_on(tmp_path):
    """zero_optimization.mics_shard_size (deepspeed/runtime/zero/config.py: an int, -1 =
    off) feeds HybridConfig.shard_size; --hybrid-shard-size takes 'host' too."""
    path = tmp_path / "ds.json"
    for value, expected in [(2, 2), (-1, None)]:
        path.write_text(json.dumps({"zero_optimization": {"stage": 3, "mics_shard_size": value}}))
        assert parse_args(["--config", str(path)], 4).zero.hybrid.shard_size == expected
    flags = ["--stage", "2", "--hybrid-shard-size"]
    assert parse_args([*flags, "host"], 4).zero.hybrid.shard_size == "host"
    assert parse_args(["--stage", "3"], 4).zero.hybrid.shard_size is None
    for bad in (["--config", str(path)], [*flags, "two"]):
        if bad[0] == "--config":
            path.write_text(json.dumps({"zero_optimization": {"mics_shard_size": 0}}))
        with pytest.raises((ValueError, SystemExit), match="-1 .off. or an integer|'two'"):
            parse_args(bad, 4)


def test_mics_hierarchical_gather_maps_to_the_two_level_collectives(tmp_path):
    """zero_optimization.mics_hierarchical_params_gather (deepspeed/runtime/zero/config.py,
    a bool): true is collectives 'hierarchical', false asks for nothing (auto stays), a
    flag given overrides the file, and a value that is not a bool is refused by name."""
    path = tmp_path / "ds.json"

    def parsed(value, *flags):
        zero = {"stage": 3, "mics_shard_size": 2, "mics_hierarchical_params_gather": value}
        path.write_text(json.dumps({"zero_optimization": zero}))
        return parse_args(["--config", str(path), *flags], 4)

    for value, meant in [(True, "hierarchical"), (False, "auto")]:
        args = parsed(value)
        assert args.zero.overlap.collectives == meant
        assert not [n for n in args.notes if "mics_hierarchical_params_gather" in n]
    assert parsed(True, "--collectives", "flat").zero.overlap.collectives == "flat"
    with pytest.raises((ValueError, SystemExit), match="mics_hierarchical_params_gather"):
        parsed("yes")


def test_a_hybrid_training_run_says_so_and_is_counted(tmp_path):
    """4 ranks in 2 groups of 2: the first line names the groups, every step is bitwise
    the oracle's, the final record's expected bytes are the ledger's (a group's schedule
    plus the cross-group all-reduce), and the estimate equals each rank's ledger."""
    text = tmp_path / "text.txt"
    text.write_text("It is a truth universally acknowledged, that a single man. " * 20)
    log = tmp_path / "run.jsonl"
    flags = [*TINY_GPT_MODEL, "--batch-size", "8", "--data", str(text), "--stage", "3"]
    flags += ["--precision", "bf16", "--grad-accum", "2", "--hybrid-shard-size", "2"]
    checks = ["--steps", "2", "--deterministic", "--check-oracle", "--log-jsonl", str(log)]
    done = train(4, *flags, *checks)
    assert done.returncode == 0, done.stderr
    assert "4 ranks (hybrid sharding: 2 groups of 2, replicated)" in done.stdout.splitlines()[0]
    assert "bitwise equal to the single-rank oracle" in done.stdout
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["shard_world_size"] == 2 and final["world_size"] == 4
    kinds = ("reduce_scatter", "allgather", HYBRID_KIND)
    for rank in final["ranks"]:
        step = rank["comm_last_step"]
        assert step[HYBRID_KIND]["sent_bytes"] > 0
        assert sum(step[k]["sent_bytes"] for k in kinds) == final["expected_sent_bytes"]
    parsed = parse_args(flags, 4)
    est = estimate_for(parsed, model_for(parsed, 4), 4)
    for rank in final["ranks"]:
        assert rank["memory_bytes"] == {k: getattr(est, k) for k in rank["memory_bytes"]}
