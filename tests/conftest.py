"""Shared fixtures: MPI worker pools, one per world size, started on first use and
closed when the test module that used them ends."""

from __future__ import annotations

import os

# The GPU path's kernels run in numba-cuda's simulator unless a GPU run asks otherwise
# (scripts/tools/gpu_check.sh sets NUMBA_ENABLE_CUDASIM=0): set before numba is imported.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402
from mpi4py import MPI  # noqa: E402

from tests.mpi_pool import MPIPool  # noqa: E402

# In CI (CI=true) hypothesis draws the same examples on every run, so a red build
# always means a change broke something; locally it explores new examples each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


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


@pytest.fixture(params=["self", "world_dup"])
def mpi_comm(request):
    """COMM_SELF, and a private copy of COMM_WORLD (one rank under plain pytest)."""
    if request.param == "self":
        yield MPI.COMM_SELF
        return
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> str:
    """A text file of tests/tiny_gpt.py's TEXT repeated, for --data."""
    from tests.tiny_gpt import TEXT

    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(TEXT * 20)
    return str(path)
