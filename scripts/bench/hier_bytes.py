"""The bytes one collective puts on the link, flat against two-level (issue 33, docs/multihost.md).

    python scripts/bench/hier_bytes.py --record          # as root: network namespaces

Two namespace hosts joined by a veth (scripts/bench/netns_pair.py, unlimited rate). For
each placement (2 + 2 ranks in blocks, 2 + 2 cyclic, 2 + 1) and each collective (an
all-gather of one float32 block a rank, a reduce-scatter of one block a destination;
deterministic mode), one job per Comm (flat: MPI's own algorithm; two-level:
zero_ref/comm/two_level.py's) runs `--calls` of them between barriers, and rank 0
(always on the first host) reads the first host's veth counters at the barriers: bytes
received and sent per call, TCP/IP and UCX headers included. Beside them, the least: the
first host takes each of the other host's blocks once (all-gather), or one partial per
destination it holds (reduce-scatter), and sends what the other host needs once.

Prints a table and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.netns_pair import LIBRARY, NetnsPair, unavailable
from scripts.bench.overlap_runs import rank_env

PLACEMENTS = {  # name -> (ranks on the first host, on the second, Hydra's slots a host)
    "2 + 2 in blocks": (2, 2, (2, 2)),
    "2 + 2 cyclic": (2, 2, (1, 1)),
    "2 + 1": (2, 1, (2, 1)),
}
COLLECTIVES = ("allgather", "reduce_scatter")
COMMS = ("flat", "two-level")


def least_bytes(collective: str, first: int, second: int, block_bytes: int) -> tuple[int, int]:
    """(received, sent) by the first host per call, the least: an all-gather takes the
    second host's blocks once and sends its own once; a reduce-scatter takes one partial
    for each of its destinations and sends one for each of the second host's."""
    if collective == "allgather":
        return second * block_bytes, first * block_bytes
    return first * block_bytes, second * block_bytes


def worker(args: argparse.Namespace) -> None:
    """Inside the job: `calls` collectives between barriers; rank 0 reads its host's
    veth counters before and after them and prints the bytes per call."""
    import numpy as np
    from mpi4py import MPI

    from scripts.bench.link_probe import dev_bytes  # (mpi4py: in the ranks only)
    from zero_ref.comm.collectives import Comm
    from zero_ref.comm.reduction import OrderedReduction
    from zero_ref.comm.two_level import two_level_comm

    world = MPI.COMM_WORLD
    flat = args.comm == "flat"
    comm = Comm(world, OrderedReduction()) if flat else two_level_comm(world, OrderedReduction())
    n, w = args.numel, comm.size
    send = np.ones(n if args.collective == "allgather" else w * n, np.float32)
    recv = np.empty(w * n if args.collective == "allgather" else n, np.float32)

    def call() -> None:
        if args.collective == "allgather":
            comm.allgather(send, recv)
        else:
            comm.reduce_scatter_sum(send, recv)

    call()  # connections made, buffers touched
    world.Barrier()
    before = dev_bytes(args.dev) if world.rank == 0 else (0, 0)
    world.Barrier()  # no rank sends a counted byte before rank 0 has read the counters
    for _ in range(args.calls):
        call()
    world.Barrier()
    if world.rank == 0:
        after = dev_bytes(args.dev)
        rx, tx = ((a - b) / args.calls for a, b in zip(after, before, strict=True))
        print(json.dumps({"rx_per_call": rx, "tx_per_call": tx, "comm": type(comm).__name__}))


def one_job(pair: NetnsPair, placement: str, collective: str, comm: str, a) -> dict:
    first, second, slots = PLACEMENTS[placement]
    hosts = ",".join(f"{h}:{s}" for h, s in zip(pair.hosts, slots, strict=True))
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--dev", pair.dev,
            "--collective", collective, "--comm", comm, "--numel", str(a.numel),
            "--calls", str(a.calls)]  # fmt: skip
    cmd = ["bash", "-c", 'source "$0"; "$@"', str(LIBRARY), "nh_mpiexec", pair.prefix, hosts,
           "-n", str(first + second), *argv]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), timeout=300)
    if done.returncode:
        raise SystemExit(f"{placement} {collective} {comm}: rc {done.returncode}\n"
                         f"{(done.stderr or done.stdout)[-3000:]}")  # fmt: skip
    got = json.loads(done.stdout.strip().splitlines()[-1])
    rx_least, tx_least = least_bytes(collective, first, second, 4 * a.numel)
    return {"placement": placement, "collective": collective, "collectives": comm, **got,
            "rx_least": rx_least, "tx_least": tx_least,
            "rx_over_least": got["rx_per_call"] / rx_least,
            "tx_over_least": got["tx_per_call"] / tx_least}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=262144, help="float32 elements a block (1 MiB)")
    p.add_argument("--calls", type=int, default=10, help="collectives counted per job")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dev", help=argparse.SUPPRESS)
    p.add_argument("--collective", choices=COLLECTIVES, help=argparse.SUPPRESS)
    p.add_argument("--comm", choices=COMMS, help=argparse.SUPPRESS)
    add_record_flag(p, "hier_bytes")
    a = p.parse_args()
    if a.numel < 1 or a.calls < 1:
        raise SystemExit(f"--numel {a.numel} and --calls {a.calls}: both must be >= 1")
    if a.worker:
        worker(a)
        return
    why = unavailable()
    if why:
        raise SystemExit(f"hier_bytes: {why}")
    t0 = time.time()
    rows = []
    with NetnsPair("zrb", "10.85.0") as pair:
        pair.set_rate(None)
        for placement in PLACEMENTS:
            for collective in COLLECTIVES:
                for comm in COMMS:
                    row = one_job(pair, placement, collective, comm, a)
                    rows.append(row)
                    print(f"{placement:16s} {collective:15s} {comm:9s} "
                          f"rx {row['rx_per_call'] / 1e6:7.3f} MB ({row['rx_over_least']:.2f} x "
                          f"least)  tx {row['tx_per_call'] / 1e6:7.3f} MB "
                          f"({row['tx_over_least']:.2f} x)", flush=True)  # fmt: skip
    emit({"numel": a.numel, "block_bytes": 4 * a.numel, "calls": a.calls, "rows": rows,
          "load_average": load_average(), "wall_s": time.time() - t0}, a.record)  # fmt: skip


if __name__ == "__main__":
    main()
