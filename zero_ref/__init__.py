"""zero_ref: a NumPy + mpi4py reference implementation of ZeRO.

Importing the package first settles how many threads each rank may use
(`zero_ref.runtime.threads`), because BLAS reads that before NumPy loads: so the package
__init__ imports that one module (which imports nothing of the package) and
nothing else, and every module may import `__version__` from here.
"""

from zero_ref.runtime import threads as _threads

_threads.apply_default_thread_budget()

__version__ = "0.1.0"
