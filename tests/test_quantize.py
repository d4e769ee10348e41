"""qwZ's block quantization (zero_ref/numerics/quantize.py): the Numba kernel against its NumPy
twin element by element, the rule on ties, zeros, subnormals and non-finite blocks;
the layout's alignment; and stage 3's forward gather at world sizes 1, 2 and 4
(tests/mpi_qwz_check.py): the same values, the oracle's, at each."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mpi4py import MPI

from tests.mpi_pool import REPO, mpi_env, mpirun_command, run_watched
from tests.test_parity import MLP, QWZ, check_bitwise, pinned, run
from zero_ref.app.cli import UsageError, parse_args
from zero_ref.app.rank_estimate import estimate_for
from zero_ref.app.run_setup import prepare
from zero_ref.comm.choose import comm_for
from zero_ref.config import OverlapConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.layout.flat import build_layout, check_block_fits
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.numerics.quantize import (
    NonFiniteParameterError,
    dequantize,
    dequantize_kernel,
    dequantize_reference,
    quantize,
    quantize_kernel,
    quantize_reference,
    quantized_copy,
)

TINY = np.float32(2.0**-149)  # the smallest subnormal


def both(x: np.ndarray, block: int):
    """(q, scales, bad) from the kernel and from the twin."""
    out = []
    for fn in (quantize_kernel, quantize_reference):
        q = np.full(x.size, 99, np.int8)
        scales = np.full(x.size // block, -1, np.float32)
        out.append((q, scales, fn(x, block, q, scales)))
    return out


def assert_twins(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    (qk, sk, bk), (qr, sr, br) = both(x, block)
    assert bk == br
    np.testing.assert_array_equal(qk, qr)
    np.testing.assert_array_equal(sk.view(np.uint32), sr.view(np.uint32))
    dk, dr = np.empty(x.size, np.float32), np.empty(x.size, np.float32)
    dequantize_kernel(qk, sk, block, dk)
    dequantize_reference(qr, sr, block, dr)
    np.testing.assert_array_equal(dk.view(np.uint32), dr.view(np.uint32))
    return qk, sk


@pytest.mark.parametrize("numel,block", [(0, 1), (1, 1), (7, 7), (14, 7), (13, 13), (64, 8)])
def test_twins_agree_at_awkward_sizes(numel, block):
    x = np.random.default_rng(numel).standard_normal(numel).astype(np.float32)
    q, scales = assert_twins(x, block)
    assert np.all(np.abs(q) <= 127)
    if numel:
        amax = np.abs(x.reshape(-1, block)).max(axis=1)
        np.testing.assert_array_equal(scales, amax / np.float32(127))
        assert np.all(np.abs(q.reshape(-1, block)).max(axis=1) == 127)  # amax -> +-127


def test_ties_round_to_even():
    # scale 1 (amax 127): x / scale is x itself, so halves are ties
    x = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], np.float32)
    q, scales = assert_twins(x, 8)
    assert scales[0] == 1
    np.testing.assert_array_equal(q, [127, 0, 2, 2, 0, -2, -2, 4])


def test_zero_block_and_underflowing_scale_give_zeros():
    x = np.array([0, 0, 0, 0, TINY, -TINY, 0, 0], np.float32)  # amax/127 underflows to 0
    q, scales = assert_twins(x, 4)
    np.testing.assert_array_equal(scales, [0, 0])
    np.testing.assert_array_equal(q, np.zeros(8, np.int8))


def test_subnormal_scale_is_clipped_to_127():
    # amax = 177 * 2^-149: scale = 1.39.. * 2^-149 rounds to 2^-149, x / scale = 177 > 127
    x = np.array([177 * TINY, 10 * TINY, -177 * TINY, 0], np.float32)
    q, scales = assert_twins(x, 4)
    assert scales[0] == TINY
    np.testing.assert_array_equal(q, [127, 10, -127, 0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, np.finfo(np.float32).max])
def test_a_non_finite_block_is_refused_naming_it(bad):
    x = np.ones(12, np.float32)
    x[9] = bad
    (_, _, bk), (_, _, br) = both(x, 4)
    assert bk == br == 2
    with pytest.raises(NonFiniteParameterError, match=r"unit h: block 2 \(elements \[8, 12\)"):
        quantize(x, 4, np.empty(12, np.int8), np.empty(3, np.float32), "unit h")


def test_sizes_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="do not split into blocks of 4"):
        quantize(np.ones(6, np.float32), 4, np.empty(6, np.int8), np.empty(1, np.float32), "u")
    with pytest.raises(ValueError, match="block=0"):
        dequantize(np.empty(0, np.int8), np.empty(0, np.float32), 0, np.empty(0, np.float32))


def test_quantized_copy_pads_the_last_block_with_zeros():
    x = np.array([3.0, -1.0, 0.25, 100.0, 7.0], np.float32)  # blocks [0, 4), [4, 8)
    got = quantized_copy(x, 4)
    scale = np.float32(100.0) / np.float32(127)
    assert got[3] == np.float32(127) * scale and got[4] == np.float32(127) * (
        np.float32(7.0) / np.float32(127)
    )
    assert got.size == 5


finite32 = hnp.arrays(  # below float32's largest by a margin: 127 * scale stays finite
    np.float32,
    st.integers(0, 64).map(lambda b: b * 4),
    elements=st.floats(float(np.float32(-3e38)), float(np.float32(3e38)), width=32),
)


@settings(max_examples=300, deadline=None)
@given(x=finite32, block=st.sampled_from([1, 2, 4]))
def test_twins_agree_on_any_finite_values(x, block):
    q, scales = assert_twins(x, block)
    back = np.empty(x.size, np.float32)
    dequantize(q, scales, block, back)
    step = np.repeat(scales, block).astype(np.float64)
    normal = step >= 2.0**-126  # a subnormal scale is coarse, and clipped (tested above)
    # within half a step (scale / 2) of x, up to float32's own roundings
    err = np.abs(back.astype(np.float64) - x)
    assert np.all(err[normal] <= step[normal] * 0.5001)
    assert np.all(np.isfinite(back))


def test_layout_align_pads_units_to_whole_blocks_per_rank():
    units = [("a", [("w", (37, 5))]), ("b", [("w", (0,))]), ("c", [("w", (9,))])]
    for world in (1, 2, 4):
        layout = build_layout(units, world, align=8)
        assert [u.padded_numel for u in layout.units] == [
            -(-n // (8 * world)) * 8 * world for n in (185, 0, 9)
        ]
        assert all(u.shard_numel % 8 == 0 for u in layout.units)
    assert build_layout(units, 3).units[0].padded_numel == 186  # align 1: today's
    with pytest.raises(ValueError, match="align=0"):
        build_layout(units, 2, align=0)


def test_a_block_past_the_largest_unit_is_refused_with_the_padding_it_costs():
    """From the largest unit's size up every unit is one block: a larger block changes no
    quantized value, only pads each unit to W x block. The largest unit's size is allowed,
    one more is not, and the message says what the padding would be."""
    check_block_fits([10, 40, 25], 4, 40)
    check_block_fits([10, 40, 25], 4, 1)
    # plain: 12 + 40 + 28 = 80 elements at 4 ranks; at 4 x 41 each unit is 164
    with pytest.raises(ValueError, match=r"quantize_block 41 .*\(40 elements\).*80 .*492 "):
        check_block_fits([10, 40, 25], 4, 41)
    with pytest.raises(ValueError, match=r"allowed: 1 to 7"):
        check_block_fits([7], 3, 8)


def test_the_command_line_refuses_a_block_past_the_model_before_training(tiny_corpus):
    """zero_ref.train's setup (run_setup.prepare) refuses qwZ's --quantize-block past the
    largest unit, before any engine exists; qgZ alone pads nothing and takes any block."""
    base = ["--data", tiny_corpus, "--model", "gpt", "--d-model", "16", "--n-layer", "2"]
    base += ["--n-head", "2", "--context", "8", "--batch-size", "8", "--stage", "3"]
    job = prepare(parse_args([*base, "--quantized-weights", "--quantize-block", "1"], 4), 4)
    largest = max(sum(s.numel for s in u.param_specs()) for u in job.task.model.units)
    prepare(parse_args([*base, "--quantized-weights", "--quantize-block", str(largest)], 4), 4)
    too_big = parse_args([*base, "--quantized-weights", "--quantize-block", str(largest + 1)], 4)
    with pytest.raises(UsageError, match=f"--quantize-block: quantize_block {largest + 1:,} "):
        prepare(too_big, 4)
    prepare(parse_args([*base, "--quantized-gradients", "--quantize-block", "100000"], 4), 4)


QWZ_ON = ZeroPPConfig(quantized_weights=True)


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: ZeroConfig(stage=2, zeropp=QWZ_ON), "below stage 3"),
        (lambda: ZeroConfig(stage=3, zeropp=QWZ_ON, overlap=OverlapConfig(persistence_numel=10)),
         "persistence_numel=10"),
        (lambda: ZeroConfig(stage=3, zeropp=ZeroPPConfig(quantized_weights=True, quantize_block=0)),
         "quantize_block=0"),
    ],
)  # fmt: skip
def test_config_refuses_what_qwz_cannot_do(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_forward_gather_is_the_same_at_world_sizes_1_2_4(precision):
    """Blocks aligned to shards: every world size hands forward the same dequantized
    values, the oracle's (which has no world size), and backward the full ones."""
    reports = []
    for world in (1, 2, 4):
        script = str(REPO / "tests" / "mpi_qwz_check.py")
        done = run_watched(mpirun_command(world, script, precision, "8"), env=mpi_env())
        assert done.returncode == 0, done.stderr[-2000:]
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for r in reports:
        assert r["oracle_forward"] and r["backward_full"] and r["differs_from_full"], r
        assert r["buffers"][0] == r["buffers"][1], f"buffers held vs estimated: {r}"
    assert reports[0]["hashes"] == reports[1]["hashes"] == reports[2]["hashes"]


