"""The memory ledger: bytes each rank really holds, beside the paper's formulas.

The engine registers every array it keeps (`hold`) under a category:
params, grads, optimizer, buffers (bucket staging, unit scratch). The ledger
sums their `nbytes` when asked, so a stage that quietly keeps a full copy
shows it. Arrays that live only for a moment (stage 3's gathered units) go
through `hold`/`drop` and leave a high-water mark. Not counted: activations
(the model's, not ZeRO's), MPI's internal buffers, and the receive rows the
deterministic reduction allocates for the length of one call.

What the ledger should hold, the formulas of Sec. 5.1-5.3, are integer math in
zero_ref/formulas/memory.py (shared with the estimate and the report);
they are imported here under the names the engine has always used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zero_ref.formulas.memory import (  # noqa: F401 (the engine's names for them)
    CATEGORIES,
    FP32,
    STRIP_BYTES,
    buffer_formula_bytes,
    formula_bytes,
    grad_strip_bytes,
    grad_strip_numel,
    grads_on_disk,
    offload_pool_numel,
    offload_pool_row_numel,
    offload_pool_rows,
    paper_formula_bytes,
    swap_file_bytes,
)


@dataclass
class MemoryLedger:
    """Live arrays by category, and the peak of their total."""

    held: dict[str, dict[str, np.ndarray]] = field(
        default_factory=lambda: {c: {} for c in CATEGORIES}
    )
    peak_bytes: int = 0
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    on_disk: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # swap files
    on_device: dict[str, dict[str, object]] = field(default_factory=dict)  # --device gpu

    def hold(self, category: str, name: str, array: np.ndarray) -> np.ndarray:
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.held[category][name] = array
        self._update_peak()
        return array

    def hold_on_disk(self, category: str, name: str, array: np.ndarray) -> np.ndarray:
        """An array that lives in a swap file (offload): counted apart from RAM."""
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.on_disk.setdefault(category, {})[name] = array
        return array

    def hold_on_device(self, category: str, name: str, array) -> object:
        """An array in GPU memory (--device gpu): counted apart from RAM."""
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.on_device.setdefault(category, {})[name] = array
        return array

    def device_bytes_by_category(self) -> dict[str, int]:
        return {
            c: sum(int(a.nbytes) for a in self.on_device.get(c, {}).values()) for c in CATEGORIES
        }

    def disk_bytes_by_category(self) -> dict[str, int]:
        return {c: sum(int(a.nbytes) for a in self.on_disk.get(c, {}).values()) for c in CATEGORIES}

    def drop(self, category: str, name: str) -> None:
        del self.held[category][name]

    def holds(self, category: str, name: str) -> bool:
        return name in self.held[category]

    def bytes_by_category(self) -> dict[str, int]:
        return {c: sum(int(a.nbytes) for a in arrays.values()) for c, arrays in self.held.items()}

    def total_bytes(self) -> int:
        return sum(self.bytes_by_category().values())

    def bytes_by_name(self, category: str) -> dict[str, int]:
        """Each array of `category` held in RAM now, by its name."""
        return {name: int(a.nbytes) for name, a in self.held[category].items()}

    def report(self) -> dict:
        """What this ledger holds now and held at its peak, as plain data (the report's)."""
        return {
            "memory_bytes": self.bytes_by_category(),
            "disk_bytes": self.disk_bytes_by_category(),
            "device_bytes": self.device_bytes_by_category(),
            "peak_bytes": self.peak_bytes,
            "peak_by_category": dict(self.peak_by_category),
        }

    def _update_peak(self) -> None:
        by_cat = self.bytes_by_category()
        self.peak_bytes = max(self.peak_bytes, sum(by_cat.values()))
        for c, b in by_cat.items():
            self.peak_by_category[c] = max(self.peak_by_category[c], b)
