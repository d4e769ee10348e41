"""qgZ in two hops (DeepSpeed's all_to_all_quant_reduce across nodes): the oracle's sum
written out by hand for one aligned unit (and at 6 ranks in groups of 3 and of 2, where
the order of the adds shows), the one-hop cases (a group of one rank or of
all of them, "world"), the bytes of each hop, and the config's and flags' values and
refusals, and one run of 8 ranks with hybrid sharding, its shard groups of 4 summed in
two hops of 2. The engine's two hops are checked bit for bit against the oracle in
tests/test_parity.py (pinned examples at 4 ranks in groups of 2, and at 6 in groups of 3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.test_train import TINY_GPT_MODEL, train
from zero_ref.app.cli import parse_args
from zero_ref.comm.groups import group_ranks
from zero_ref.comm.reduction import first_hop_order, hop_bytes
from zero_ref.config import AdamWConfig, ZeroConfig, ZeroPPConfig
from zero_ref.numerics.quantize import quantized_rows
from zero_ref.oracle.single_rank import GradientBlocks, Oracle

WORLD, BLOCK, NUMEL = 4, 4, 32  # one unit of 32 elements: 8 a rank, two blocks a row
UNITS = (("u", (("w", (NUMEL,)),)),)


def oracle_grad(grads: np.ndarray, local: int | None, bits: int) -> np.ndarray:
    """The mean gradient (W, NUMEL) -> what the oracle gave AdamW, in hops of `local`."""
    blocks = GradientBlocks(UNITS, 1, 1 << 20, BLOCK, bits, local)
    oracle = Oracle({"u.w": np.zeros(NUMEL, np.float32)}, AdamWConfig(), gradient_blocks=blocks)
    oracle.step([[{"u.w": g} for g in grads]])
    return oracle.last_detail.grad


def through_wire(rows: np.ndarray, bits: int) -> np.ndarray:
    """One aligned unit: each destination's row is BLOCK-aligned, so the wire quantizes
    the flat vector in blocks of BLOCK."""
    starts = np.arange(0, NUMEL, BLOCK, dtype=np.int64)
    return quantized_rows(rows, starts, bits)


@pytest.mark.parametrize("bits", [8, 4])
def test_two_hops_sum_each_groups_quantized_rows_then_requantize_the_partials(bits):
    grads = np.random.default_rng(bits).standard_normal((WORLD, NUMEL)).astype(np.float32)
    q = through_wire(grads, bits)
    partials = np.stack([q[0] + q[1], q[2] + q[3]])  # float32, in rank order
    requantized = through_wire(partials, bits)
    expected = (requantized[0] + requantized[1]) / np.float32(WORLD)
    assert np.array_equal(oracle_grad(grads, 2, bits), expected)
    one_hop = (((q[0] + q[1]) + q[2]) + q[3]) / np.float32(WORLD)
    assert np.array_equal(oracle_grad(grads, None, bits), one_hop)
    assert not np.array_equal(expected, one_hop)  # the second quantization is seen


def left_to_right(rows: np.ndarray) -> np.ndarray:
    """The rows added one after another from the first, in float32: ((a + b) + c) + ..."""
    total = rows[0].copy()
    for row in rows[1:]:
        total += row
    return total


@pytest.mark.parametrize("world, local", [(4, 2), (6, 3), (6, 2)])  # groups of 2 and of 3
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [1, BLOCK])
def test_two_hops_add_in_local_rank_order_then_in_group_order(world, local, bits, block):
    """W = 6 in groups of 3 (and 3 groups of 2), written out by hand in float32: each
    group's dequantized rows a + b + c left to right in local rank order, the partials
    requantized, added left to right in group order, over W. With blocks of one element
    (each value its own scale) the requantized partial keeps a sum's last bit, and each
    rank's values have their own magnitude, so another order of the same rows gives
    other bits (checked), as a + b = b + a alone (groups of 2, two groups) cannot show;
    with wider blocks a partial's last bit is mostly lost to the second quantization."""
    numel = world * 8  # 8 a rank: two blocks of BLOCK, aligned
    units = (("u", (("w", (numel,)),)),)
    rng = np.random.default_rng([world, local, bits])
    grads = rng.standard_normal((world, numel)) * 10.0 ** rng.uniform(-3, 3, (world, 1))
    grads = grads.astype(np.float32)
    starts = np.arange(0, numel, block, dtype=np.int64)
    q = quantized_rows(grads, starts, bits)
    groups = [q[h : h + local] for h in range(0, world, local)]

    def two_hops(in_group, across) -> np.ndarray:
        partials = np.stack([left_to_right(in_group(g)) for g in groups])
        return left_to_right(across(quantized_rows(partials, starts, bits))) / np.float32(world)

    expected = two_hops(lambda g: g, lambda p: p)
    blocks = GradientBlocks(units, 1, 1 << 20, block, bits, local)
    oracle = Oracle({"u.w": np.zeros(numel, np.float32)}, AdamWConfig(), gradient_blocks=blocks)
    oracle.step([[{"u.w": g} for g in grads]])
    assert np.array_equal(oracle.last_detail.grad, expected)
    if block > 1:
        return
    other_orders = []  # each differs from the rank order by more than a + b = b + a
    if local > 2:  # inside a group: (c + b) + a, and (a + c) + b
        other_orders.append(two_hops(lambda g: g[::-1], lambda p: p))
        other_orders.append(two_hops(lambda g: g[[0, *range(2, local), 1]], lambda p: p))
    if len(groups) > 2:  # across the groups
        other_orders.append(two_hops(lambda g: g, lambda p: p[::-1]))
    for other in other_orders:
        assert not np.array_equal(other, expected), "the data cannot tell the orders apart"


