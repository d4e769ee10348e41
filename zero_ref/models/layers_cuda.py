"""The model's one scatter on a CUDA device, deterministic: the embedding's backward.

Every other layer runs on the device as its NumPy twin in CuPy (zero_ref/numerics/array_module.py):
elementwise operations and cuBLAS GEMMs, which give the same bits for the same
inputs run after run. The embedding's backward is a scatter-add into the rows of
the table, and the twin's `add.at` is, in CuPy, one atomicAdd per element: with
repeated token ids (every batch of characters has them) the additions into a row
land in whatever order the threads arrive, so two runs, or the engine and the
oracle's replay of the same step, may differ in the last bits.

`embedding_backward` gives each column of the table one thread, which adds the rows
in order, i = 0, 1, ...: per table element the same additions in the same order
as the CPU's Numba kernel (zero_ref/models/layers.py `_embedding_backward_kernel`,
twin `embedding_backward_reference`), so bitwise equal to it, on any GPU, every run.
N rows each way per thread: fine for a batch's N = B * T rows (thousands), where
the table's C columns give the parallelism.
"""

from __future__ import annotations

from numba import cuda

from zero_ref.numerics.cuda_math import THREADS, add, blocks


@cuda.jit
def _embedding_backward_columns(ids, rows, dtable):  # pragma: no cover - compiled
    c = cuda.grid(1)
    if c < rows.shape[1]:
        for i in range(rows.shape[0]):  # rows in order: the CPU kernel's additions
            dtable[ids[i], c] = add(dtable[ids[i], c], rows[i, c])


def embedding_backward(ids, rows, dtable) -> None:
    """dtable (V, C) <- the sum of rows (N, C) into the rows ids (N,) name, in order;
    all three device arrays (dtable overwritten)."""
    dtable[...] = 0
    if rows.shape[0] and rows.shape[1]:
        _embedding_backward_columns[blocks(rows.shape[1]), THREADS](ids, rows, dtable)
