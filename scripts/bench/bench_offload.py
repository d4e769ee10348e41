"""The offloaded optimizer step against the disk and against the in-RAM step.

    mpirun -n 4 python scripts/bench/bench_offload.py --numel 40000000 --nvme-path /tmp

Each rank builds a replay model of about --numel parameters (zero_ref/testing/replay.py)
at --stage with --precision, and times the optimizer step alone (the gradient shard
filled once with seeded values; no forward or backward), the slowest rank each time,
over --steps steps:

  offload   --offload-optimizer nvme: master/m/v stream through the buffer pool
  ram       the same step with the state in RAM: the compute alone
  disk      every rank at once moves its swap bytes with no compute, three ways:
            write in sub-group pieces then read back cold, through the page
            cache (pwrite, fdatasync, pages dropped) and with O_DIRECT (as dd
            oflag=direct iflag=direct); and read one file while writing
            another, O_DIRECT. The fastest of the three is the disk's time.

and reports offload / max(disk, ram): 1.0 means the pipeline hides the cheaper of
the two completely behind the dearer (target <= 1.2; below 1.0 only if the disk
moves bytes faster inside the pipeline than in any of the three ways), the bytes
read and written per step, and the resident peak (VmHWM) of the offloaded phase,
which runs first. JSON last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

from scripts.bench.bench_common import add_record_flag, emit, load_average, replay_model
from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OffloadConfig, ZeroConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.io.trace import Trace
from zero_ref.offload.pipeline import SWAP_LANES


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def optimizer_steps(engine, a: argparse.Namespace, world: MPI.Comm) -> list[float]:
    """The slowest rank's optimizer-step seconds, per step. The gradient shard is filled
    once with seeded values (no forward or backward: their memory would hide the
    step's in the resident peak); each step then reduces the norm and updates."""
    rng = np.random.default_rng(world.rank)
    for _, grads, *_ in engine.owned_slices():  # this rank's reduced gradient
        for lo in range(0, grads.size, 1 << 20):
            piece = grads[lo : lo + (1 << 20)]
            piece[...] = rng.standard_normal(piece.size) * 1e-3
    times = []
    for _ in range(a.steps):
        engine.comm.set_context(step=engine.step_count + 1)
        world.Barrier()
        t0 = time.perf_counter()
        engine.optimizer_step()
        mine = time.perf_counter() - t0
        engine.comm.ledger.end_step()
        times.append(world.allreduce(mine, op=MPI.MAX))
    return times


def run_mode(offload: bool, a: argparse.Namespace, world: MPI.Comm) -> dict:
    model = replay_model(a.numel, a.units)
    offload_cfg = OffloadConfig(
        optimizer="nvme" if offload else "none",
        nvme_path=a.nvme_path,
        sub_group_size=a.sub_group_size,
        buffer_count=a.buffer_count,
    )
    cfg = ZeroConfig(
        stage=a.stage,
        bucket_numel=1 << 20,  # what docs/offload.md's runs used
        mixed_precision=MixedPrecisionConfig(dtype=a.precision),
        offload=offload_cfg,
    )
    engine = make_engine(model, RandomInit(model, 0), cfg, comm_for(world, cfg))  # unit by unit
    if offload and a.timeline:
        engine.offloaded.trace = Trace(world.rank)  # the reads, updates and writes, timed
    times = optimizer_steps(engine, a, world)
    out = {"step_s": statistics.median(times[1:] or times), "steps_s": times}
    if offload:
        files = engine.nvme.files
        out["read_bytes_per_step"] = sum(f.bytes_read for f in files) // a.steps
        out["written_bytes_per_step"] = sum(f.bytes_written for f in files) // a.steps
        out["swap_bytes"] = sum(f.nbytes for f in files)
        out["pool_bytes"] = int(engine.memory.held["buffers"]["offload_pool"].nbytes)
        out["pool_rows"] = int(engine.offloaded.pool.shape[1])  # (sets, rows, row numel)
        out["vm_hwm_bytes"] = status_kib("VmHWM") * 1024
        out["timeline"] = swap_timeline(engine.offloaded.trace)
    out["ledger_ram_bytes"] = sum(engine.memory.bytes_by_category().values())
    out["padded_numel"] = engine.layout.full_numel
    engine.close()
    return out


def swap_timeline(trace: Trace | None) -> list[tuple[str, int, float, float, str]] | None:
    """The pipeline's events as (read/update/write, sub-group, start s, end s, the thread
    that ran it), in the order they ended (the I/O threads record as they finish)."""
    if trace is None:
        return None
    what = {lane: kind for kind, lane in SWAP_LANES.items()}
    return [
        (
            what[e["cat"]],
            e["args"]["sub_group"],
            e["ts"] / 1e6,
            (e["ts"] + e["dur"]) / 1e6,
            e["args"]["thread"],
        )
        for e in trace.events
        if e.get("cat") in what and "sub_group" in e.get("args", {})
    ]


def aligned_ones(nbytes: int) -> np.ndarray:
    """nbytes of float32 ones at a 4096-byte-aligned address (O_DIRECT's rule)."""
    raw = np.ones(nbytes // 4 + 1024, np.float32)
    skip = (-raw.__array_interface__["data"][0]) % 4096 // 4
    return raw[skip : skip + nbytes // 4]


def move(fd: int, piece: np.ndarray, nbytes: int, call, part: int = 0, parts: int = 1) -> None:
    """Write or read nbytes of the file in piece-sized pieces, in order: every `parts`-th
    piece from piece `part` on (several threads share the file that way)."""
    buf = memoryview(piece.view(np.uint8))
    for offset in range(part * piece.nbytes, nbytes, parts * piece.nbytes):
        call(fd, [buf[: min(piece.nbytes, nbytes - offset)]], offset)


def disk_time(nbytes: int, a: argparse.Namespace, world: MPI.Comm, direct: bool) -> dict:
    """Every rank moves its swap bytes with no compute, the slowest rank's seconds:
    writes them in sub-group pieces and reads them back cold, one after the other (as
    dd would), through the page cache (pwrite, fdatasync, pages dropped) or around it
    (O_DIRECT, dd oflag=direct iflag=direct); and, O_DIRECT, reads one file while
    writing another at the same time (what the pipeline asks of the disk)."""
    stem = Path(a.nvme_path) / f"zero_ref_bench_disk_r{world.rank}_p{os.getpid()}"
    piece = aligned_ones(min(a.sub_group_size * 4, nbytes) // 4096 * 4096 or 4096)
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    nbytes = nbytes // 4096 * 4096 if direct else nbytes
    fds = [os.open(f"{stem}.{i}", flags, 0o600) for i in range(2)]

    def timed(fn) -> float:
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    def write_synced(fd: int) -> None:
        move(fd, piece, nbytes, os.pwritev)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)

    def both(depth: int) -> None:
        """`depth` threads read fds[0] while `depth` others write fds[1]."""
        with ThreadPoolExecutor(2 * depth) as pool:
            done = [
                pool.submit(move, fds[j], aligned_ones(piece.nbytes), nbytes, call, i, depth)
                for i in range(depth)
                for j, call in ((0, os.preadv), (1, os.pwritev))
            ]
            for future in done:
                future.result()
        os.fdatasync(fds[1])

    try:
        out = {"write_s": timed(lambda: write_synced(fds[0]))}
        out["read_s"] = timed(lambda: move(fds[0], piece, nbytes, os.preadv))
        out["total_s"] = out["write_s"] + out["read_s"]
        if direct:
            out["read_while_writing_s"] = timed(lambda: both(1))
            out["read_while_writing_2_threads_each_s"] = timed(lambda: both(2))
    finally:
        for i, fd in enumerate(fds):
            os.close(fd)
            Path(f"{stem}.{i}").unlink(missing_ok=True)
    return out


COLORS = {"read": "tab:blue", "update": "tab:orange", "write": "tab:green"}


def thread_lanes(events: list) -> dict[str, str]:
    """Thread name -> its lane's label, top to bottom: the main thread (the AdamW
    updates), then each I/O thread of the pipeline's pool, which runs reads and
    writes alike (zero_ref/offload/pipeline.py: one ThreadPoolExecutor of two)."""
    main = sorted({t for what, *_, t in events if what == "update"})
    io = sorted({t for what, *_, t in events if what != "update"})
    lanes = {t: "AdamW (main thread)" for t in main}
    lanes.update({t: f"I/O thread {k + 1}: reads, writes" for k, t in enumerate(io)})
    return lanes


def draw_timeline(events: list, a: argparse.Namespace, out: Path) -> None:
    """Rank 0's last step: one lane per thread that ran it, a bar per sub-group's read,
    update or write (colored by which), so the overlap (or the waiting) is visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = max(i for _, i, *_ in events) + 1
    last = events[-3 * groups :]  # the last step: a read, an update, a write per sub-group
    t0 = min(start for _, _, start, _, _ in last)
    lanes = thread_lanes(last)
    rows = {t: len(lanes) - 1 - k for k, t in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for what, i, start, end, thread in last:
        span = (rows[thread] - 0.4, 0.8)
        ax.broken_barh([(start - t0, end - start)], span, color=COLORS[what])
        if groups <= 40:
            ax.text((start + end) / 2 - t0, rows[thread], str(i), ha="center", va="center", size=6)
    ax.set_yticks(list(rows.values()), list(lanes.values()))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, ["read", "AdamW update", "write"], loc="upper right", fontsize=7, ncol=3)
    ax.set_ylim(-0.6, len(rows) - 0.4 + 0.5)  # room for the legend above the top lane
    ax.set_xlabel("seconds into the optimizer step (rank 0)")
    io = sum(1 for label in lanes.values() if label.startswith("I/O"))
    ax.set_title(
        f"offloaded optimizer step: {groups} sub-groups of {a.sub_group_size:,} elements, "
        f"{a.buffer_count} buffer sets, {io} I/O threads ({a.precision}, stage {a.stage})",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


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
    p.add_argument("--timeline", type=Path, help="draw rank 0's last offloaded step here")
    add_record_flag(p, "bench_offload")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    baseline = status_kib("VmHWM") * 1024  # imports and MPI, before any engine
    offload = run_mode(True, a, world)  # first: VmHWM then holds the offloaded phase only
    if world.rank == 0 and a.timeline:
        draw_timeline(offload["timeline"], a, a.timeline)
    ram = run_mode(False, a, world)
    buffered = disk_time(offload["swap_bytes"], a, world, direct=False)
    direct = disk_time(offload["swap_bytes"], a, world, direct=True)
    disk_s = min(
        buffered["total_s"],
        direct["total_s"],
        direct["read_while_writing_s"],
        direct["read_while_writing_2_threads_each_s"],
    )
    peaks = world.gather(offload["vm_hwm_bytes"] - baseline, root=0)
    if world.rank != 0:
        return
    bound = max(disk_s, ram["step_s"])
    result = {
        "ranks": world.size,
        "stage": a.stage,
        "precision": a.precision,
        "padded_numel": ram["padded_numel"],
        "sub_group_size": a.sub_group_size,
        "buffer_count": a.buffer_count,
        "swap_bytes_per_rank": offload["swap_bytes"],
        "pool_bytes_per_rank": offload["pool_bytes"],
        "pool_rows": offload["pool_rows"],  # master, m, v, and the gradient when on disk
        "read_bytes_per_step_per_rank": offload["read_bytes_per_step"],
        "written_bytes_per_step_per_rank": offload["written_bytes_per_step"],
        "offload_step_s": offload["step_s"],
        "ram_step_s": ram["step_s"],
        "disk_s": disk_s,
        "disk_buffered": buffered,
        "disk_direct": direct,
        "offload_over_max_disk_ram": offload["step_s"] / bound,
        "target_le_1p2": offload["step_s"] / bound <= 1.2,
        "offload_over_max_sequential_disk_ram": offload["step_s"]
        / max(min(buffered["total_s"], direct["total_s"]), ram["step_s"]),
        "peak_rss_above_baseline_offload_phase": peaks,
        "ledger_ram_bytes_offload": offload["ledger_ram_bytes"],
        "ledger_ram_bytes_ram": ram["ledger_ram_bytes"],
        "load_average": load_average(),
    }
    print(
        f"{world.size} ranks, stage {a.stage}, {a.precision}, {ram['padded_numel']:,} params; "
        f"per rank {offload['swap_bytes'] / 1e6:.1f} MB on disk, pool "
        f"{offload['pool_bytes'] / 1e6:.1f} MB\n"
        f"optimizer step: offload {offload['step_s']:.3f} s, in RAM {ram['step_s']:.3f} s, "
        f"disk alone {disk_s:.3f} s (fastest of: write then read {buffered['total_s']:.3f} "
        f"through the page cache, {direct['total_s']:.3f} O_DIRECT; read while writing "
        f"{direct['read_while_writing_s']:.3f} O_DIRECT); offload / max(disk, RAM) = "
        f"{result['offload_over_max_disk_ram']:.2f}",
        flush=True,
    )
    emit(result, a.record, world.size)


if __name__ == "__main__":
    main()
