"""zero_ref.app.estimate: the model-state part equals the engine's ledger to the byte, the
activation part is within 15 % of what one forward + backward really allocates, and
the refusal before the first step names its numbers and the flags that lower them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.app.cli import UsageError, parse_args
from zero_ref.app.estimate import (
    activation_bytes,
    check_fits,
    estimate_for,
    estimate_rank,
    main,
    mem_available_bytes,
    model_for,
)
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.models.mlp import CharMLP, MLPConfig

GIB = 2**30
# Widths chosen so that units need padding at 3 ranks and at 4.
SMALL_GPT = GPTConfig(vocab_size=37, context=16, n_layer=2, n_head=2, d_model=22)
SMALL_MLP = MLPConfig(vocab_size=37, context=5, d_embed=7, d_hidden=33)
MODELS = {"gpt": lambda: GPT(SMALL_GPT), "mlp": lambda: CharMLP(SMALL_MLP)}


def build_engine(
    model, stage: int, mpi_comm, grad_accum: int = 1, claim_world=None, checkpoint=False
):
    cfg = ZeroConfig(
        stage=stage, bucket_numel=96, grad_accum=grad_accum, checkpoint_activations=checkpoint
    )
    comm = comm_for(mpi_comm, cfg)
    if claim_world is not None:
        # Building an engine sends nothing, so a Comm that claims W ranks builds
        # exactly the buffers rank 1 of W would (the layout padded for W).
        comm.size, comm.rank = claim_world, 1
    return make_engine(model, RandomInit(model, 0), cfg, comm), cfg


def expected(model, engine, cfg):
    return estimate_rank(model, cfg.stage, engine.world, 1, cfg.bucket_numel, cfg.grad_accum)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("grad_accum", [1, 3])
def test_model_states_equal_the_ledger(mpi_comm, name, stage, grad_accum):
    model = MODELS[name]()
    engine, cfg = build_engine(model, stage, mpi_comm, grad_accum)
    est = expected(model, engine, cfg)
    held = engine.memory.bytes_by_category()
    assert held == {k: getattr(est, k) for k in held}
    assert engine.memory.peak_bytes == est.model_states


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_states_equal_the_ledger_padded_for_more_ranks(world, stage):
    model = GPT(SMALL_GPT)
    engine, cfg = build_engine(model, stage, MPI.COMM_SELF, claim_world=world)
    est = expected(model, engine, cfg)
    assert est.padded_numel > est.numel  # the padding is part of what is compared
    assert engine.memory.bytes_by_category() == {
        "params": est.params,
        "grads": est.grads,
        "optimizer": est.optimizer,
        "buffers": est.buffers,
    }


@pytest.mark.parametrize("stage", [0, 3])
def test_export_needs_no_buffer_beyond_the_model_states(mpi_comm, stage):
    """Streaming the parameters to rank 0 lends views (stages 0-2) or goes through the
    idle gathered-unit buffer (stage 3): the ledger's peak stays the model states'."""
    model = GPT(SMALL_GPT)
    engine, cfg = build_engine(model, stage, mpi_comm)
    engine.stream_state(["param"], lambda kind, unit, flat: None)
    assert engine.memory.peak_bytes == expected(model, engine, cfg).model_states


def traced_peak_of_one_micro_step(model, batch: int, stage: int, checkpoint=False) -> int:
    """Peak bytes NumPy allocates during the engine's forward + backward (tracemalloc
    sees every NumPy array's data)."""
    engine, _ = build_engine(model, stage, MPI.COMM_SELF, checkpoint=checkpoint)
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    context = model.config.context
    x = rng.integers(0, vocab, (batch, context))
    y = rng.integers(0, vocab, (batch, context) if isinstance(model, GPT) else (batch,))
    engine.forward_backward(x, y, 0)  # kernels loaded, BLAS warm
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        engine.forward_backward(x, y, 0)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


