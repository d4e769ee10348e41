"""--device gpu (numba-cuda's simulator): the engine's arrays on the device, its update
phase as CUDA kernels, its collectives staged through host buffers; deterministic runs
bitwise the single-rank oracle and the CPU run, with the ledger's copies counted apart."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from tests.test_parity import (
    BF16_FP32_ACCUM,
    FP16_OVERFLOWING,
    TINY_UNITS,
    check_bitwise,
    check_memory,
    pinned,
    run,
)
from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OffloadConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.gpu.device import DeviceSetupError, simulated
from zero_ref.models.unit import init_params
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not simulated(), reason="--device gpu runs in the simulator only"),
]
BF16 = {"precision": "bf16"}
SMALL = [("u0", [("w", (6, 7)), ("s", ())]), ("u1", [("b", (11,)), ("c", (0,))])]


def train(device: str, steps: int = 2, precision: str = "fp32", offload: str = "none", **cfg):
    """`offload`: where the optimizer state lives (OffloadConfig.optimizer)."""
    model = ReplayModel(SMALL)
    mixed, where = MixedPrecisionConfig(dtype=precision), OffloadConfig(optimizer=offload)
    config = ZeroConfig(
        deterministic=True, device=device, grad_accum=2, clip=0.5,
        mixed_precision=mixed, offload=where, **cfg,
    )  # fmt: skip
    engine = make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))
    results = [
        engine.train_step(model.contexts(1, step, 2, 1)[:, 0], np.zeros((2, 1)))
        for step in range(steps)
    ]
    flat = np.concatenate([v.ravel() for v in full_parameters(engine).values()])
    return flat, results, engine


def check_gpu_ledger(cpu, gpu) -> None:
    """In RAM: exactly the host staging buffers (pinned on a GPU). On the device: what
    the CPU run holds in RAM, plus the update's float32 scratch."""
    staging = gpu.comm.staging.held_bytes()
    assert staging > 0 and gpu.memory.bytes_by_category() == {
        **dict.fromkeys(cpu.memory.held, 0),
        "buffers": staging,
    }
    scratch = sum(piece.nbytes for piece in gpu.compute.scratch.values())
    expected = cpu.memory.bytes_by_category()
    expected["buffers"] += scratch
    assert scratch > 0 and gpu.memory.device_bytes_by_category() == expected


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_gpu_run_is_bitwise_the_cpu_run(stage, precision):
    cpu, cpu_steps, a = train("cpu", stage=stage, precision=precision)
    gpu, gpu_steps, b = train("gpu", stage=stage, precision=precision)
    assert np.array_equal(cpu.view(np.uint8), gpu.view(np.uint8))
    assert repr(cpu_steps) == repr(gpu_steps)  # losses, norms (nan too), skips, loss scales
    check_gpu_ledger(a, b)
    last = b.comm.ledger.last_step()
    assert last["device_to_host"]["copied_bytes"] > 0 and last["host_to_device"]["copied_bytes"] > 0
    network = {k: v["sent_bytes"] for k, v in a.comm.ledger.last_step().items()}
    assert {k: v["sent_bytes"] for k, v in last.items() if k in network} == network


@pytest.mark.parametrize(
    "drawn",
    [
        pinned(TINY_UNITS, stage=0, world=3, device="gpu"),
        pinned(TINY_UNITS, stage=1, world=2, device="gpu", precision=FP16_OVERFLOWING),
        pinned(TINY_UNITS, stage=2, world=3, device="gpu", precision=BF16_FP32_ACCUM),
        pinned(TINY_UNITS, stage=3, world=4, device="gpu", bucket_numel=5),
        # --overlap-comm through the staged path: a host buffer pair per lane
        pinned(TINY_UNITS, stage=2, world=3, device="gpu", overlap={"comm": True}),
        pinned(
            TINY_UNITS,
            stage=3,
            world=2,
            device="gpu",
            precision=BF16_FP32_ACCUM,
            overlap={"comm": True, "prefetch_numel": 1 << 20},
        ),  # fmt: skip
        pinned(
            TINY_UNITS,
            stage=1,
            world=3,
            device="gpu",
            precision=FP16_OVERFLOWING,
            overlap={"comm": True},
        ),  # fmt: skip
    ],
    ids=[
        "stage0-w3",
        "stage1-w2-fp16",
        "stage2-w3-bf16",
        "stage3-w4",
        "stage2-w3-overlap",
        "stage3-w2-bf16-prefetch",
        "stage1-w3-fp16-overlap",
    ],  # fmt: skip
)
def test_gpu_runs_on_several_ranks_are_bitwise_the_oracle(mpi_pools, drawn):
    result = run(mpi_pools, drawn)
    check_bitwise(result)
    check_memory(result, drawn["world"])
    for held, on_device in zip(result["memory"], result["device_memory"], strict=True):
        formula = result["formula"]
        assert {c: on_device[c] for c in formula} == formula
        assert held["buffers"] > 0 and not any(held[c] for c in formula)  # staging only


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_zero_offload_is_bitwise_the_cpu_run_and_moves_4_psi_over_n(stage, precision):
    """--offload-optimizer cpu: the fp32 state in RAM, the 16-bit params and grads on the
    device; each step's gradient shard down and parameter shard up, counted apart."""
    cpu, cpu_steps, a = train("cpu", steps=3, stage=stage, precision=precision)
    gpu, gpu_steps, b = train("gpu", steps=3, stage=stage, precision=precision, offload="cpu")
    assert np.array_equal(cpu.view(np.uint8), gpu.view(np.uint8))
    assert repr(cpu_steps) == repr(gpu_steps)
    in_ram, on_device = b.memory.bytes_by_category(), b.memory.device_bytes_by_category()
    assert in_ram["optimizer"] == a.memory.bytes_by_category()["optimizer"]
    assert (
        on_device["optimizer"] == 0
        and on_device["params"] == a.memory.bytes_by_category()["params"]
    )
    shard_bytes = sum(p.nbytes for p, *_ in b.owned_slices())  # 16-bit: 2 Psi / N
    last, skipped = b.comm.ledger.last_step(), gpu_steps[-1].skipped
    assert last["offload_grads_to_host"]["copied_bytes"] == shard_bytes
    up = last.get("offload_params_to_device", {}).get("copied_bytes", 0)
    assert up == (0 if skipped else shard_bytes)


