"""zero_ref.comm.collectives.Comm: every collective, both reduction policies, the ledger and
the buffer checks, on COMM_SELF and on a private copy of COMM_WORLD (these
pass at any world size), then the same on three real ranks under mpirun."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi_pool import run_mpi_checks
from zero_ref.comm.choose import comm_for
from zero_ref.comm.collectives import Comm, MPIReduction, OrderedReduction
from zero_ref.comm.ledger import CommLedger
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

BLOCKS = [0, 1, 7, 13]
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(params=[False, True], ids=["mpi_sum", "rank_order"])
def comm(request, mpi_comm) -> Comm:
    return Comm(mpi_comm, OrderedReduction() if request.param else MPIReduction())


def send_rows(world: int, numel: int) -> np.ndarray:
    """rows[r]: rank r's send buffer, known to every rank."""
    rng = np.random.default_rng([world, numel])
    return (rng.standard_normal((world, numel)) * 10.0 ** rng.uniform(-3, 3, numel)).astype(
        np.float32
    )


def rank_order_sum(rows: np.ndarray) -> np.ndarray:
    acc = rows[0].copy()
    for r in range(1, rows.shape[0]):
        acc = (acc + rows[r]).astype(np.float32)
    return acc


def check_sum(comm: Comm, got: np.ndarray, rows: np.ndarray) -> None:
    """Bitwise the rank-order sum when deterministic, within rounding otherwise."""
    if isinstance(comm.reduction, OrderedReduction):
        np.testing.assert_array_equal(got.view(np.uint32), rank_order_sum(rows).view(np.uint32))
    else:
        exact = rows.astype(np.float64).sum(axis=0)
        bound = comm.size * EPS32 * np.abs(rows.astype(np.float64)).sum(axis=0)
        assert np.all(np.abs(got - exact) <= bound)


def kind_totals(comm: Comm, kind: str) -> tuple[int, int, int]:
    t = comm.ledger.current[kind]
    return t.calls, t.sent_bytes, t.recv_bytes


# ---- sums


@pytest.mark.parametrize("n", BLOCKS)
def test_reduce_scatter_sum(comm, n):
    w, rank = comm.size, comm.rank
    rows = send_rows(w, w * n)
    recv = np.full(n, np.nan, np.float32)
    comm.reduce_scatter_sum(rows[rank].copy(), recv)
    check_sum(comm, recv, rows[:, rank * n : (rank + 1) * n])
    block_bytes = (w - 1) * n * 4
    assert kind_totals(comm, "reduce_scatter") == (1, block_bytes, block_bytes)


@pytest.mark.parametrize("n", BLOCKS)
def test_allreduce_sum(comm, n):
    w, rank = comm.size, comm.rank
    rows = send_rows(w, w * n)
    buf = rows[rank].copy()
    comm.allreduce_sum(buf)
    check_sum(comm, buf, rows)
    block_bytes = (w - 1) * n * 4
    assert kind_totals(comm, "allreduce") == (1, 2 * block_bytes, 2 * block_bytes)


# ---- gathers


def rank_blocks(world: int, n: int) -> list[np.ndarray]:
    return [(np.arange(n) * 0.5 + 1000 * r).astype(np.float32) for r in range(world)]


@pytest.mark.parametrize("n", BLOCKS)
def test_allgather(comm, n):
    w, rank = comm.size, comm.rank
    blocks = rank_blocks(w, n)
    recv = np.full(w * n, np.nan, np.float32)
    comm.allgather(blocks[rank], recv)
    np.testing.assert_array_equal(recv, np.concatenate(blocks))
    block_bytes = (w - 1) * n * 4
    assert kind_totals(comm, "allgather") == (1, block_bytes, block_bytes)


def test_allgather_kind_names_the_ledger_entry(comm):
    w = comm.size
    recv = np.empty(w * 3, np.float32)
    comm.allgather(np.ones(3, np.float32), recv, kind="consolidate")
    assert kind_totals(comm, "consolidate") == (1, (w - 1) * 12, (w - 1) * 12)
    assert "allgather" not in comm.ledger.current


@pytest.mark.parametrize("n", BLOCKS)
def test_allgather_in_place(comm, n):
    w, rank = comm.size, comm.rank
    blocks = rank_blocks(w, n)
    buf = np.full(w * n, np.nan, np.float32)
    buf[rank * n : (rank + 1) * n] = blocks[rank]
    comm.allgather_in_place(buf)
    np.testing.assert_array_equal(buf, np.concatenate(blocks))
    block_bytes = (w - 1) * n * 4
    assert kind_totals(comm, "allgather") == (1, block_bytes, block_bytes)


@pytest.mark.parametrize("n", [0, 1, 255 * 2])
def test_allreduce_int64_is_an_exact_sum(comm, n):
    w, rank = comm.size, comm.rank
    out = comm.allreduce_int64(np.full(n, (1 << 50) + rank, np.int64), kind="norm")
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.full(n, sum((1 << 50) + r for r in range(w))))
    sent = 2 * (w - 1) * n * 8 // w
    assert kind_totals(comm, "norm") == (1, sent, sent)


def test_allreduce_float64(comm):
    w, rank = comm.size, comm.rank
    total = comm.allreduce_float64(rank + 0.25, kind="loss")
    assert total == sum(r + 0.25 for r in range(w))
    assert kind_totals(comm, "loss") == (1, 2 * (w - 1) * 8, 2 * (w - 1) * 8)


# ---- the ledger