GPT_WIDE = GPT(GPTConfig(vocab_size=50, context=32, n_layer=2, n_head=4, d_model=64))
GPT_DEEP = GPT(GPTConfig(103, context=64, n_layer=8, n_head=4, d_model=64))
ACTIVATION_CASES = {
    "gpt-wide": (GPT_WIDE, 2, 0),
    "gpt-wide-stage3": (GPT_WIDE, 2, 3),
    "gpt-long-context": (GPT(GPTConfig(40, context=128, n_layer=2, n_head=8, d_model=32)), 2, 0),
    "gpt-deeper": (GPT(GPTConfig(103, context=64, n_layer=3, n_head=4, d_model=64)), 1, 0),
    "mlp": (CharMLP(MLPConfig(vocab_size=80, context=16, d_embed=32, d_hidden=512)), 256, 0),
    "gpt-deep-checkpointed": (
        GPT(GPTConfig(103, context=64, n_layer=8, n_head=4, d_model=64)),
        2,
        3,
        True,
    ),
    "gpt-wide-checkpointed": (GPT_WIDE, 2, 0, True),
}


@pytest.mark.parametrize("case", sorted(ACTIVATION_CASES))
def test_activations_within_15_percent_of_traced_peak(case):
    model, batch, stage, *checkpoint = ACTIVATION_CASES[case]
    traced = traced_peak_of_one_micro_step(model, batch, stage, *checkpoint)
    estimated = activation_bytes(model, batch, *checkpoint)
    assert abs(estimated / traced - 1) <= 0.15, (estimated, traced)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("a small corpus; its vocabulary is all the model needs here.\n" * 4)
    return str(path)


def test_check_fits_refuses_a_context_of_100000_naming_the_numbers(corpus):
    parsed = parse_args(["--data", corpus, "--context", "100000"], 4)
    with pytest.raises(UsageError) as refused:
        check_fits(parsed, model_for(parsed, 4), 4, ranks_on_host=4, mem_available=16 * GIB)
    message = str(refused.value)
    assert "TiB per rank at stage 2" in message  # the estimate
    assert "4 GiB (MemAvailable 16 GiB / 4)" in message  # what each rank has
    for flag in ("--micro-batch-size", "--batch-size", "--context", "--d-model", "--n-layer"):
        assert flag in message
    assert "--stage 3" in message and "more ranks" in message
    assert message.index("--context") < message.index("--stage 3")  # activations dominate


def test_check_fits_accepts_the_default_run(corpus):
    parsed = parse_args(["--data", corpus], 4)
    est = check_fits(parsed, model_for(parsed, 4), 4, ranks_on_host=4, mem_available=16 * GIB)
    assert est.total < 64 * 2**20
    check_fits(parsed, model_for(parsed, 4), 4, ranks_on_host=4)  # this machine's MemAvailable


def test_mem_available_reads_meminfo_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:    512 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert mem_available_bytes(str(meminfo), str(cgroup)) == 512 * 1024
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("100\n")
    assert mem_available_bytes(str(meminfo), str(cgroup)) == 512 * 1024
    (cgroup / "memory.max").write_text("1124\n")
    assert mem_available_bytes(str(meminfo), str(cgroup)) == 1024
    assert mem_available_bytes(str(tmp_path / "none"), str(tmp_path / "none")) is None


