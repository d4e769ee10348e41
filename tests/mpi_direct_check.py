"""The CUDA-aware path on any world size: run with mpirun (tests/test_gpu_staging.py).

A --device gpu engine whose Comm hands the device arrays to MPI itself (as with a
CUDA-aware MPI: the library's answer is replaced by "yes"), on arrays as strict as
CuPy's (zero_ref/testing/emulated_device.py; MPI reads them as the host memory they
are here), must give the CPU engine's parameters bit for bit at every stage, in fp32,
bf16 and fp16 (CASES), with the same network bytes and no host<->device copy at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_checks import run_checks  # noqa: E402  (beside this script, which runs by path)

from zero_ref.comm.choose import comm_for  # noqa: E402
from zero_ref.config import MixedPrecisionConfig, ZeroConfig  # noqa: E402
from zero_ref.engine.ladder import make_engine  # noqa: E402
from zero_ref.gpu import device, mpi_support  # noqa: E402
from zero_ref.models.unit import init_params  # noqa: E402
from zero_ref.testing.emulated_device import DeviceArray, to_device  # noqa: E402
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel  # noqa: E402

UNITS = [("u0", [("w", (6, 7)), ("s", ())]), ("u1", [("b", (11,)), ("c", (0,))])]
COPIES = ("device_to_host", "host_to_device")
CASES = [(0, "fp32"), (1, "fp16"), (2, "bf16"), (3, "bf16"), (3, "fp16")]  # the simulator is slow


def train(world: MPI.Comm, precision: str, **cfg) -> tuple[np.ndarray, list, object]:
    model = ReplayModel(UNITS)
    mixed = MixedPrecisionConfig(dtype=precision)
    config = ZeroConfig(deterministic=True, grad_accum=2, clip=0.5, mixed_precision=mixed, **cfg)
    engine = make_engine(model, init_params(model, 0), config, comm_for(world.Dup(), config))
    results = []
    for step in range(2):
        inputs = model.contexts(1, step, 2, world.size)[:, world.rank]
        results.append(engine.train_step(inputs, np.zeros((2, 1))))
    flat = np.concatenate([np.asarray(v).ravel() for v in full_parameters(engine).values()])
    return flat, results, engine


def checks() -> list[str]:
    mpi_support.library_says_cuda_aware = lambda library=None: True
    device.as_array = lambda array: to_device(np.asarray(array))
    failures, world = [], MPI.COMM_WORLD
    for stage, precision in CASES:
        tag = f"stage {stage} {precision}"
        cpu, cpu_steps, a = train(world, stage=stage, precision=precision)
        gpu, gpu_steps, b = train(
            world, stage=stage, precision=precision, device="gpu", cuda_aware_mpi="yes"
        )
        if "directly" not in b.comm.path or type(b.owned_slices()[0][0]) is not DeviceArray:
            failures.append(f"{tag}: not the direct path on device arrays: {b.comm.path}")
        if not np.array_equal(cpu.view(np.uint8), gpu.view(np.uint8)):
            failures.append(f"{tag}: parameters differ from the CPU run's")
        if repr(cpu_steps) != repr(gpu_steps):
            failures.append(f"{tag}: steps {gpu_steps} vs the CPU run's {cpu_steps}")
        net = {k: v["sent_bytes"] for k, v in a.comm.ledger.last_step().items()}
        last = b.comm.ledger.last_step()
        if {k: v["sent_bytes"] for k, v in last.items()} != net or set(COPIES) & set(last):
            failures.append(f"{tag}: ledger {last} vs the CPU run's {net}, no copies")
    return failures


if __name__ == "__main__":
    run_checks(MPI.COMM_WORLD, checks)