def test_end_step_moves_totals_to_history(comm):
    w, n = comm.size, 5
    buf = np.zeros(w * n, np.float32)
    comm.allreduce_sum(buf)
    comm.allreduce_sum(buf)
    comm.allgather_in_place(buf)
    comm.allreduce_float64(1.0, kind="loss")
    totals = comm.ledger.end_step()
    assert list(totals) == ["allgather", "allreduce", "loss"]
    assert totals["allreduce"]["calls"] == 2
    assert totals["allreduce"]["sent_bytes"] == 2 * 2 * (w - 1) * n * 4
    assert totals["allgather"]["calls"] == 1
    assert all(v["seconds"] >= 0 for v in totals.values())
    assert comm.ledger.history == [totals] and comm.ledger.last_step() == totals
    assert not comm.ledger.current
    expected_sent = (2 * 2 + 1) * (w - 1) * n * 4 + 2 * (w - 1) * 8
    assert CommLedger.step_sent_bytes(totals) == expected_sent
    second = comm.ledger.end_step()  # an empty step still counts
    assert second == {} and comm.ledger.history == [totals, {}]


def test_ledger_by_hand():
    ledger = CommLedger()
    assert ledger.last_step() == {}
    ledger.record("reduce_scatter", 12, 8, 0.5)
    ledger.record("reduce_scatter", 4, 4, 0.25)
    ledger.record("allgather", 3, 3, 0.0)
    step = ledger.end_step()
    assert step == {
        "allgather": {"calls": 1, "sent_bytes": 3, "recv_bytes": 3, "seconds": 0.0},
        "reduce_scatter": {"calls": 2, "sent_bytes": 16, "recv_bytes": 12, "seconds": 0.75},
    }
    assert CommLedger.step_sent_bytes(step) == 19


# ---- bad buffers


def bad_calls(comm: Comm):
    w = comm.size
    f32, f64 = np.zeros(w * 4, np.float32), np.zeros(w * 4, np.float64)
    strided = np.zeros(w * 8, np.float32)[::2]
    return {
        "allreduce float64": lambda: comm.allreduce_sum(f64),
        "allreduce strided": lambda: comm.allreduce_sum(strided),
        "reduce_scatter send float64": lambda: comm.reduce_scatter_sum(
            f64, np.zeros(4, np.float32)
        ),
        "reduce_scatter short recv": lambda: comm.reduce_scatter_sum(f32, np.zeros(3, np.float32)),
        "reduce_scatter long recv": lambda: comm.reduce_scatter_sum(f32, np.zeros(5, np.float32)),
        "allgather recv float64": lambda: comm.allgather(np.zeros(4, np.float32), f64),
        "allgather short recv": lambda: comm.allgather(np.zeros(5, np.float32), f32),
        "allgather_in_place float64": lambda: comm.allgather_in_place(f64),
        "allgather_in_place strided": lambda: comm.allgather_in_place(strided),
    }


BAD = list(bad_calls(Comm(MPI.COMM_SELF)))


@pytest.mark.parametrize("case", BAD)
def test_bad_buffers_raise(comm, case):
    with pytest.raises(ValueError):
        bad_calls(comm)[case]()
    assert not comm.ledger.current  # nothing was recorded


def float64_block_calls(comm: Comm) -> dict:
    """The smaller buffer of each call (the block) given as float64."""
    w = comm.size
    full = np.zeros(w * 4, np.float32)
    return {
        "allgather": lambda: comm.allgather(np.zeros(4), full),
        "reduce_scatter": lambda: comm.reduce_scatter_sum(full, np.zeros(4)),
    }


def test_float64_recv_block_raises_with_mpi_sum():
    calls = float64_block_calls(Comm(MPI.COMM_SELF, MPIReduction()))
    for case in ("reduce_scatter",):
        with pytest.raises(ValueError):  # mpi4py: mismatch in send and receive datatypes
            calls[case]()


def test_float64_recv_block_raises_with_rank_order_sum():
    calls = float64_block_calls(Comm(MPI.COMM_SELF, OrderedReduction()))
    for case in ("reduce_scatter",):
        with pytest.raises(ValueError):
            calls[case]()


def test_float64_send_block_of_allgather_raises():
    calls = float64_block_calls(Comm(MPI.COMM_SELF))
    for case in ("allgather",):
        with pytest.raises(ValueError):
            calls[case]()


# ---- three real ranks


def test_three_ranks_under_mpirun():
    """tests/mpi_comm_check.py: rank-order sums with cancelling values (1e8, 1, -1e8),
    MPI_SUM within rounding, gathers, float64 exchanges and ledger bytes."""
    run_mpi_checks("mpi_comm_check.py", 3, timeout=120)


# ---- one determinism switch: the config's


@pytest.mark.parametrize("deterministic", [False, True])
def test_comm_for_follows_the_config(deterministic):
    cfg = ZeroConfig(deterministic=deterministic, check_schedule=True)
    comm = comm_for(MPI.COMM_SELF, cfg)
    assert comm.reduction.deterministic is deterministic and comm.check_schedule


@pytest.mark.parametrize("deterministic", [False, True])
def test_an_engine_refuses_a_comm_that_disagrees_with_its_config(deterministic):
    model = ReplayModel([("u", [("w", (3,))])])
    cfg = ZeroConfig(stage=1, deterministic=deterministic)
    wrong = Comm(MPI.COMM_SELF, MPIReduction() if deterministic else OrderedReduction())
    with pytest.raises(ValueError, match="comm_for"):
        make_engine(model, init_params(model, 0), cfg, wrong)