def test_cli_prints_a_table_per_stage(corpus, capsys):
    assert main(["--data", corpus, "--ranks", "4", "--stage", "3", "--d-model", "32"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line[:6].strip() in ("0", "1", "2", "3*")]
    assert len(rows) == 4, out
    assert "activations" in out and "largest model" in out and "MemAvailable" in out


def test_cli_bad_flag_is_one_error(capsys):
    assert main(["--ranks", "0"]) == 2
    assert "--ranks 0" in capsys.readouterr().err


def test_checkpointing_keeps_a_fraction_of_the_activations():
    kept = traced_peak_of_one_micro_step(GPT_DEEP, 2, 3, checkpoint=True)
    assert kept < 0.5 * traced_peak_of_one_micro_step(GPT_DEEP, 2, 3)


OFFLOADED = [  # (stage, flags): the optimizer on NVMe, at stage 3 the parameters too
    (1, []),
    (2, []),
    (3, []),
    (3, ["--offload-param", "nvme"]),
    (3, ["--offload-param", "nvme", "--precision", "bf16"]),
    (2, ["--precision", "fp16", "--grad-accum", "3", "--batch-size", "3"]),
    (3, ["--offload-param", "nvme", "--grad-accum", "3", "--batch-size", "3"]),
]


@pytest.mark.parametrize("stage, flags", OFFLOADED)
def test_offloaded_estimate_equals_the_ledger_in_ram(tmp_path, corpus, stage, flags):
    """With --offload-optimizer nvme (and --offload-param nvme) the estimate counts in
    RAM what the ledger holds in RAM, category by category: the offloaded optimizer
    state, parameter shard and gradient shard are on disk, and the pool, the gradient's
    landing strip and the rest of the buffers are in RAM."""
    argv = ["--data", corpus, "--stage", str(stage), "--bucket-numel", "96"]
    argv += ["--offload-optimizer", "nvme", "--nvme-path", str(tmp_path), *flags]
    argv += ["--sub-group-size", "64", "--buffer-count", "3"]
    parsed = parse_args(argv, 1)
    model = GPT(SMALL_GPT)
    comm = comm_for(MPI.COMM_SELF, parsed.zero)
    engine = make_engine(model, RandomInit(model, 0), parsed.zero, comm)
    est = estimate_for(parsed, model, 1)
    held = engine.memory.bytes_by_category()
    on_disk = engine.memory.disk_bytes_by_category()
    engine.close()
    assert held == {k: getattr(est, k) for k in held}, on_disk
    assert engine.memory.peak_bytes == est.model_states
    assert on_disk["optimizer"] > 0 and est.optimizer == 0
    assert (on_disk["params"] > 0) == ("--offload-param" in flags)
    assert (on_disk["grads"] > 0) == (stage >= 2)  # stage 1's gradients stay in RAM


OVERLAPPED = [  # --overlap-comm: two staging lanes; stage 3 gathers ahead, keeps small units
    (1, []),
    (2, ["--precision", "bf16"]),
    (3, []),
    (3, ["--prefetch-numel", "1000000", "--persistence-numel", "5000"]),
    (3, ["--prefetch-numel", "1000000", "--max-live-numel", "40000", "--precision", "fp16"]),
]


@pytest.mark.parametrize("stage, flags", OVERLAPPED)
def test_overlapped_estimate_equals_the_ledger(corpus, stage, flags):
    """The second staging lane and the lanes' receive rows, stage 3's prefetch buffers
    and persistent units: the estimate counts what the engine holds, category by
    category, and no more gathered-parameter elements than --max-live-numel."""
    argv = ["--data", corpus, "--stage", str(stage), "--bucket-numel", "96", "--overlap-comm"]
    parsed = parse_args([*argv, *flags], 1)
    model = GPT(SMALL_GPT)
    engine = make_engine(
        model, RandomInit(model, 0), parsed.zero, comm_for(MPI.COMM_SELF, parsed.zero)
    )
    est = estimate_for(parsed, model, 1)
    held = engine.memory.bytes_by_category()
    buffers = engine.buffer_bytes()
    engine.close()
    assert held == {k: getattr(est, k) for k in held}
    assert "bucket_staging (lane 1)" in buffers
    live = parsed.zero.overlap.max_live_numel
    if live is not None:
        gathered = sum(
            v for n, v in buffers.items() if n.startswith(("gathered_unit", "persistent"))
        )
        assert gathered <= live * engine.precision.bytes.param