@pytest.mark.parametrize(
    "first,second",
    [
        ({"world": 2, "qwz": QWZ}, {"world": 3, "qwz": None}),  # qwZ saved, resumed without
        ({"world": 3, "qwz": None}, {"world": 4, "qwz": {"quantize_block": 4}}),
        ({"world": 4, "qwz": QWZ}, {"world": 2, "qwz": {"quantize_block": 16}}),  # new blocks
    ],
)
def test_checkpoint_of_a_qwz_run_resumes_and_reshards(mpi_pools, first, second):
    """A qwZ layout (units padded to whole blocks per rank) is saved with its alignment
    and resumed at another world size, with or without qwZ, bitwise the oracle that
    replays the first run's quantized (or full) forwards."""
    drawn = pinned(MLP, stage=3, grad_accum=2, **first)
    folder = tempfile.mkdtemp(prefix="zero_ref_qwz_ckpt_")
    saved = run(mpi_pools, {**drawn, "save_to": folder})
    history = [
        {"world": first["world"], "lrs": drawn["lrs"][: drawn["steps"]], "qwz": first["qwz"]}
    ]
    resumed = run(mpi_pools, {**drawn, **second, "resume_from": folder, "history": history})
    for result in (saved, resumed):
        check_bitwise(result)
        assert result["optimizer_state_bitwise"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--quantize-block", "64"],
        ["--quantize-block", "16", "--overlap-comm", "--precision", "bf16"],
        ["--overlap-comm", "--prefetch-numel", "1000000", "--precision", "fp16"],
    ],
)
def test_qwz_estimate_equals_the_ledger(tmp_path, flags):
    """From the command line: the layout padded to whole blocks, qwZ's send and receive
    rows per gathered-unit buffer and its float32 scratch, as the engine holds them."""

    corpus = tmp_path / "text.txt"
    corpus.write_text("a small corpus; its vocabulary is all the model needs here.\n" * 4)
    argv = ["--data", str(corpus), "--stage", "3", "--quantized-weights", *flags]
    parsed = parse_args(argv, 1)
    assert parsed.zero.zeropp.quantized_weights
    model = GPT(GPTConfig(vocab_size=37, context=16, n_layer=2, n_head=2, d_model=22))
    engine = make_engine(
        model, RandomInit(model, 0), parsed.zero, comm_for(MPI.COMM_SELF, parsed.zero)
    )
    est = estimate_for(parsed, model, 1)
    held = engine.memory.bytes_by_category()
    names = set(engine.memory.held["buffers"])
    engine.close()
    assert held == {k: getattr(est, k) for k in held}
    assert {"qwZ send 0", "qwZ recv 0", "qwZ float32 scratch"} <= names
    assert est.padded_numel % parsed.zero.zeropp.quantize_block == 0


def test_deepspeed_key_turns_qwz_on(tmp_path):
    """DeepSpeed's zero_optimization.zero_quantized_weights feeds ZeroPPConfig.quantized_weights
    (deepspeed/runtime/zero/config.py); --quantize-block has no DeepSpeed key."""
    ds = {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    parsed = parse_args(["--config", str(path), "--quantize-block", "512"], 2)
    assert parsed.zero.zeropp.quantized_weights and parsed.zero.zeropp.quantize_block == 512
    assert not parse_args(["--stage", "3"], 2).zero.zeropp.quantized_weights
