"""The memory ledger: bytes each rank really holds, beside the paper's formulas.

The engine registers every array it keeps (`hold`) under a category:
params, grads, optimizer, buffers (bucket staging, unit scratch). The ledger
sums their `nbytes` when asked, so a stage that quietly keeps a full copy
shows it. Arrays that live only for a moment (stage 3's gathered units) go
through `hold`/`drop` and leave a high-water mark. Not counted: activations
(the model's, not ZeRO's), MPI's internal buffers, and the receive rows the
deterministic reduction allocates for the length of one call.

Formulas (Sec. 5.1-5.3 of the paper, per rank, Psi parameters, Nd ranks):
  mixed precision, K = 12:  stage 0: (2 + 2 + K) Psi      stage 1: (2 + 2 + K/Nd) Psi
                            stage 2: (2 + (2 + K)/Nd) Psi stage 3: (2 + 2 + K) Psi / Nd
  fp32 as trained here:     params 4 Psi, grads 4 Psi, optimizer (m, v) 8 Psi,
                            each divided by Nd once its stage shards it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from zero_ref.layout.buckets import bucket_columns

CATEGORIES = ("params", "grads", "optimizer", "buffers")


@dataclass
class MemoryLedger:
    """Live arrays by category, and the peak of their total."""

    held: dict[str, dict[str, np.ndarray]] = field(
        default_factory=lambda: {c: {} for c in CATEGORIES}
    )
    peak_bytes: int = 0
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    def hold(self, category: str, name: str, array: np.ndarray) -> np.ndarray:
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.held[category][name] = array
        self._update_peak()
        return array

    def drop(self, category: str, name: str) -> None:
        del self.held[category][name]

    def holds(self, category: str, name: str) -> bool:
        return name in self.held[category]

    def bytes_by_category(self) -> dict[str, int]:
        return {c: sum(int(a.nbytes) for a in arrays.values()) for c, arrays in self.held.items()}

    def total_bytes(self) -> int:
        return sum(self.bytes_by_category().values())

    def _update_peak(self) -> None:
        by_cat = self.bytes_by_category()
        self.peak_bytes = max(self.peak_bytes, sum(by_cat.values()))
        for c, b in by_cat.items():
            self.peak_by_category[c] = max(self.peak_by_category[c], b)


def fp32_formula_bytes(stage: int, numel: int, world_size: int, grad_accum: int) -> dict[str, int]:
    """Bytes of params, grads and optimizer state one rank holds in zero_ref's fp32 engine.

    numel is the padded Psi (a multiple of world_size). Beyond the paper's
    model: stage 0 with grad_accum > 1 keeps a second full gradient buffer (the
    accumulator), and stage 1 keeps its reduced gradient shard beside the full
    gradient buffer that backward writes into."""
    full, shard = 4 * numel, 4 * numel // world_size
    grads = {0: full * (2 if grad_accum > 1 else 1), 1: full + shard, 2: shard, 3: shard}[stage]
    return {
        "params": full if stage < 3 else shard,
        "grads": grads,
        "optimizer": 2 * full if stage == 0 else 2 * shard,
    }


def paper_formula_bytes(stage: int, numel: int, world_size: int, k: int = 12) -> float:
    """The paper's per-rank model-state bytes with mixed-precision Adam (K = 12)."""
    psi, nd = float(numel), float(world_size)
    return {
        0: (2 + 2 + k) * psi,
        1: (2 + 2 + k / nd) * psi,
        2: (2 + (2 + k) / nd) * psi,
        3: (2 + 2 + k) * psi / nd,
    }[stage]


def fp32_buffer_bytes(
    stage: int, unit_numels: Sequence[int], world_size: int, bucket_numel: int, grad_accum: int
) -> int:
    """Bytes of the `buffers` category: what a stage keeps besides the model states.

    unit_numels are the padded unit sizes. Stages 1-3 stage the widest bucket for all
    ranks (at most bucket_numel elements; zero_ref/layout/buckets.py) and, with grad_accum > 1,
    a landing row for micro-steps after the first; stages 2-3 add one unit's gradient
    scratch, stage 3 one gathered unit. Both are as wide as the widest unit."""
    if stage == 0:
        return 0
    shard_numel = sum(unit_numels) // world_size
    columns = min(bucket_columns(bucket_numel, world_size), shard_numel)
    staged = world_size * columns + (columns if grad_accum > 1 else 0)
    widest = max(unit_numels, default=0)
    per_unit = {1: 0, 2: 1, 3: 2}[stage]  # grad scratch (2-3), gathered unit (3)
    return 4 * (staged + per_unit * widest)
