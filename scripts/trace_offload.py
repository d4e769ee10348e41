"""A --trace of an offloaded run, with the swap files' reads and writes in it.

    mkdir -p /tmp/nvme
    mpirun -n 4 python scripts/trace_offload.py --out runs/trace_offload.json -- \\
        --stage 3 --precision bf16 --offload-optimizer nvme --offload-param nvme \\
        --nvme-path /tmp/nvme --sub-group-size 8192 --steps 3

`python -m zero_ref.train --trace FILE` records units, collectives and the optimizer
step, but not what happens inside the offloaded optimizer step
(zero_ref/offload/pipeline.py): two I/O threads read each sub-group of master, m
and v from the swap files ahead of the AdamW kernel and write it back behind it.
The pipeline keeps its own timeline of those (`OffloadedUpdate.trace()`, on the
perf_counter clock the trace uses too). This script trains as the trainer does,
from the same flags (everything after `--`: zero_ref.train.prepare builds the
task, make_engine the engine), records both and writes one trace file: the
trainer's lanes plus "swap reads", "adamw sub-groups" and "swap writes", each
read and write with its bytes. scripts/plot_trace.py draws it. Last, rank 0
prints one JSON line: its memory ledger in RAM and on disk by category, and the
bytes its swap files moved per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.app.threads import settle_thread_budget
from zero_ref.comm.collectives import comm_for, ranks_sharing_this_host
from zero_ref.engine import make_engine
from zero_ref.io.trace import LANES, Trace, write_trace
from zero_ref.offload.pipeline import plan_sub_groups
from zero_ref.train import prepare

SWAP_LANES = {"read": "swap reads", "update": "adamw sub-groups", "write": "swap writes"}


def swap_events(engine, trace: Trace) -> list[dict]:
    """The pipeline's timeline as trace events: a lane (thread) per kind, each read and
    write with the bytes it moved (float32 master, m, v: those in swap files)."""
    owned = engine.owned_slices()
    groups = plan_sub_groups([o[1].size for o in owned], engine.offloaded.sub_group)
    swapped = [sum(engine.nvme.locate(a) is not None for a in o[2:]) for o in owned]
    tids = {lane: len(LANES) + i for i, lane in enumerate(SWAP_LANES.values())}
    events = [
        {"name": "thread_name", "ph": "M", "pid": trace.rank, "tid": tid, "args": {"name": lane}}
        for lane, tid in tids.items()
    ]
    for what, i, start, end in engine.offloaded.timeline:
        g, lane = groups[i], SWAP_LANES[what]
        args = {"sub_group": i}
        if what != "update":
            args["bytes"] = 4 * (g.hi - g.lo) * swapped[g.index]
        event = {"name": f"{what} {i}", "cat": lane, "ph": "X", "pid": trace.rank}
        event.update(ts=round((start - trace.origin) * 1e6, 1), dur=round((end - start) * 1e6, 1))
        events.append({**event, "tid": tids[lane], "args": args})
    return events


def ledger(engine, steps: int) -> dict:
    """What this rank holds in RAM and in swap files, and what the files moved."""
    files = engine.nvme.files
    return {
        "ram_bytes": engine.memory.bytes_by_category(),
        "disk_bytes": engine.memory.disk_bytes_by_category(),
        "buffers": {k: int(v.nbytes) for k, v in engine.memory.held["buffers"].items()},
        "swap_files": {f.path.name: f.nbytes for f in files},
        "read_bytes_per_step": sum(f.bytes_read for f in files) // steps,
        "written_bytes_per_step": sum(f.bytes_written for f in files) // steps,
        "sub_group_numel": engine.offloaded.sub_group,
    }


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """This script's flags, and zero_ref.train's: those after `--`."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the trace file to write")
    own, flags = split_argv(sys.argv[1:])
    a = p.parse_args(own)
    world = MPI.COMM_WORLD
    parsed = parse_args(flags, world.size, world.rank)
    run, zero = parsed.run, parsed.zero
    if zero.offload_optimizer != "nvme":
        raise SystemExit("trace_offload.py: give --offload-optimizer nvme (and --nvme-path)")
    comm = comm_for(world, zero)
    settle_thread_budget(ranks_sharing_this_host(world))
    task, init, *_ = prepare(parsed, comm.size)
    engine = make_engine(task.model, init, zero, comm)
    trace = engine.trace = comm.ledger.trace = Trace(comm.rank)
    engine.offloaded.trace()
    for step in range(run.steps):
        inputs, targets = task.batches(step)
        lr = run.lr_schedule(step + 1)
        engine.train_step(inputs[:, comm.rank], targets[:, comm.rank], lr=lr)
        trace.counter("ledger bytes", engine.memory.bytes_by_category())
    everyone = world.gather(trace.events + swap_events(engine, trace), root=0)
    held = ledger(engine, run.steps)
    engine.close()
    if comm.rank == 0:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        write_trace(str(a.out), everyone)
        print(json.dumps({"written": str(a.out), "rank 0": held}))


if __name__ == "__main__":
    main()
