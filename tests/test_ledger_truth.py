"""What the engine says it holds is what the process holds: the memory ledger against
tracemalloc on 4 ranks at every stage (tests/mpi_ledger_check.py), and the
`buffers` category against its own formula, which bucket_numel caps."""

from __future__ import annotations

from tests.mpi_pool import REPO, mpirun_command, run_watched
from zero_ref.engine.memory import buffer_formula_bytes


def test_ledger_matches_tracemalloc_on_four_ranks():
    job = run_watched(mpirun_command(4, str(REPO / "tests" / "mpi_ledger_check.py")))
    assert job.returncode == 0 and "all checks passed on 4 ranks" in job.stdout, (
        job.stdout + job.stderr[-3000:]
    )


def test_buffers_do_not_grow_with_the_model_only_with_its_widest_unit():
    """Twice the layers, same width: the same buffers. bucket_numel caps the staging."""
    units = [1000, 4000, 4000, 1000]
    same_width = buffer_formula_bytes(3, units * 2, 4, 256, 1)
    assert buffer_formula_bytes(3, units, 4, 256, 1) == same_width
    assert buffer_formula_bytes(2, units, 4, 256, 1) == 4 * (256 + 4000)
    assert buffer_formula_bytes(3, units, 4, 256, 2) == 4 * (256 + 64 + 2 * 4000)
    assert buffer_formula_bytes(0, units, 4, 256, 2) == 0
