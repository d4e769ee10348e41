"""zero_ref.numerics.cuda_math's np.row_stack shim: numba-cuda (0.22.2 to 0.30.4 at least) registers
an overload of np.row_stack at the CUDA target's first compile with no NumPy version
guard, and NumPy 2.5 removed row_stack, so without the shim every kernel fails to compile
there ("module 'numpy' has no attribute 'row_stack'"). Not gpu-marked: plain CPU checks."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np

from tests.mpi_pool import REPO
from zero_ref.numerics.cuda_math import provide_row_stack


def numpy_like(**names) -> types.ModuleType:
    module = types.ModuleType("numpy_like")
    module.vstack = np.vstack
    for name, value in names.items():
        setattr(module, name, value)
    return module


def test_a_numpy_without_row_stack_gets_vstacks_twin():
    module = numpy_like()
    assert provide_row_stack(module) is True
    a, b = np.arange(3), np.arange(3, 6)
    assert np.array_equal(module.row_stack((a, b)), np.vstack((a, b)))
    stacked = module.row_stack((a, b), dtype=np.float32, casting="unsafe")
    assert stacked.dtype == np.float32 and stacked.shape == (2, 3)
    assert module.row_stack is not np.vstack  # its own function: vstack's overloads untouched
    assert provide_row_stack(module) is False  # now it has one


def test_a_numpy_that_has_row_stack_is_left_as_it_is():
    own = object()
    module = numpy_like(row_stack=own)
    assert provide_row_stack(module) is False and module.row_stack is own


SPY = """
import numpy
if hasattr(numpy, "row_stack"):
    del numpy.row_stack  # NumPy 2.5, as numba-cuda meets it
import zero_ref.optim.adamw_cuda  # a kernel module, as a user would import it: no compile yet
print(hasattr(numpy, "row_stack"))
"""


def test_importing_a_kernel_gives_numpy_row_stack_before_anything_compiles():
    done = subprocess.run(
        [sys.executable, "-c", SPY], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "True", done.stdout


def test_every_module_with_a_cuda_kernel_imports_the_shim():
    """A kernel compiles only after its module is imported; each such module imports
    zero_ref.numerics.cuda_math at its top, so the shim has run by then."""
    kernels = [
        path
        for path in (REPO / "zero_ref").rglob("*.py")
        if "@cuda.jit" in path.read_text() and path.name != "cuda_math.py"
    ]
    assert len(kernels) >= 5, kernels
    for path in kernels:
        assert "from zero_ref.numerics.cuda_math import" in path.read_text() or (
            "from zero_ref.numerics import cuda_math" in path.read_text()
        ), path
