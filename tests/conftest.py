"""Shared fixtures: MPI worker pools, one per world size, started on first use and
closed when the test module that used them ends."""

from __future__ import annotations

import pytest

from tests.mpi_pool import MPIPool


@pytest.fixture(scope="module")
def mpi_pools():
    pools: dict[int, MPIPool] = {}

    def get(world: int) -> MPIPool:
        if world not in pools:
            pools[world] = MPIPool(world)
        return pools[world]

    yield get
    for pool in pools.values():
        pool.close()
