"""The node-aware (two-level) collectives, zero_ref/comm/hierarchical.py: the block
orders, the groups' common placement, the setting's checks and how it resolves, and
mpirun jobs over fake hosts (tests/mpi_hier_check.py, mpi_hier_parity_check.py,
mpi_hier_groups_check.py)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi_pool import run_mpi_checks
from zero_ref.app.cli import UsageError, parse_args
from zero_ref.comm import choose
from zero_ref.comm.hier_order import (
    common_placement,
    gathered_order,
    hosts_of,
    owner_table,
    placement,
    spans_hosts,
    split_placement,
    two_level_bytes,
    two_level_sum,
)
from zero_ref.config import HybridConfig, OverlapConfig, ZeroConfig, ZeroPPConfig


def test_placement_orders_hosts_by_lowest_rank_and_refuses_unequal_hosts():
    assert placement([0, 0, 1, 1]).tolist() == [[0, 1], [2, 3]]
    assert placement([7, 3, 7, 3]).tolist() == [[0, 2], [1, 3]]  # cyclic, labels arbitrary
    with pytest.raises(ValueError, match="between 1 and 3 ranks.*two_level_comm"):
        placement([0, 0, 0, 1])
    assert hosts_of([0, 0, 0, 1]) == [[0, 1, 2], [3]]
    assert hosts_of([5, 2, 5, 5]) == [[0, 2, 3], [1]]  # hosts by lowest rank, any labels


def test_gathered_order_maps_the_hosts_gather_to_world_order():
    world_of = placement([0, 0, 1, 1, 2, 2])  # 3 hosts of 2
    assert gathered_order(world_of).tolist() == [0, 2, 4, 1, 3, 5]  # block l H + h
    assert spans_hosts(world_of) and not spans_hosts(placement([0, 1, 2]))
    assert not spans_hosts(placement([0, 0, 0]))


def test_each_host_receives_the_other_hosts_data_once():
    """2 hosts x 2 ranks, blocks of b bytes: 1 block crosses per rank (flat: 2 in blocks)."""
    within, across = two_level_bytes(100, placement([0, 0, 1, 1]))
    assert (within, across) == (200, 100)


def test_the_setting_is_checked():
    """Every value, the default, and a bad one refused with the allowed list, in the
    config and on the command line; hpZ and hybrid groups are accepted with it now."""
    with pytest.raises(ValueError, match="'auto', 'flat', 'hierarchical'"):
        ZeroConfig(overlap=OverlapConfig(collectives="nccl"))
    with pytest.raises((UsageError, SystemExit)):
        parse_args(["--collectives", "nccl"], 4)
    for value in ("auto", "flat", "hierarchical"):
        assert parse_args(["--collectives", value], 4).zero.overlap.collectives == value
    assert ZeroConfig().overlap.collectives == "auto"
    ZeroConfig(stage=3, overlap=OverlapConfig(collectives="hierarchical"),
               zeropp=ZeroPPConfig(hpz_partition_size=2, quantized_weights=True,
                                   quantized_gradients=True))  # fmt: skip
    ZeroConfig(stage=3, overlap=OverlapConfig(collectives="hierarchical"),
               hybrid=HybridConfig(shard_size=2))  # fmt: skip


@pytest.mark.parametrize(("value", "two_level"), [("flat", False), ("auto", False),
                                                  ("hierarchical", True)])  # fmt: skip
def test_the_setting_resolves_on_one_host(value, two_level):
    """One process, one host: flat and auto stay one-level (auto changes nothing on one
    host), hierarchical is taken as asked, with or without groups."""
    for zeropp in (ZeroPPConfig(), ZeroPPConfig(hpz_partition_size=2)):
        cfg = ZeroConfig(stage=3, overlap=OverlapConfig(collectives=value), zeropp=zeropp)
        assert choose.use_hierarchical(MPI.COMM_SELF, cfg) is two_level


def test_groups_share_one_two_level_order_or_go_flat():
    """hier_order.common_placement: a split's groups go two-level together, with one
    placement (the oracle's), only where it spans hosts; differing groups say why."""
    two_by_two = hosts_of([0, 0, 1, 1])
    assert common_placement([two_by_two, hosts_of([7, 7, 3, 3])]) == (two_by_two, "")
    assert common_placement([hosts_of([0, 0]), hosts_of([1, 1])]) == (None, "")  # one host
    assert common_placement([hosts_of([0, 1]), hosts_of([1, 0])]) == (None, "")  # 1 a host
    three_one = hosts_of([0, 0, 1, 0])
    assert common_placement([three_one, three_one]) == (three_one, "")  # unequal hosts too
    cyclic = hosts_of([0, 1, 0, 1])
    assert "placed differently" in common_placement([two_by_two, cyclic])[1]
    world_of = placement([r // 2 for r in range(8)])  # 4 hosts of 2, in blocks
    shards = [range(0, 4), range(4, 8)]
    assert split_placement(world_of, shards) == [[0, 1], [2, 3]]
    assert split_placement(world_of, [range(i, 8, 4) for i in range(4)]) is None  # 1 a host
    uneven = hosts_of([0, 0, 1, 0, 1, 1, 0, 1])
    assert split_placement(uneven, shards) == [[0, 1, 3], [2]]
    assert split_placement(hosts_of([0, 0, 1, 1, 0, 1, 0, 1]), shards) is None  # unlike


def test_owners_hand_each_host_the_others_data_once():
    """owner_table: with equal hosts the rank at the destination's index (HierarchicalComm's
    cross level); with unequal ones a destination's own rank on its host, else the rank at
    its index modulo the host's count: each destination one owner a host, so a host
    takes every other host's blocks once, and the sums keep two_level_sum's order."""
    equal = owner_table(hosts_of([0, 0, 1, 1]))
    assert equal.tolist() == [[0, 1, 0, 1], [2, 3, 2, 3]]
    hosts = hosts_of([0, 1, 0, 0, 1, 0])  # hosts of 4 (ranks 0, 2, 3, 5) and 2 (1, 4)
    owners = owner_table(hosts)
    assert owners.tolist() == [[0, 0, 2, 3, 2, 5], [1, 1, 4, 1, 4, 4]]
    for h, ranks in enumerate(hosts):
        assert set(owners[h]) <= set(ranks)  # a host's owners are its own ranks
        assert all(owners[h, d] == d for d in ranks)
    rows = np.arange(6 * 3, dtype=np.float32).reshape(6, 3) * np.float32(0.1)
    want = (rows[0] + rows[2] + rows[3] + rows[5]) + (rows[1] + rows[4])
    assert np.array_equal(two_level_sum(rows, hosts, np.empty(3, np.float32)), want)


class _FakeTwoLevel:
    """What choose._device_buffers_go_flat reads of a HierarchicalComm."""

    def __init__(self, strict: bool) -> None:
        self.strict, self.rank, self.freed = strict, 0, False

    def free(self) -> None:
        self.freed = True


def test_a_cuda_aware_path_is_flat_and_says_so(capsys):
    """Device buffers handed to a CUDA-aware MPI take the flat collectives: refused when
    'hierarchical' was asked for, said once (and the levels freed) for 'auto'."""
    with pytest.raises(ValueError, match="CUDA-aware MPI.*--cuda-aware-mpi no"):
        choose._device_buffers_go_flat(_FakeTwoLevel(strict=True))
    auto = _FakeTwoLevel(strict=False)
    choose._device_buffers_go_flat(auto)
    assert auto.freed and "collectives auto" in capsys.readouterr().out


def test_two_level_collectives_over_fake_hosts():
    """6 ranks as 3x2 in blocks, 2x3 cyclic, 6x1 and 1x6: gathers in world order,
    deterministic sums bitwise the two-level order, issued = blocking, ledger bytes."""
    run_mpi_checks("mpi_hier_check.py", 6)


def test_every_stage_matches_the_oracles_two_level_order():
    """6 ranks as 3x2 in blocks and 2x3 cyclic, stages 0-3, overlap off and on, then
    bf16 and fp16 (16-bit sums, partials rounded as they cross): the parameters bit for
    bit the oracle's with `hosts`, and not all the flat oracle's."""
    run_mpi_checks("mpi_hier_parity_check.py", 6)


def test_hpz_and_hybrid_groups_go_two_level_where_they_span_hosts():
    """8 ranks on fake hosts: hybrid shard groups spanning hosts, replica groups with 2
    ranks a host, hpZ groups with qwZ, groups of 3 + 1 ranks a host: bitwise the oracle's
    two-level order, the ledger's hops, and groups placed unlike refused ('hierarchical')
    or flat ('auto')."""
    run_mpi_checks("mpi_hier_groups_check.py", 8)


def test_the_least_bytes_a_host_moves_per_collective():
    """scripts/bench/hier_bytes.py's yardstick, at both ends of the host sizes: an
    all-gather takes the other host's blocks and sends its own once; a reduce-scatter
    takes a partial per destination it holds and sends one per destination there."""
    from scripts.bench.hier_bytes import least_bytes

    assert least_bytes("allgather", 2, 2, 10) == (20, 20)
    assert least_bytes("allgather", 2, 1, 10) == (10, 20)
    assert least_bytes("reduce_scatter", 2, 1, 10) == (20, 10)
    assert least_bytes("reduce_scatter", 1, 1, 10) == (10, 10)
