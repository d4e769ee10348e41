"""Where initial parameters come from, one unit at a time (DeepSpeed's zero.Init,
FSDP's meta-device init): no rank ever holds the whole model at stage 3.

An engine asks its source to fill elements [lo, hi) of each unit's padded flat
range, unit after unit in forward order: stages 0-2 ask for whole units, stage
3 for the rank's own slice. So a rank's peak during init is what it keeps plus
one unit in flight.

  RandomInit  draws the units in order from one generator, exactly as
              zero_ref.models.unit.init_params does (so the values are
              bitwise the same for a seed), and keeps the asked-for range.
  FileInit    an --init file (.safetensors or .npz): reads only the element
              ranges asked for (zero_ref/io/tensor_io.py).
  NamedInit   named arrays already in memory (tests, the oracle's own copy).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from zero_ref.io.tensor_io import TensorFile
from zero_ref.layout.flat import UnitLayout
from zero_ref.models.unit import Model, draw_param, full_name, named_shapes


class InitSource(Protocol):
    def fill_unit(self, unit: UnitLayout, out: np.ndarray, lo: int, hi: int) -> None:
        """out[:] = elements [lo, hi) of `unit`'s padded flat range (padding is 0)."""


def fill_from(unit: UnitLayout, read, out: np.ndarray, lo: int, hi: int) -> None:
    """Fill out (hi - lo elements) from read(tensor name, start, stop) -> flat array,
    touching only the tensors that overlap [lo, hi); what lies in padding is 0."""
    out[:] = 0
    for slot in unit.slots:
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if a < b:
            out[a - lo : b - lo] = read(
                f"{unit.name}.{slot.name}", a - slot.offset, b - slot.offset
            )


class RandomInit:
    """The model's own initialisers, drawn unit by unit from np.random.default_rng(seed)."""

    def __init__(self, model: Model, seed: int) -> None:
        self.model, self.seed = model, seed
        self.rng = np.random.default_rng(seed)
        self.next_unit = 0

    def fill_unit(self, unit: UnitLayout, out: np.ndarray, lo: int, hi: int) -> None:
        model_unit = self.model.units[self.next_unit]
        if model_unit.name != unit.name:
            raise RuntimeError(
                f"RandomInit: units must come in forward order; expected {model_unit.name} "
                f"(unit {self.next_unit}), got {unit.name}"
            )
        drawn = {
            full_name(model_unit, s): draw_param(s, self.rng) for s in model_unit.param_specs()
        }
        fill_from(unit, lambda name, a, b: drawn[name].reshape(-1)[a:b], out, lo, hi)
        self.next_unit += 1


class FileInit:
    """Initial parameters from a file, checked against the model before any work."""

    def __init__(self, path: str | os.PathLike[str], model: Model) -> None:
        self.file = TensorFile(path)
        what = f"initial parameters in {path}"
        check_tensors(dict(self.file.shapes), dict(self.file.dtypes), model, what)

    def fill_unit(self, unit: UnitLayout, out: np.ndarray, lo: int, hi: int) -> None:
        fill_from(unit, self.file.read, out, lo, hi)


class NamedInit:
    """Named arrays in memory (each rank holds them all: for tests and small models)."""

    def __init__(self, named: Mapping[str, np.ndarray], model: Model | None = None) -> None:
        self.named = named
        if model is not None:
            shapes = {k: tuple(np.shape(v)) for k, v in named.items()}
            dtypes = {k: np.asarray(v).dtype for k, v in named.items()}
            check_tensors(shapes, dtypes, model, "initial parameters")

    def fill_unit(self, unit: UnitLayout, out: np.ndarray, lo: int, hi: int) -> None:
        fill_from(
            unit, lambda name, a, b: np.asarray(self.named[name]).reshape(-1)[a:b], out, lo, hi
        )


def as_init_source(init: InitSource | Mapping[str, np.ndarray], model: Model) -> InitSource:
    """An InitSource as it is, or named arrays wrapped (and checked against the model)."""
    if hasattr(init, "fill_unit"):
        return init
    return NamedInit(init, model)


def check_tensors(
    shapes: dict[str, tuple], dtypes: dict[str, np.dtype], model: Model, what: str
) -> None:
    """Raise ValueError listing every missing, extra, wrongly shaped or non-float tensor."""
    expected = dict(named_shapes(model))
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = [
        f"{k}: shape {tuple(shapes[k])}, expected {expected[k]}"
        for k in expected
        if k in shapes and tuple(shapes[k]) != tuple(expected[k])
    ]
    not_float = [k for k in expected if k in dtypes and not np.issubdtype(dtypes[k], np.floating)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected tensors: {', '.join(extra)}")
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong))
    if not_float:
        problems.append(f"not floating point: {', '.join(not_float)}")
    if problems:
        raise ValueError(f"{what} do not match the model: " + " | ".join(problems))
