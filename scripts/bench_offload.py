"""The offloaded optimizer step against the disk and against the in-RAM step.

    mpirun -n 4 python scripts/bench_offload.py --numel 40000000 --nvme-path /tmp

Each rank builds a replay model of about --numel parameters (zero_ref/testing/replay.py)
at --stage with --precision, and times the optimizer step alone (after a forward and
backward that are not timed), the slowest rank each time, over --steps steps:

  offload   --offload-optimizer nvme: master/m/v stream through the buffer pool
  ram       the same step with the state in RAM: the compute alone
  disk      every rank at once writes its swap bytes sequentially in sub-group
            pieces (pwrite, fdatasync, page cache dropped) and reads them back
            cold: what moving the same bytes costs with no compute at all

and reports offload / max(disk, ram): 1.0 means the pipeline hides the cheaper of
the two completely behind the dearer (target <= 1.2), the bytes read and written
per step, and the resident peak (VmHWM) of the offloaded phase, which runs first.
JSON last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
from bench_common import emit, load_average, replay_model, step_inputs
from mpi4py import MPI

from zero_ref.comm.collectives import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine import make_engine
from zero_ref.models.unit import init_params


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def optimizer_steps(engine, model, a: argparse.Namespace, world: MPI.Comm) -> list[float]:
    """The slowest rank's optimizer-step seconds, per step (forward/backward untimed)."""
    times = []
    for step in range(a.steps):
        engine.comm.set_context(step=engine.step_count + 1)
        x, t = step_inputs(model, 0, step, world.rank, world.size)
        engine.forward_backward(x[0], t[0], 0)
        world.Barrier()
        t0 = time.perf_counter()
        engine.optimizer_step()
        mine = time.perf_counter() - t0
        engine.comm.ledger.end_step()
        times.append(world.allreduce(mine, op=MPI.MAX))
    return times


def run_mode(offload: bool, a: argparse.Namespace, world: MPI.Comm) -> dict:
    model = replay_model(a.numel, a.units)
    cfg = ZeroConfig(
        stage=a.stage,
        precision=a.precision,
        offload_optimizer="nvme" if offload else "none",
        nvme_path=a.nvme_path,
        sub_group_size=a.sub_group_size,
        buffer_count=a.buffer_count,
    )
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(world, cfg))
    times = optimizer_steps(engine, model, a, world)
    out = {"step_s": statistics.median(times[1:] or times), "steps_s": times}
    if offload:
        files = engine.nvme.files
        out["read_bytes_per_step"] = sum(f.bytes_read for f in files) // a.steps
        out["written_bytes_per_step"] = sum(f.bytes_written for f in files) // a.steps
        out["swap_bytes"] = sum(f.nbytes for f in files)
        out["pool_bytes"] = int(engine.memory.held["buffers"]["offload_pool"].nbytes)
        out["vm_hwm_bytes"] = status_kib("VmHWM") * 1024
    out["ledger_ram_bytes"] = sum(engine.memory.bytes_by_category().values())
    out["padded_numel"] = engine.layout.full_numel
    engine.close()
    return out


def disk_time(nbytes: int, a: argparse.Namespace, world: MPI.Comm) -> dict:
    """Every rank writes nbytes in sub-group pieces, syncs and drops them, then reads
    them back cold: the slowest rank's seconds for each."""
    path = Path(a.nvme_path) / f"zero_ref_bench_disk_r{world.rank}_p{os.getpid()}"
    piece = np.ones(min(a.sub_group_size, max(1, nbytes // 4)), np.float32)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        world.Barrier()
        t0 = time.perf_counter()
        for offset in range(0, nbytes, piece.nbytes):
            os.pwrite(fd, piece.data[: min(piece.nbytes, nbytes - offset)], offset)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
        write_s = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        world.Barrier()
        t0 = time.perf_counter()
        buf = bytearray(piece.nbytes)
        for offset in range(0, nbytes, piece.nbytes):
            os.preadv(fd, [memoryview(buf)[: min(piece.nbytes, nbytes - offset)]], offset)
        read_s = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"write_s": write_s, "read_s": read_s, "total_s": write_s + read_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=40_000_000, help="model parameters (about)")
    p.add_argument("--units", type=int, default=8)
    p.add_argument("--stage", type=int, default=3, choices=[1, 2, 3])
    p.add_argument("--precision", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--sub-group-size", type=int, default=1 << 20)
    p.add_argument("--buffer-count", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--nvme-path", default="/tmp")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    offload = run_mode(True, a, world)  # first: VmHWM then holds the offloaded phase only
    ram = run_mode(False, a, world)
    disk = disk_time(offload["swap_bytes"], a, world)
    peaks = world.gather(offload["vm_hwm_bytes"], root=0)
    if world.rank != 0:
        return
    bound = max(disk["total_s"], ram["step_s"])
    result = {
        "ranks": world.size,
        "stage": a.stage,
        "precision": a.precision,
        "padded_numel": ram["padded_numel"],
        "sub_group_size": a.sub_group_size,
        "buffer_count": a.buffer_count,
        "swap_bytes_per_rank": offload["swap_bytes"],
        "pool_bytes_per_rank": offload["pool_bytes"],
        "read_bytes_per_step_per_rank": offload["read_bytes_per_step"],
        "written_bytes_per_step_per_rank": offload["written_bytes_per_step"],
        "offload_step_s": offload["step_s"],
        "ram_step_s": ram["step_s"],
        "disk": disk,
        "offload_over_max_disk_ram": offload["step_s"] / bound,
        "target_le_1p2": offload["step_s"] / bound <= 1.2,
        "vm_hwm_bytes_offload_phase": peaks,
        "ledger_ram_bytes_offload": offload["ledger_ram_bytes"],
        "ledger_ram_bytes_ram": ram["ledger_ram_bytes"],
        "load_average": load_average(),
    }
    print(
        f"{world.size} ranks, stage {a.stage}, {a.precision}, {ram['padded_numel']:,} params; "
        f"per rank {offload['swap_bytes'] / 1e6:.1f} MB on disk, pool "
        f"{offload['pool_bytes'] / 1e6:.1f} MB\n"
        f"optimizer step: offload {offload['step_s']:.3f} s, in RAM {ram['step_s']:.3f} s, "
        f"disk alone {disk['total_s']:.3f} s (write {disk['write_s']:.3f}, read "
        f"{disk['read_s']:.3f}); offload / max(disk, RAM) = "
        f"{result['offload_over_max_disk_ram']:.2f}",
        flush=True,
    )
    emit(result)


if __name__ == "__main__":
    main()
