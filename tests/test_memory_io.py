"""Memory and communication accounting, the checks on a user's initial tensors,
tensor files on disk, atomic writes, and the command line's error messages."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.comm.collectives import Comm
from zero_ref.config import MixedPrecisionConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.memory import (
    CATEGORIES,
    MemoryLedger,
    buffer_formula_bytes,
    formula_bytes,
    paper_formula_bytes,
)
from zero_ref.formulas.traffic import paper_sent_bytes
from zero_ref.io.atomic import atomic_write, atomic_write_bytes
from zero_ref.io.tensor_io import load_named, save_safetensors
from zero_ref.models.unit import init_params
from zero_ref.numerics.dtypes import element_bytes
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel

# ---- MemoryLedger


def test_memory_ledger_hold_drop_and_peaks():
    ledger = MemoryLedger()
    assert ledger.total_bytes() == 0 and ledger.peak_bytes == 0
    a = np.zeros(10, np.float32)
    assert ledger.hold("params", "a", a) is a
    ledger.hold("grads", "g", np.zeros(3, np.float64))
    ledger.hold("buffers", "tmp", np.zeros(100, np.float32))
    assert ledger.bytes_by_category() == {"params": 40, "grads": 24, "optimizer": 0, "buffers": 400}
    assert ledger.total_bytes() == 464 and ledger.peak_bytes == 464
    ledger.drop("buffers", "tmp")
    assert ledger.total_bytes() == 64
    assert ledger.peak_bytes == 464 and ledger.peak_by_category["buffers"] == 400
    ledger.hold("buffers", "tmp", np.zeros(50, np.float32))  # a smaller one: peak stays
    assert ledger.peak_bytes == 464
    ledger.hold("params", "a", np.zeros(200, np.float32))  # same name: replaced, not added
    assert ledger.bytes_by_category()["params"] == 800
    assert ledger.peak_bytes == 800 + 24 + 200
    assert ledger.peak_by_category == {"params": 800, "grads": 24, "optimizer": 0, "buffers": 400}


def test_memory_ledger_rejects_unknown_category():
    with pytest.raises(ValueError, match=r"'activations' is not one of"):
        MemoryLedger().hold("activations", "x", np.zeros(1))
    assert CATEGORIES == ("params", "grads", "optimizer", "buffers")


@pytest.mark.parametrize(
    "stage, k, expected",
    [  # numel 12, 3 ranks: full 48 bytes, shard 16 bytes
        (0, 1, {"params": 48, "grads": 48, "optimizer": 96}),
        (0, 2, {"params": 48, "grads": 96, "optimizer": 96}),
        (1, 1, {"params": 48, "grads": 48, "optimizer": 32}),  # sums land in its own rows
        (1, 3, {"params": 48, "grads": 64, "optimizer": 32}),  # + a shard adding micro-steps
        (2, 1, {"params": 48, "grads": 16, "optimizer": 32}),
        (2, 2, {"params": 48, "grads": 16, "optimizer": 32}),
        (3, 1, {"params": 16, "grads": 16, "optimizer": 32}),
        (3, 2, {"params": 16, "grads": 16, "optimizer": 32}),
    ],
)
def test_formula_bytes(stage, k, expected):
    assert formula_bytes(stage, 12, 3, k) == expected


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_formula_is_the_papers(stage, precision):
    """16-bit params and grads, fp32 master + m + v: exactly (2 + 2 + K) Psi, K = 12,
    divided as the paper's Sec. 5 divides it (grad_accum 1)."""
    sizes = element_bytes(precision, precision, precision)
    psi, nd = 1200, 4
    held = formula_bytes(stage, psi, nd, 1, sizes)
    assert sum(held.values()) == paper_formula_bytes(stage, psi, nd, k=12)
    fp32_grads = formula_bytes(stage, psi, nd, 1, element_bytes(precision, "fp32", precision))
    assert fp32_grads["grads"] == 2 * held["grads"]


def test_paper_formula_bytes_reproduces_figure_1():
    """Sec. 1 / Figure 1 of the paper: 7.5B parameters, Nd = 64, K = 12."""
    psi, nd = 7.5e9, 64
    gb = [paper_formula_bytes(s, psi, nd) / 1e9 for s in range(4)]
    assert gb == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    assert paper_formula_bytes(0, 10, 4, k=8) == 120.0
    assert [paper_formula_bytes(s, 10, 1) for s in range(4)] == [160.0] * 4