@pytest.mark.parametrize("local", [1, WORLD])
def test_a_group_of_one_rank_or_of_all_is_one_hop(local):
    grads = np.random.default_rng(local).standard_normal((WORLD, NUMEL)).astype(np.float32)
    assert np.array_equal(oracle_grad(grads, local, 4), oracle_grad(grads, None, 4))


def test_the_oracle_refuses_a_local_size_that_does_not_divide():
    grads = np.ones((WORLD, NUMEL), np.float32)
    with pytest.raises(ValueError, match="local size 3 does not divide the 4 ranks"):
        oracle_grad(grads, 3, 8)


def test_first_hop_order_sends_each_local_rank_its_place_in_every_group():
    # 3 groups of 2: local rank 0 gets world ranks 0, 2, 4; local rank 1 gets 1, 3, 5
    assert first_hop_order(3, 2).tolist() == [0, 2, 4, 1, 3, 5]


@pytest.mark.parametrize("groups, local", [(2, 2), (2, 4), (4, 2), (3, 5)])
def test_the_two_hops_send_the_one_hops_rows_fewer_of_them_across(groups, local):
    class Hops:  # the sizes hop_bytes reads
        pass

    hops = Hops()
    hops.local, hops.cross = Hops(), Hops()
    hops.local.size, hops.cross.size = local, groups
    within, across = hop_bytes(10, hops)
    world = groups * local
    assert within + across == (world - 1) * 10  # the one hop's W-1 rows
    assert across == (groups - 1) * 10  # one hop sends (W - L) rows across
    assert across <= (world - local) * 10


def test_config_and_flags_take_the_local_size():
    zero = parse_args(["--quantized-gradients"], 1).zero
    assert zero.zeropp.quantized_gradient_local_size == "host"
    for value, parsed in (("world", "world"), ("2", 2), ("host", "host")):
        argv = ["--quantized-gradients", "--quantized-gradient-local-size", value]
        assert parse_args(argv, 1).zero.zeropp.quantized_gradient_local_size == parsed
    with pytest.raises(ValueError, match="quantized_gradient_local_size=2.*without quantized"):
        ZeroConfig(stage=2, zeropp=ZeroPPConfig(quantized_gradient_local_size=2))
    with pytest.raises(ValueError, match="quantized_gradient_local_size=0 is not allowed"):
        ZeroConfig(
            stage=2, zeropp=ZeroPPConfig(quantized_gradients=True, quantized_gradient_local_size=0)
        )
    with pytest.raises(ValueError, match="--quantized-gradient-local-size 'node'"):
        parse_args(["--quantized-gradients", "--quantized-gradient-local-size", "node"], 1)