def test_zero_offload_on_several_ranks_is_bitwise_the_oracle(mpi_pools):
    drawn = pinned(TINY_UNITS, stage=2, world=3, device="gpu", offload="cpu", precision=BF16)
    result = run(mpi_pools, drawn)
    check_bitwise(result)
    check_memory(result, drawn["world"])


def test_without_a_gpu_the_error_says_what_is_missing(monkeypatch):
    import numba

    from zero_ref.gpu.device import check_usable

    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 0)
    with pytest.raises(DeviceSetupError, match=r"no usable CUDA GPU|needs CuPy"):
        check_usable()


def test_gpu_with_nvme_offload_is_refused_by_name():
    with pytest.raises(ValueError, match="device='gpu' is not allowed"):
        ZeroConfig(stage=3, device="gpu", offload=OffloadConfig(optimizer="nvme", nvme_path="/tmp"))


def test_forcing_cuda_aware_mpi_on_the_pypi_mpich_is_one_message_and_exit_2():
    """Bad input found before training: one line from rank 0, exit 2, no traceback."""
    from tests.mpi_pool import mpirun_command, run_watched

    job = run_watched(
        mpirun_command(
            2, "-m", "zero_ref.train", "--model", "mlp", "--steps", "1",
            "--device", "gpu", "--cuda-aware-mpi", "yes",
        )
    )  # fmt: skip
    assert job.returncode == 2, job.stderr[-2000:]
    assert job.stderr.count("says it is not CUDA-aware") == 1, job.stderr[-2000:]
    assert "Traceback" not in job.stderr


def test_the_config_file_names_the_device():
    from zero_ref.app.ds_config import ConfigError, parse_config

    parsed = parse_config({"device": "gpu", "cuda_aware_mpi": "no"})
    assert parsed.settings["device"] == "gpu" and parsed.settings["cuda_aware_mpi"] == "no"
    with pytest.raises(ConfigError, match="allowed are cpu, gpu"):
        parse_config({"device": "tpu"})
    offload = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert parse_config({"device": "gpu", **offload}).settings["offload_optimizer"] == "cpu"
    # on the CPU path too: then the same error as the flag (tests/test_bad_input.py)
    assert parse_config(offload).settings["offload_optimizer"] == "cpu"


class CudaAPIError(Exception):
    """Stands in for numba's error type on a real GPU (the simulator never runs out)."""


def out_of_memory_after(monkeypatch, calls: int) -> None:
    """numba.cuda.device_array fails as a full GPU does, from call `calls` on."""
    from numba import cuda

    real, count = cuda.device_array, [0]

    def device_array(*args, **kwargs):
        count[0] += 1
        if count[0] >= calls:
            raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")
        return real(*args, **kwargs)

    monkeypatch.setattr(cuda, "device_array", device_array)


def test_out_of_gpu_memory_names_the_rank_the_step_and_the_array(monkeypatch):
    from zero_ref.gpu.device import DeviceOutOfMemory

    out_of_memory_after(monkeypatch, 3)
    with pytest.raises(DeviceOutOfMemory, match=r"rank 0, set-up .*allocating \w+ array \w+"):
        train("gpu", stage=2, precision="bf16")
    monkeypatch.undo()
    model = ReplayModel(SMALL)
    config = ZeroConfig(deterministic=True, device="gpu", stage=2)
    engine = make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))
    out_of_memory_after(monkeypatch, 1)  # the update's scratch, in step 1
    with pytest.raises(DeviceOutOfMemory, match=r"rank 0, step 1: .*gradient scratch \(\d+ bytes"):
        engine.train_step(model.contexts(1, 0, 1, 1)[:, 0], np.zeros((1, 1)))


