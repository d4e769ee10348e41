"""Stage-3 steps on the GPU bitwise the same steps on the CPU, and the device memory the
processes hold beside what the engine's ledger says it holds there (docs/gpu.md, "On a
machine with a GPU": scripts/tools/gpu_check.sh's gpu_vs_cpu phase).

    mpirun -n 4 python scripts/tools/gpu_step_check.py --steps 2 -- --stage 3 --precision bf16

Every rank runs zero_ref.train's own set-up and steps (zero_ref/train.py: set_up,
train_step) twice in one process, on `--device cpu` and on `--device gpu`, with the
train flags after `--` and --deterministic; then every parameter (all-gathered, the
float32 master weights) and each step's loss, gradient norm, skip and loss scale must be
bitwise equal. The parity the simulator shows in CI (tests/test_gpu_engine.py), on the
device: libdevice's _rn kernels and CuPy's model math against NumPy's.

Memory, after the GPU run's last step (before its engine is closed): the ledger's
device bytes (engine.memory.device_bytes_by_category, every rank's), numba's live
allocations (device and pinned host apart), CuPy's pool (used and held), and the
device's used memory by cudaMemGetInfo over the baseline taken once every rank had its
CUDA context: Sec. 3's model states are what the ledger counts; the rest of the
difference is the model's activations and workspaces (CuPy's pool), the kernels' code
and the libraries' handles. In the simulator (NUMBA_ENABLE_CUDASIM=1) the memory
figures are the ledger's alone and say "simulator". JSON last (rank 0).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.gpu.device import simulated
from zero_ref.testing.engine_state import full_parameters
from zero_ref.train import set_up, train_step

COMPARED = ("step", "loss", "lr", "grad_norm", "skipped", "loss_scale")


def run(device: str, flags: list[str], steps: int, comm, after_steps=None) -> tuple:
    """`steps` steps of zero_ref.train's run on `device`: (parameters, step records);
    after_steps(engine) runs before the engine is closed."""
    argv = [*flags, "--device", device, "--deterministic", "--steps", str(steps), "--quiet"]
    t = set_up(parse_args(argv, comm.Get_size(), comm.Get_rank()), comm)
    records = [{k: train_step(t, s)[k] for k in COMPARED} for s in range(1, steps + 1)]
    params = full_parameters(t.engine)
    extra = after_steps(t.engine) if after_steps else None
    t.engine.close()
    return params, records, extra


def device_used_bytes() -> int:
    """cudaMemGetInfo's used bytes: the whole device's, every process's."""
    from zero_ref.gpu.device import cupy  # import_module: the wheel is cupy-cuda12x/13x

    free, total = cupy().cuda.runtime.memGetInfo()
    return int(total - free)


def held_on_device(engine) -> dict:
    """This rank's view, after its last step: the ledger's device bytes, numba's live
    allocations by kind, CuPy's pool."""
    ledger = {k: v for k, v in engine.memory.device_bytes_by_category().items() if v}
    mine = {"ledger_device_bytes": sum(ledger.values()), "ledger_by_category": ledger}
    if simulated():
        return mine
    from numba import cuda

    from zero_ref.gpu.device import cupy  # import_module: the wheel is cupy-cuda12x/13x

    numba_bytes: dict[str, int] = {}
    for mem in cuda.current_context().memory_manager.allocations.values():
        kind = type(mem).__name__  # device pointers and pinned host buffers alike
        numba_bytes[kind] = numba_bytes.get(kind, 0) + int(mem.size)
    pool = cupy().get_default_memory_pool()
    return mine | {
        "numba_allocations_bytes": numba_bytes,
        "cupy_pool_used_bytes": int(pool.used_bytes()),
        "cupy_pool_held_bytes": int(pool.total_bytes()),
    }


def memory_report(ranks: list[dict], baseline: int | None, after: int | None) -> dict:
    """Every rank's figures and their sums, beside the device's growth."""
    report: dict = {"ranks": ranks}
    report["ledger_device_bytes"] = sum(r["ledger_device_bytes"] for r in ranks)
    if baseline is None:
        return report | {"simulator": True}
    host_kinds = ("MappedMemory", "PinnedMemory")  # numba's pinned host buffers
    numba_device = sum(
        b
        for r in ranks
        for kind, b in r["numba_allocations_bytes"].items()
        if kind not in host_kinds
    )
    report |= {
        "numba_device_allocations_bytes": numba_device,
        "cupy_pool_held_bytes": sum(r["cupy_pool_held_bytes"] for r in ranks),
        "device_used_growth_bytes": after - baseline,
    }
    report["ledger_within_numba_allocations"] = report["ledger_device_bytes"] <= numba_device
    return report


def bits(params: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {name: np.ascontiguousarray(a).tobytes() for name, a in params.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then zero_ref.train's flags")
    a = p.parse_args()
    flags = a.flags[1:] if a.flags[:1] == ["--"] else a.flags
    comm = MPI.COMM_WORLD
    baseline = None
    if not simulated():
        device_used_bytes()  # this rank's CUDA context first: the baseline includes it
        comm.Barrier()
        baseline = device_used_bytes()
    cpu_params, cpu_steps, _ = run("cpu", flags, a.steps, comm)
    seen: dict = {}

    def measure(engine):
        comm.Barrier()  # every rank's last step done
        seen["after"] = None if simulated() else device_used_bytes()
        return held_on_device(engine)

    gpu_params, gpu_steps, mine = run("gpu", flags, a.steps, comm, measure)
    ranks = comm.gather(mine, root=0)
    if comm.Get_rank() != 0:
        return 0
    cpu_bits, gpu_bits = bits(cpu_params), bits(gpu_params)
    differ = sorted(n for n in cpu_bits if cpu_bits[n] != gpu_bits.get(n))
    result = {
        "simulator": simulated(),
        "world_size": comm.Get_size(),
        "flags": " ".join(flags),
        "steps": a.steps,
        "numel": int(sum(v.size for v in cpu_params.values())),
        "params_bitwise": not differ and cpu_bits.keys() == gpu_bits.keys(),
        "params_differing": differ[:10],
        "steps_equal": repr(cpu_steps) == repr(gpu_steps),
        "cpu_steps": cpu_steps,
        "gpu_steps": gpu_steps,
        "memory": memory_report(ranks, baseline, seen.get("after")),
    }
    result["bitwise"] = result["params_bitwise"] and result["steps_equal"]
    print(json.dumps(result), flush=True)
    return 0 if result["bitwise"] else 1


if __name__ == "__main__":
    sys.exit(main())
