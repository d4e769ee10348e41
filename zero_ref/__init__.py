"""zero_ref: a NumPy + mpi4py reference implementation of ZeRO.

Importing the package first settles how many threads each rank may use
(see `zero_ref.app.threads`), because BLAS reads that before NumPy loads.
"""

from zero_ref.app import threads as _threads

_threads.apply_default_thread_budget()

__version__ = "0.1.0"
