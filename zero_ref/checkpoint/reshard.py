"""Resharding: where elements [lo, hi) of a unit live in the files of the ranks
that saved it. Pure integer math, no I/O.

A unit of `numel` real elements is padded to a multiple of the world size W
and cut into W equal slices; rank r's file holds slice r at `shard_offset` of
its tensors (zero_ref/layout/flat.py). A unit's real elements are the same at
every world size; only the padding and the cut points move. So a new rank
that needs elements [lo, hi) of a unit (its slice under the new world size, or
the whole unit at stages 0-2) reads, from each old rank whose slice overlaps
[lo, min(hi, numel)), exactly the overlap, and fills what lies in the new
padding with zeros (padding is zero in parameters and in AdamW's m and v:
its gradient is always zero).

    numel 10, old W = 4 (slices of 3, 2 padding), new W = 3 (slices of 4, 2 padding)

    element     0 1 2 | 3 4 5 | 6 7 8 | 9 . .        old rank files 0..3
    new rank 1 needs [4, 8):  old rank 1 [1, 3) of its slice, old rank 2 [0, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_ref.layout.flat import UnitLayout


@dataclass(frozen=True)
class Piece:
    """Elements [out_start, out_start + numel) of a requested range come from
    rank `rank`'s file, elements [file_start, file_start + numel) of its tensors."""

    rank: int
    file_start: int
    numel: int
    out_start: int


def pieces(saved: UnitLayout, lo: int, hi: int) -> list[Piece]:
    """The pieces of elements [lo, hi) of a unit as `saved` (the layout of the
    checkpoint) cut it; elements at or past saved.numel are padding: no piece."""
    if not 0 <= lo <= hi:
        raise ValueError(
            f"range [{lo}, {hi}) of unit {saved.name} is not allowed: need 0 <= lo <= hi"
        )
    found, at, end = [], lo, min(hi, saved.numel)
    width = saved.shard_numel
    while at < end:
        rank = at // width
        stop = min(end, (rank + 1) * width)
        found.append(Piece(rank, saved.shard_offset + at - rank * width, stop - at, at - lo))
        at = stop
    return found
