"""The node-aware (two-level) collectives, zero_ref/comm/hierarchical.py: the block
orders, the setting's checks, and one mpirun job over fake hosts (tests/mpi_hier_check.py)."""

from __future__ import annotations

import pytest

from tests.mpi_pool import run_mpi_checks
from zero_ref.comm.hier_order import gathered_order, placement, spans_hosts, two_level_bytes
from zero_ref.config import OverlapConfig, ZeroConfig, ZeroPPConfig


def test_placement_orders_hosts_by_lowest_rank_and_refuses_unequal_hosts():
    assert placement([0, 0, 1, 1]).tolist() == [[0, 1], [2, 3]]
    assert placement([7, 3, 7, 3]).tolist() == [[0, 2], [1, 3]]  # cyclic, labels arbitrary
    with pytest.raises(ValueError, match="between 1 and 3 ranks.*'flat'"):
        placement([0, 0, 0, 1])


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
    with pytest.raises(ValueError, match="collectives"):
        ZeroConfig(overlap=OverlapConfig(collectives="nccl"))
    with pytest.raises(ValueError, match="hierarchical.*hpz_partition_size"):
        ZeroConfig(
            stage=3,
            overlap=OverlapConfig(collectives="hierarchical"),
            zeropp=ZeroPPConfig(hpz_partition_size=2),
        )
    assert ZeroConfig().overlap.collectives == "auto"


def test_two_level_collectives_over_fake_hosts():
    """6 ranks as 3x2 in blocks, 2x3 cyclic, 6x1 and 1x6: gathers in world order,
    deterministic sums bitwise the two-level order, issued = blocking, ledger bytes."""
    run_mpi_checks("mpi_hier_check.py", 6)


def test_every_stage_matches_the_oracles_two_level_order():
    """6 ranks as 3x2 in blocks and 2x3 cyclic, stages 0-3, overlap off and on: the
    parameters bit for bit the oracle's with `hosts`, and not all the flat oracle's."""
    run_mpi_checks("mpi_hier_parity_check.py", 6)
