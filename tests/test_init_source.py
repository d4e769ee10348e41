"""Sharded initialisation: each rank fills only its own share of every unit, with the
values the whole-model init_params gives, reading only its bytes of an --init file,
and never holding more than its share plus one unit on the way."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.init_source import FileInit, NamedInit, RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.io.tensor_io import save_safetensors
from zero_ref.layout.flat import build_layout
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.models.unit import init_params
from zero_ref.testing.engine_state import full_parameters

WORLD = 4


def gpt(d_model: int = 16, n_layer: int = 2) -> GPT:
    return GPT(GPTConfig(vocab_size=13, context=7, n_layer=n_layer, n_head=2, d_model=d_model))


def padded_full(model, named: dict, world: int) -> np.ndarray:
    """The padded full buffer of `named`, built the plain way: tensor by tensor."""
    layout = build_layout(
        [(u.name, [(s.name, s.shape) for s in u.param_specs()]) for u in model.units], world
    )
    full = np.zeros(layout.full_numel, np.float32)
    for unit in layout.units:
        for slot in unit.slots:
            start = unit.full_offset + slot.offset
            full[start : start + slot.numel] = named[f"{unit.name}.{slot.name}"].reshape(-1)
    return full, layout


def shards_of(source_for_rank, layout) -> np.ndarray:
    """What stage 3 fills on every rank, put back together as a padded full buffer."""
    full = np.zeros(layout.full_numel, np.float32)
    for rank in range(layout.world_size):
        source = source_for_rank(rank)
        for unit in layout.units:
            lo = rank * unit.shard_numel
            out = np.empty(unit.shard_numel, np.float32)
            source.fill_unit(unit, out, lo, lo + unit.shard_numel)
            full[unit.full_offset + lo : unit.full_offset + lo + unit.shard_numel] = out
    return full


def as_bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def test_random_init_shards_are_bitwise_init_params():
    model = gpt()
    expected, layout = padded_full(model, init_params(model, 5), WORLD)
    got = shards_of(lambda rank: RandomInit(model, 5), layout)
    assert np.array_equal(as_bits(got), as_bits(expected))


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_file_init_reads_only_the_ranks_own_elements(suffix, tmp_path):
    model = gpt()
    named = init_params(model, 3)
    path = tmp_path / f"init{suffix}"
    save_safetensors(path, named) if suffix == ".safetensors" else np.savez(path, **named)
    expected, layout = padded_full(model, named, WORLD)
    read_per_rank = {}

    def counting_source(rank: int) -> FileInit:
        source = FileInit(path, model)
        read = source.file.read

        def counted(name, start=0, stop=None):
            out = read(name, start, stop)
            read_per_rank[rank] = read_per_rank.get(rank, 0) + out.size
            return out

        source.file.read = counted
        return source

    got = shards_of(counting_source, layout)
    assert np.array_equal(as_bits(got), as_bits(expected))
    for rank, n in read_per_rank.items():  # its real elements, not one more
        real = sum(
            max(0, min(u.numel, (rank + 1) * u.shard_numel) - rank * u.shard_numel)
            for u in layout.units
        )
        assert n == real, f"rank {rank} read {n} elements, owns {real}"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", ["random", "file", "named"])
def test_every_stage_starts_from_init_params(mpi_comm, stage, kind, tmp_path):
    model = gpt()
    named = init_params(model, 9)
    path = tmp_path / "init.safetensors"
    save_safetensors(path, named)
    source = {"random": lambda: RandomInit(model, 9), "file": lambda: FileInit(path, model),
              "named": lambda: NamedInit(named, model)}[kind]()  # fmt: skip
    cfg = ZeroConfig(stage=stage)
    got = full_parameters(make_engine(model, source, cfg, comm_for(mpi_comm, cfg)))
    assert list(got) == list(named)
    for name, value in named.items():
        assert np.array_equal(as_bits(got[name]), as_bits(value)), name


def test_a_file_that_does_not_fit_the_model_is_refused(tmp_path):
    named = init_params(gpt(), 0)
    named["head.lm_head.weight"] = named["head.lm_head.weight"][:, :5]
    path = tmp_path / "init.safetensors"
    save_safetensors(path, named)
    with pytest.raises(ValueError, match="wrong shapes: head.lm_head.weight"):
        FileInit(path, gpt())


def test_init_peak_is_the_shard_plus_one_unit():
    """tracemalloc sees NumPy's allocations: filling a rank's stage-3 shard never holds
    more than the shard plus one unit being drawn (float64 draws, then float32)."""
    model = gpt(d_model=64, n_layer=12)
    layout = build_layout(
        [(u.name, [(s.name, s.shape) for s in u.param_specs()]) for u in model.units], WORLD
    )
    widest = max(u.numel for u in layout.units)
    shard = np.zeros(layout.shard_numel, np.float32)
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    source = RandomInit(model, 0)
    for unit in layout.units:
        lo = 2 * unit.shard_numel  # rank 2
        source.fill_unit(unit, shard[unit.shard_slice()], lo, lo + unit.shard_numel)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    whole_model = 4 * layout.full_numel
    assert peak <= (8 + 4) * widest + 64 * 1024, (peak, widest)  # one unit drawn, and small change
    assert peak < whole_model / 2  # far from ever holding the model