def test_a_local_size_that_does_not_divide_the_ranks_names_the_allowed_ones():
    with pytest.raises(
        ValueError, match="quantized_gradient_local_size 3 does not divide.*1, 2, 4"
    ):
        group_ranks(4, 3, "quantized_gradient_local_size", ", 'host' or 'world'")
    from mpi4py import MPI

    from zero_ref.comm.collectives import Comm
    from zero_ref.comm.groups import qgz_hops

    with pytest.raises(ValueError, match=r"qgZ sums over 1: .* \(1\), 'host' or 'world'"):
        qgz_hops(Comm(MPI.COMM_SELF), 3)  # the engine's path: what the error names


def test_hybrid_sharding_groups_sum_in_two_hops_bitwise_the_oracle(tmp_path):
    """8 ranks, hybrid shard groups of 4, qgZ inside each group in two hops of 2: every
    step bitwise the oracle's, the two hops in the ledger, their bytes the one hop's."""
    text = tmp_path / "text.txt"
    text.write_text("It is a truth universally acknowledged, that a single man. " * 20)
    log = tmp_path / "run.jsonl"
    flags = [*TINY_GPT_MODEL, "--batch-size", "8", "--data", str(text), "--stage", "2"]
    flags += ["--hybrid-shard-size", "4", "--quantized-gradients", "--quantized-gradient-bits"]
    flags += ["4", "--quantized-gradient-local-size", "2", "--quantize-block", "16"]
    checks = ["--steps", "2", "--deterministic", "--check-oracle", "--log-jsonl", str(log)]
    done = train(8, *flags, *checks)
    assert done.returncode == 0, done.stderr
    assert "bitwise equal to the single-rank oracle" in done.stdout
    final = json.loads(log.read_text().splitlines()[-1])
    kinds = ("reduce_scatter_int4_local", "reduce_scatter_int4_cross", "allgather")
    for rank in final["ranks"]:
        step = rank["comm_last_step"]
        assert step["reduce_scatter_int4_cross"]["sent_bytes"] > 0
        sent = sum(step[k]["sent_bytes"] for k in kinds) + step["allreduce_hybrid"]["sent_bytes"]
        assert sent == final["expected_sent_bytes"]


class FakeRequest:
    """A request whose first call completes when told (Test), and a log of the calls."""

    def __init__(self, name: str, log: list, done: bool = False) -> None:
        self.name, self.log, self.done = name, log, done

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        return self.done

    def Wait(self) -> None:  # noqa: N802
        self.log.append(f"wait {self.name}")


class FakeComm:
    """What a ChainedFlight and Comm.advance read of a Comm."""

    def __init__(self) -> None:
        from zero_ref.comm.ledger import CommLedger
        from zero_ref.comm.progress import NoProgress

        self.progress, self.ledger, self.in_flight = NoProgress(), CommLedger(), []


def test_advance_issues_second_calls_oldest_first_and_stops_at_one_not_in():
    """Every rank must issue the second hops in bucket order: a bucket's second call waits
    for every older bucket's, even when its own first call is in."""
    from zero_ref.comm.in_flight import ChainedFlight
    from zero_ref.comm.nonblocking import NonBlockingCollectives

    comm, log = FakeComm(), []

    def chained(name: str, done: bool) -> ChainedFlight:
        def second():
            log.append(f"issue {name}")
            return FakeRequest(f"{name}2", log, True)

        return ChainedFlight(comm, "k", FakeRequest(name, log, done), second, lambda: None)

    a, b, c = chained("a", True), chained("b", False), chained("c", True)
    NonBlockingCollectives.advance(comm)
    assert log == ["issue a"]  # c's first is in, but b's is not: c waits its turn
    b.request.done = True
    NonBlockingCollectives.advance(comm)
    assert log == ["issue a", "issue b", "issue c"]
    NonBlockingCollectives.advance(comm)  # nothing left to issue: nothing twice
    assert log.count("issue c") == 1
    for flight in (a, b, c):
        flight.wait()
    assert log[3:] == ["wait a2", "wait b2", "wait c2"] and comm.in_flight == []


def test_a_wait_before_any_boundary_issues_the_second_call_itself():
    from zero_ref.comm.in_flight import ChainedFlight

    comm, log = FakeComm(), []
    second = lambda: log.append("issue") or FakeRequest("2", log, True)  # noqa: E731
    flight = ChainedFlight(comm, "k", FakeRequest("1", log), second, lambda: log.append("sum"))
    flight.wait()
    assert log == ["wait 1", "issue", "wait 2", "sum"]
