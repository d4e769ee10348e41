"""Flat layout: named tensors laid into one contiguous float32 buffer, then sharded.

Pure integer math, no MPI. Each *unit* (layer) of the model becomes one
contiguous range of the full buffer, padded with zeros to a multiple of the
world size, so that every rank owns an equal slice of every unit (as FSDP's
flat parameters and DeepSpeed stage 3's partitions do, shard boundaries cut
straight through tensors). With an `align` of a block size (ZeRO++'s qwZ, zero_ref/
numerics/quantize.py) each unit is padded to a multiple of world_size * align instead, so every
rank's slice is a whole number of blocks and block b is the unit's elements
[b*align, (b+1)*align) at every world size. Equal slices let the engine use Reduce_scatter_block
and Allgather instead of their uneven v-variants; scripts/bench/bench_layout.py
measures why (docs/architecture.md quotes it).

A rank's *shard buffer* is its slice of unit 0, then its slice of unit 1, ...
so its optimizer state and reduced gradients are contiguous too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

Shape = tuple[int, ...]


class Owned(NamedTuple):
    """1-D views of what one rank updates (its P_os slice, Sec. 5.1): the parameter,
    its reduced gradient, the float32 master (the parameter itself in fp32) and AdamW's
    two moments. A NamedTuple, so a reader sees `owned.grad`, not `owned[1]`."""

    param: np.ndarray
    grad: np.ndarray
    master: np.ndarray
    exp_avg: np.ndarray
    exp_avg_sq: np.ndarray


@dataclass(frozen=True)
class ShardInfo:
    """Where one rank's equal slice of a padded range lies: [offset, offset + numel)."""

    offset: int
    numel: int


def padded_numel(numel: int, world_size: int) -> int:
    """numel rounded up to a multiple of world_size (0 stays 0)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is not allowed: it must be >= 1")
    if numel < 0:
        raise ValueError(f"numel={numel} is not allowed: it must be >= 0")
    return -(-numel // world_size) * world_size


def shard_range(numel: int, rank: int, world_size: int) -> ShardInfo:
    """The slice of a range of `numel` elements (padded) that `rank` owns."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: it must be in [0, {world_size})")
    shard_numel = padded_numel(numel, world_size) // world_size
    return ShardInfo(offset=rank * shard_numel, numel=shard_numel)


@dataclass(frozen=True)
class TensorSlot:
    """A named tensor inside its unit's flat range."""

    name: str
    shape: Shape
    offset: int  # within the unit's range

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class UnitLayout:
    """One unit's range in the full buffer and its slice in every rank's shard buffer."""

    name: str
    slots: tuple[TensorSlot, ...]
    numel: int  # real elements
    padded_numel: int  # multiple of world_size
    full_offset: int  # where the unit starts in the full buffer
    shard_offset: int  # where this unit's slice starts in a shard buffer
    world_size: int

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def full_slice(self) -> slice:
        return slice(self.full_offset, self.full_offset + self.padded_numel)

    def shard_slice(self) -> slice:
        return slice(self.shard_offset, self.shard_offset + self.shard_numel)


@dataclass(frozen=True)
class FlatLayout:
    """All units of a model, laid out for `world_size` ranks."""

    units: tuple[UnitLayout, ...]
    world_size: int
    align: int = 1  # each unit padded to a multiple of world_size * align

    @property
    def numel(self) -> int:
        """Real parameters, Psi in the paper."""
        return sum(u.numel for u in self.units)

    @property
    def full_numel(self) -> int:
        """Elements of the padded full buffer."""
        return sum(u.padded_numel for u in self.units)

    @property
    def shard_numel(self) -> int:
        """Elements of one rank's shard buffer (full_numel / world_size)."""
        return self.full_numel // self.world_size

    @property
    def widest_unit_numel(self) -> int:
        """Padded elements of the widest unit: what a buffer holding any one whole
        unit (stage 3's gathered unit, a unit's gradient scratch) must hold."""
        return max((u.padded_numel for u in self.units), default=0)

    def names(self) -> list[str]:
        return [f"{u.name}.{s.name}" for u in self.units for s in u.slots]

    def named_shapes(self) -> list[tuple[str, Shape]]:
        """(global name, shape) of every tensor, in layout order."""
        return [(f"{u.name}.{s.name}", s.shape) for u in self.units for s in u.slots]