@pytest.mark.parametrize(
    "stage, k, expected",
    # numel 12, 3 ranks: one reduce-scatter or all-gather moves 4 * 12 * 2 / 3 = 32 bytes
    [(0, 1, 64), (0, 2, 128), (1, 1, 64), (1, 3, 128), (2, 2, 96), (3, 1, 96), (3, 2, 192)],
)
def test_paper_sent_bytes(stage, k, expected):
    assert paper_sent_bytes(stage, 12, 3, k) == expected


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_rank_sends_nothing(stage):
    assert paper_sent_bytes(stage, 1009, 1, 3) == 0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_engine_on_one_rank_holds_the_formula(stage, k, precision):
    model = ReplayModel([("u0", [("w", (3, 5)), ("s", ())]), ("u1", [("b", (7,))])])
    cfg = ZeroConfig(
        stage=stage,
        grad_accum=k,
        bucket_numel=8,
        mixed_precision=MixedPrecisionConfig(dtype=precision),
    )
    engine = make_engine(model, init_params(model, 0), cfg, Comm(MPI.COMM_SELF))
    held = engine.memory.bytes_by_category()
    sizes = element_bytes(precision, precision, precision)
    formula = formula_bytes(stage, engine.layout.full_numel, 1, k, sizes)
    assert {c: held[c] for c in formula} == formula
    numels = [u.padded_numel for u in engine.layout.units]
    assert held["buffers"] == buffer_formula_bytes(stage, numels, 1, 8, k, sizes)


# ---- the checks on initial parameters (zero_ref.engine.packing)

UNITS = [("embed", [("table", (5, 3))]), ("out", [("weight", (3, 5)), ("bias", (5,))])]


def engine_of(model, named: dict[str, np.ndarray], stage: int = 2):
    return make_engine(model, named, ZeroConfig(stage=stage), Comm(MPI.COMM_SELF))


def engine_from(named: dict[str, np.ndarray], stage: int):
    return engine_of(ReplayModel(UNITS), named, stage)


def good_init() -> dict[str, np.ndarray]:
    return init_params(ReplayModel(UNITS), 0)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_good_init_is_packed_exactly(stage):
    init = good_init()
    got = full_parameters(engine_from(init, stage))
    assert list(got) == list(init)
    for name in init:
        np.testing.assert_array_equal(got[name].view(np.uint32), init[name].view(np.uint32))


@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("out.bias"), "missing tensors: out.bias"),
        (lambda d: d.update(extra=np.zeros(2, np.float32)), "unexpected tensors: extra"),
        (
            lambda d: d.update({"embed.table": np.zeros((3, 5), np.float32)}),
            "wrong shapes: embed.table: shape (3, 5), expected (5, 3)",
        ),
        (
            lambda d: d.update({"out.weight": np.zeros((3, 5), np.int64)}),
            "not floating point: out.weight",
        ),
    ],
    ids=["missing", "extra", "shape", "int"],
)
def test_bad_init_names_the_problem(stage, change, message):
    init = good_init()
    change(init)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        engine_from(init, stage)
    assert str(info.value).startswith("initial parameters do not match the model: ")


def test_bad_init_lists_every_problem():
    init = good_init()
    del init["out.bias"], init["embed.table"]
    init["zz"] = np.zeros(1, np.float32)
    init["out.weight"] = np.zeros(2, np.int32)
    with pytest.raises(ValueError) as info:
        engine_from(init, 2)
    parts = str(info.value).split(": ", 1)[1].split(" | ")
    assert parts == [
        "missing tensors: embed.table, out.bias",
        "unexpected tensors: zz",
        "wrong shapes: out.weight: shape (2,), expected (3, 5)",
        "not floating point: out.weight",
    ]


def test_float64_init_is_accepted_and_rounded():
    init = {k: v.astype(np.float64) + 1e-12 for k, v in good_init().items()}
    got = full_parameters(engine_from(init, 1))
    for name in init:
        np.testing.assert_array_equal(got[name], init[name].astype(np.float32))


# ---- tensor files


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "embed.table": rng.standard_normal((5, 3)).astype(np.float32),
        "out.bias": np.array([1.5, -0.0, np.float32(1.4e-45)], np.float32),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }


def assert_same_tensors(got, expected):
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k].view(np.uint32), v.view(np.uint32))


def test_npz_round_trip(tmp_path):
    path = tmp_path / "init.npz"
    np.savez(path, **sample_tensors())
    assert_same_tensors(load_named(path), sample_tensors())
    assert_same_tensors(load_named(str(path)), sample_tensors())


def test_safetensors_round_trip(tmp_path):
    path = tmp_path / "final.safetensors"
    tensors = {k: v for k, v in sample_tensors().items() if v.ndim > 0}  # 0-d: see below
    assert save_safetensors(path, tensors) == path
    assert_same_tensors(load_named(path), tensors)
    assert [p.name for p in tmp_path.iterdir()] == ["final.safetensors"]  # no temp file left