@pytest.fixture
def emulated_cupy(monkeypatch):
    """The engine's device arrays seen as CuPy would show them on a GPU: arrays of
    another module that refuse host arrays, Numba CPU kernels and bfloat16
    (zero_ref/testing/emulated_device.py), instead of the simulator's NumPy views."""
    from zero_ref.gpu import device
    from zero_ref.testing.emulated_device import to_device

    monkeypatch.setattr(device, "as_array", lambda array: to_device(np.asarray(array)))


@pytest.mark.parametrize(
    ("stage", "precision", "offload"),
    [(0, "fp32", "none"), (1, "bf16", "none"), (2, "fp16", "none"), (3, "bf16", "none")]
    + [(3, "fp16", "none"), (1, "bf16", "cpu"), (3, "fp16", "cpu")],  # every stage and mode
)
def test_on_cupy_like_arrays_a_gpu_run_is_still_bitwise_the_cpu_run(
    emulated_cupy, stage, precision, offload
):
    """What a real GPU changes for the engine: CuPy arrays, bf16 held as uint16 bits and
    converted only by the CUDA kernels, host data copied in and out explicitly."""
    from zero_ref.testing.emulated_device import DeviceArray

    cpu, cpu_steps, _ = train("cpu", stage=stage, precision=precision)
    gpu, gpu_steps, b = train("gpu", stage=stage, precision=precision, offload=offload)
    assert type(b.owned_slices()[0][0]) is DeviceArray  # the emulation was in force
    if precision == "bf16":
        assert b.owned_slices()[0][0].dtype == np.uint16  # bf16's bits, as on a GPU
    assert np.array_equal(cpu.view(np.uint8), np.asarray(gpu).view(np.uint8))
    assert repr(cpu_steps) == repr(gpu_steps)


def test_the_gpt_trains_on_cupy_like_arrays(emulated_cupy):
    """The model's math in the device's module (its NumPy twins, as CuPy would run them)
    inside a stage 3 bf16 engine: losses those of the CPU run to float32 rounding."""
    from zero_ref.models.gpt import GPT, GPTConfig

    def losses(device: str) -> list[float]:
        model = GPT(GPTConfig(vocab_size=11, context=4, n_layer=1, n_head=2, d_model=8))
        cfg = ZeroConfig(
            deterministic=True,
            device=device,
            stage=3,
            mixed_precision=MixedPrecisionConfig(dtype="bf16"),
        )
        engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
        rng = np.random.default_rng(0)
        out = []
        for _ in range(3):
            ids = rng.integers(0, 11, (1, 2, 4))
            out.append(engine.train_step(ids, np.roll(ids, -1, axis=-1)).loss)
        return out

    np.testing.assert_allclose(losses("gpu"), losses("cpu"), rtol=1e-5)


def test_the_command_line_run_on_cupy_like_arrays_is_bitwise_its_oracle(
    emulated_cupy, tmp_path, monkeypatch
):
    """python -m zero_ref.train --device gpu end to end on CuPy-like arrays: the oracle
    runs the model's math in the device's module too, so --check-oracle is bitwise;
    checkpoint and export read the device arrays back, a resume writes them."""
    from zero_ref.train import main

    monkeypatch.chdir(tmp_path)
    args = "--device gpu --stage 3 --precision bf16 --model mlp --d-embed 2 --d-hidden 4"
    args += " --steps 1 --batch-size 2 --context 2 --deterministic --check-oracle --quiet"
    args += " --sample-chars 0"
    args += " --save-dir ck --save-every 1 --export out.safetensors"
    assert main(args.split()) == 0
    assert (tmp_path / "out.safetensors").stat().st_size > 0
    assert any((tmp_path / "ck").glob("step_*"))
    resumed = args.replace("--steps 1", "--steps 2").replace("--save-every 1", "--resume ck")
    assert main(resumed.split()) == 0  # the checkpoint's bytes copied into device arrays


@pytest.mark.parametrize("stage", [0, 3])
def test_what_host_code_reads_of_a_gpu_run_is_host_memory(emulated_cupy, stage):
    """Checkpoints, export, the oracle and sampling are host code: every array the engine
    hands them is a NumPy array (on a GPU, CuPy refuses np.asarray of its arrays)."""
    from zero_ref.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, context=4, n_layer=1, n_head=2, d_model=8))
    cfg = ZeroConfig(
        deterministic=True,
        device="gpu",
        stage=stage,
        mixed_precision=MixedPrecisionConfig(dtype="bf16"),
    )
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
    ids = np.random.default_rng(0).integers(0, 11, (1, 2, 4))
    engine.train_step(ids, np.roll(ids, -1, axis=-1))
    seen = []
    engine.stream_state(("param", "exp_avg"), lambda kind, unit, flat: seen.append(flat))
    unit = engine.layout.units[0]
    seen += [engine.owned_state("param", unit), *full_parameters(engine).values()]
    seen.append(engine.forward(ids[0]))  # logits computed on the device
    assert seen and {type(a) for a in seen} == {np.ndarray}