def build_layout(
    units: Sequence[tuple[str, Sequence[tuple[str, Shape]]]], world_size: int, align: int = 1
) -> FlatLayout:
    """Lay out [(unit name, [(tensor name, shape), ...]), ...] for world_size ranks, each
    unit padded to a multiple of world_size * align (align 1: of world_size; a block
    size: every rank's slice whole blocks, up to world_size * align - 1 zeros a unit)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is not allowed: it must be >= 1")
    if not isinstance(align, int) or isinstance(align, bool) or align < 1:
        raise ValueError(f"align={align!r} is not allowed: it must be an integer >= 1")
    built, full_offset, shard_offset, seen = [], 0, 0, set()
    for unit_name, tensors in units:
        slots, offset = [], 0
        for name, shape in tensors:
            shape = tuple(int(d) for d in shape)
            if any(d < 0 for d in shape):
                raise ValueError(f"tensor {unit_name}.{name}: shape {shape} has a negative size")
            if f"{unit_name}.{name}" in seen:
                raise ValueError(f"tensor name {unit_name}.{name} appears twice")
            seen.add(f"{unit_name}.{name}")
            slot = TensorSlot(name, shape, offset)
            slots.append(slot)
            offset += slot.numel
        unit = UnitLayout(
            unit_name,
            tuple(slots),
            offset,
            padded_numel(offset, world_size * align),
            full_offset,
            shard_offset,
            world_size,
        )
        built.append(unit)
        full_offset += unit.padded_numel
        shard_offset += unit.shard_numel
    return FlatLayout(tuple(built), world_size, align)


def model_layout(model, world_size: int, align: int = 1) -> FlatLayout:
    """The layout of a model's units (zero_ref/models/unit.py: each has a `name` and
    `param_specs()`), in forward order: what an engine and the estimate both build."""
    return build_layout(
        [(u.name, [(s.name, s.shape) for s in u.param_specs()]) for u in model.units],
        world_size,
        align,
    )


def layout_align(cfg) -> int:
    """The alignment a ZeroConfig asks for: qwZ's block size with quantized weights (its
    blocks never straddle two ranks' slices), else 1."""
    return cfg.zeropp.quantize_block if cfg.zeropp.quantized_weights else 1


def check_block_fits(unit_numels: Sequence[int], world_size: int, block: int) -> None:
    """qwZ's block against the model (unit_numels: each unit's real elements). Block b of
    a unit is its elements [b block, (b+1) block), so from the largest unit's size up
    every unit is one block and a larger block quantizes nothing differently: it only
    pads every unit to world_size x block. Refused there, with what the padding costs."""
    largest = max(unit_numels, default=0)
    if block <= largest:
        return
    plain = sum(padded_numel(n, world_size) for n in unit_numels)
    padded = sum(padded_numel(n, world_size * block) for n in unit_numels)
    raise ValueError(
        f"quantize_block {block:,} is larger than the largest unit ({largest:,} elements): "
        f"every unit is one block from {largest:,} up, and aligning each unit to a multiple "
        f"of {world_size} x {block:,} (ranks x block) would pad the model's {plain:,} elements to "
        f"{padded:,} ({padded / max(plain, 1):.1f}x) in every rank's parameter, gradient "
        f"and optimizer shards and on the wire; allowed: 1 to {largest:,}"
    )


def tensor_views(unit_buffer: np.ndarray, unit: UnitLayout) -> dict[str, np.ndarray]:
    """Named views into a unit's flat range (no copies: np.shares_memory holds)."""
    return {s.name: unit_buffer[s.offset : s.offset + s.numel].reshape(s.shape) for s in unit.slots}


def rank_rows(unit_buffer: np.ndarray, unit: UnitLayout) -> np.ndarray:
    """A padded unit range seen as (world_size, shard_numel): row r is rank r's slice."""
    return unit_buffer[: unit.padded_numel].reshape(unit.world_size, unit.shard_numel)


def ownership(layout: FlatLayout) -> list[tuple[str, int, int, int]]:
    """Who owns which elements: (tensor or padding, rank, first, last + 1), the tensor's
    own flat element indices, for every piece of every rank's slice of every unit.
    Rank r owns elements [r n, (r + 1) n) of each unit's padded range (n = its
    shard_numel), which may cut a tensor anywhere, or hold only padding."""
    pieces = []
    for unit in layout.units:
        for rank in range(layout.world_size):
            lo, hi = rank * unit.shard_numel, (rank + 1) * unit.shard_numel
            for slot in unit.slots:
                a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
                if a < b:
                    pieces.append(
                        (f"{unit.name}.{slot.name}", rank, a - slot.offset, b - slot.offset)
                    )
            pad_lo = max(lo, unit.numel)
            if pad_lo < hi:
                pieces.append(
                    (f"{unit.name} (padding)", rank, pad_lo - unit.numel, hi - unit.numel)
                )
    return pieces
