"""Freed arrays go back to the OS, so that a rank's RAM is what the ledger says (ZeRO-Infinity).

With every model state on disk, what a rank still allocates per step is transient:
activations, the checkpointed inputs' recompute, bucket scratch. glibc's malloc serves a
large request with its own mmap and unmaps it when freed, but the first such free raises
its mmap threshold to that size (the "dynamic threshold", `mallopt(3)`), and from then on
requests below it come from the heap, where a freed block stays resident while anything
allocated later sits above it. That retention grows with the largest activation, which
grows with the model, and shows up as RSS the ledger never allocated: about 1.8 MB per
rank of the 9 MB a 4 -> 16 layer GPT added at d_model 768 (scripts/bench/bench_offload_slope.py,
85M parameters added: 0.106 bytes per added parameter per rank without this, 0.085 with it).

Setting M_MMAP_THRESHOLD explicitly, to glibc's own initial 128 KiB, turns the dynamic
raise off: every array of 128 KiB or more is mapped on its own and unmapped when freed.
Elsewhere than glibc (musl, macOS) there is no such knob and nothing is done.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
FIXED_MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, now kept


def return_freed_arrays_to_os() -> bool:
    """Fix glibc's mmap threshold at 128 KiB; True if the C library took it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: no mallopt, nothing to fix
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(M_MMAP_THRESHOLD, FIXED_MMAP_THRESHOLD_BYTES) == 1