def test_safetensors_keep_0d_tensors(tmp_path):
    model = ReplayModel([("u", [("scale", ()), ("w", (3,))])])
    engine = engine_of(model, init_params(model, 0))
    path = save_safetensors(tmp_path / "export.safetensors", full_parameters(engine))
    assert load_named(path)["u.scale"].shape == ()
    engine_of(model, load_named(path))  # the export is a valid --init


def test_safetensors_are_written_as_float32(tmp_path):
    path = tmp_path / "f64.safetensors"
    save_safetensors(path, {"x": np.arange(3, dtype=np.float64) / 3})
    got = load_named(path)["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (np.arange(3) / 3).astype(np.float32))


@pytest.mark.parametrize("name", ["init.pt", "init.npy", "init", "init.SAFETENSORS"])
def test_unknown_extension(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"whatever")
    with pytest.raises(
        ValueError, match=r"unknown tensor file type.*allowed: \.npz, \.safetensors"
    ):
        load_named(path)


def test_export_must_be_safetensors(tmp_path):
    with pytest.raises(ValueError, match=r"\.safetensors"):
        save_safetensors(tmp_path / "out.npz", sample_tensors())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["missing.npz", "missing.safetensors"])
def test_missing_file(tmp_path, name):
    with pytest.raises(FileNotFoundError, match=re.escape(name)):
        load_named(tmp_path / name)


@pytest.mark.parametrize("name", ["bad.npz", "bad.safetensors"])
def test_corrupt_file_names_the_path(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\x00not a tensor file\xff" * 3)
    with pytest.raises(ValueError, match=re.escape(name) + ": cannot read tensors"):
        load_named(path)


# ---- atomic writes


def test_atomic_write_replaces_the_file(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    assert atomic_write_bytes(path, b"new contents") == path
    assert path.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old contents")

    def crashes_midway(f):
        f.write(b"half of the new")
        f.flush()
        assert len(os.listdir(tmp_path)) == 2  # the temporary file exists meanwhile
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(path, crashes_midway)
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_failed_first_write_leaves_nothing(tmp_path):
    def crashes(f):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.bin", crashes)
    assert os.listdir(tmp_path) == []


# ---- the command line (tests/test_cli_config.py covers --config files)


def test_defaults_parse():
    parsed = parse_args([])
    assert parsed.run.steps >= 1 and parsed.zero.stage == 2 and parsed.zero.clip == 1.0
    zero = parse_args(["--clip", "0", "--stage", "3", "--deterministic"]).zero
    assert zero.clip is None and zero.stage == 3 and zero.deterministic


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--steps", "0"], "--steps"),
        (["--batch-size", "-4"], "--batch-size"),
        (["--micro-batch-size", "0"], "--micro-batch-size"),
        (["--log-every", "0"], "--log-every"),
        (["--context", "0"], "--context"),
        (["--d-embed", "0"], "--d-embed"),
        (["--d-hidden", "-1"], "--d-hidden"),
        (["--bucket-numel", "0"], "--bucket-numel"),
        (["--grad-accum", "0"], "--grad-accum"),
        (["--seed", "-1"], "--seed"),
        (["--sample-chars", "-1"], "--sample-chars"),
        (["--clip", "-0.5"], "--clip"),
    ],
)
def test_bad_flag_is_named(argv, flag):
    with pytest.raises(ValueError, match=rf"^{re.escape(flag)} {re.escape(argv[1])} "):
        parse_args(argv)


@pytest.mark.parametrize("argv", [["--stage", "4"], ["--steps", "two"], ["--model", "gpt9"]])
def test_malformed_flags_are_named(argv):
    with pytest.raises(ValueError, match=re.escape(argv[0])):
        parse_args(argv)


def test_batch_size_must_split_over_ranks_and_micro_steps():
    parsed = parse_args(["--batch-size", "12", "--grad-accum", "2"], world_size=3)
    assert (parsed.run.batch_size, parsed.run.micro_batch_size) == (12, 2)
    assert parsed.zero.grad_accum == 2
    with pytest.raises(ValueError, match=r"batch size 12 .*grad-accum 5 x 1 ranks.*of 5"):
        parse_args(["--batch-size", "12", "--grad-accum", "5"])
    with pytest.raises(ValueError, match=r"batch size 12 .*grad-accum 1 x 8 ranks.*of 8"):
        parse_args(["--batch-size", "12"], world_size=8)
