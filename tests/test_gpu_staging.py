"""Collectives on device arrays through host buffers, and which MPI path a run takes."""

from __future__ import annotations

import pytest

from tests.mpi_pool import run_mpi_checks
from zero_ref.gpu.mpi_support import CudaAwareMPIError, choose_path, library_says_cuda_aware

pytestmark = pytest.mark.gpu


def test_staged_collectives_are_bitwise_the_host_ones_under_mpirun():
    """tests/mpi_staging_check.py on 3 ranks: allreduce, reduce-scatter, allgather (also
    in place) of float32 and bf16 device arrays, rank-order and MPI sums: bitwise the
    host Comm's, the same network bytes, and the host<->device copies counted apart."""
    run_mpi_checks("mpi_staging_check.py", 3)  # the simulator in CI, the GPU in gpu_check.sh


def test_the_cuda_aware_path_is_bitwise_the_cpu_run_with_no_copies_under_mpirun():
    """tests/mpi_direct_check.py on 3 ranks: device arrays (as strict as CuPy's) handed
    to MPI directly, as a CUDA-aware MPI takes them: every stage, fp32, bf16 and fp16
    (its CASES), bitwise the CPU engine, the same network bytes, no host<->device copy."""
    run_mpi_checks("mpi_direct_check.py", 3, NUMBA_ENABLE_CUDASIM="1")  # on a GPU too


def test_the_pypi_mpich_says_it_is_not_cuda_aware():
    from mpi4py import MPI  # noqa: F401  (loads the library the query looks in)

    assert library_says_cuda_aware() in (False, None)


@pytest.mark.parametrize(
    ("requested", "library", "aware"),
    [
        ("auto", True, True),
        ("auto", False, False),
        ("auto", None, False),
        ("no", True, False),
        ("yes", True, True),
        ("yes", None, True),  # the user knows better than a library that cannot say
    ],
)
def test_the_path_follows_the_request_and_the_library(requested, library, aware):
    path = choose_path(requested, library)
    assert path.cuda_aware is aware
    assert path.describe().startswith("MPI: ")


def test_forcing_cuda_aware_on_a_library_that_says_no_is_a_clear_error():
    with pytest.raises(CudaAwareMPIError, match="says it is not CUDA-aware"):
        choose_path("yes", False)
    with pytest.raises(ValueError, match="allowed are auto, yes, no"):
        choose_path("maybe", None)
