"""Collective signatures (check_schedule): before each collective, ranks agree on what it is.

MPI matches collectives by order alone. If one rank skips a unit's gather, or
gathers a different size, the ranks silently pair up the wrong calls: a hang,
a truncation error, or quietly wrong data. ZeRO stage 3, with two gathers per
unit per micro-step, is where real implementations hang most often.

With checking on, every rank describes the collective it is about to enter as a
fixed-size *signature* (operation, element count, dtype, where in the step, step
number); the ranks all-gather the signatures and compare them. A mismatch raises
ScheduleMismatchError on every rank at the same point, naming both sides. This
module is pure NumPy: zero_ref.comm.collectives does the one MPI call.
"""

from __future__ import annotations

import zlib

import numpy as np

from zero_ref.runtime.errors import CollectiveError

TEXT_BYTES = 104  # "op | dtype | where", UTF-8, cut to fit (the checksum covers all of it)
HEADER = 3  # int64: count, step, crc32 of the full text
SIGNATURE_BYTES = HEADER * 8 + TEXT_BYTES
VARIABLE = -1  # count of a collective whose size legitimately differs per rank
NO_STEP = -1


class ScheduleMismatchError(CollectiveError):
    """Ranks were about to enter different collectives (raised on every rank)."""


def signature(op: str, count: int, dtype: str, where: str, step: int | None) -> np.ndarray:
    """(SIGNATURE_BYTES,) uint8: what this rank is about to do, in a fixed size."""
    text = f"{op}|{dtype}|{where}".encode()
    header = np.array(
        [count, NO_STEP if step is None else step, zlib.crc32(text)], np.int64
    )  # (3,)
    out = np.zeros(SIGNATURE_BYTES, np.uint8)
    out[: HEADER * 8] = header.view(np.uint8)
    cut = text[:TEXT_BYTES]
    out[HEADER * 8 : HEADER * 8 + len(cut)] = np.frombuffer(cut, np.uint8)
    return out


def describe(sig: np.ndarray) -> str:
    """A signature in words: 'allgather of 52 float32 for "forward hidden" at step 3'."""
    count, step, _ = (int(v) for v in sig[: HEADER * 8].view(np.int64))
    text = bytes(sig[HEADER * 8 :]).rstrip(b"\0").decode(errors="replace")
    op, dtype, where = (text.split("|", 2) + ["", ""])[:3]
    size = "a variable number of" if count == VARIABLE else f"{count}"
    at = "before the first step" if step == NO_STEP else f"at step {step}"
    return f'{op} of {size} {dtype} for "{where or "-"}" {at}'


def check_agreement(signatures: np.ndarray) -> None:
    """signatures (W, SIGNATURE_BYTES), row r from rank r: raise unless all rows agree.

    Every rank holds the same rows, so every rank raises the same error."""
    differs = np.any(signatures != signatures[0], axis=1)  # (W,)
    if not differs.any():
        return
    first = int(np.argmax(differs))
    agree = [r for r in range(len(signatures)) if not differs[r]]
    others = [r for r in range(len(signatures)) if differs[r]]
    raise ScheduleMismatchError(
        "collective schedule mismatch: "
        f"rank 0 is entering {describe(signatures[0])}, "
        f"but rank {first} is entering {describe(signatures[first])} "
        f"(same as rank 0: {_ranks(agree)}; different: {_ranks(others)})"
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
