"""Which progress policy (zero_ref/comm/progress.py) lets a non-blocking collective overlap
NumPy compute: measured on one host and across two network-namespace hosts.

For each policy, each collective (an Ialltoall of 16-bit words, as zero_ref reduces
16-bit gradients, and an Iallgather of float32, as stage 3 gathers parameters) and each
size (--sizes, the bytes each rank's receive buffer holds):

  comm_s      the collective alone: Barrier, issue, Wait.
  compute_s   the compute alone: slices of fixed NumPy work (one 256 x 256 float32
              matmul each, ~0.5 ms on one core here; BLAS releases the GIL), as many
              slices as make compute about as long as the collective alone; poke()
              after every SLICES_PER_UNIT (8) slices, as the engine pokes at unit
              boundaries (test-layer pokes after every slice, as at layer boundaries).
  total_s     issue, the same compute with its pokes, Wait: the overlapped time.
  wait_s      the part of total_s spent in that final Wait (what was not hidden).
  overlap     (comm_s + compute_s - total_s) / min(comm_s, compute_s): 1 is a perfect
              overlap, 0 none, below 0 the policy made things worse.

compute_s is also measured in the plain launch (no MPICH progress thread) and the
overlap of every policy is computed against that plain compute time too
(overlap_vs_plain), so a progress thread that slows compute is not excused by its
own slower compute_s. Each number is a median over --repeats after one warm-up, of the
slowest rank; the policies take turns within each repeat. Policies: none, test (poke
per unit), test-layer (poke per slice), thread (poll_s 0: the thread yields the GIL
between tests), thread-sleep (poll_s 1e-4), thread-1ms (poll_s 1e-3), mpich (a
separate launch with MPIR_CVAR_ASYNC_PROGRESS=1).

    python scripts/bench/bench_progress.py [--settings one_host,two_hosts,two_hosts_2x2]
                                     [--rate 200mbit] [--record]

Run as a plain command: it launches itself under mpirun per setting and policy
group. one_host: 2 ranks, shared memory. two_hosts: the namespace hosts of
scripts/bench/netns_hosts.sh (root), 1 rank per host; two_hosts_2x2: 2 ranks per host
(4 ranks on this machine's cores). The link is limited by tbf at --rate on both ends.
The last line is one JSON object.
"""

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import REPO, add_record_flag, emit, load_average, median

SLICE_N = 256  # one slice: a 256 x 256 float32 matmul (34 MFLOP)
SLICES_PER_UNIT = 8  # a unit boundary (a poke) every 8 slices; test-layer pokes every slice
PLAIN_MODES = ("none", "test", "test-layer", "thread", "thread-sleep", "thread-1ms")
THREAD_POLL_S = {"thread": 0.0, "thread-sleep": 1e-4, "thread-1ms": 1e-3}  # the thread's pause
NETNS = REPO / "scripts" / "bench" / "netns_hosts.sh"
PREFIX, SUBNET = "zrp", "10.79.0"
# One BLAS thread per rank in every setting: the namespace "hosts" share this machine's
# cores, and zero_ref's budget (cores / ranks on the host) would give each of them all.
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                               "NUMBA_NUM_THREADS")}  # fmt: skip
SETTINGS = {  # name: (ranks, Hydra hosts or None for one host)
    "one_host": (2, None),
    "two_hosts": (2, f"{PREFIX}h1:1,{PREFIX}h2:1"),
    "two_hosts_2x2": (4, f"{PREFIX}h1:2,{PREFIX}h2:2"),
}


# ---- the worker: runs under mpirun


def make_policy(mode: str, mpi):
    from zero_ref.comm.progress import progress_for

    if mode == "test-layer":
        return progress_for("test", mpi), 1
    if mode in THREAD_POLL_S:
        return progress_for("thread", mpi, poll_s=THREAD_POLL_S[mode]), SLICES_PER_UNIT
    return progress_for(mode, mpi), SLICES_PER_UNIT


def buffers(kind: str, size_bytes: int, world: int):
    """(send, recv, issue) for one collective whose receive buffer is size_bytes."""
    if kind == "ialltoall16":
        send = np.ones(size_bytes // 2 // world * world, np.uint16)
        return send, np.empty_like(send), lambda mpi, s, r: mpi.Ialltoall(s, r)
    block = size_bytes // 4 // world
    send = np.ones(block, np.float32)
    return send, np.empty(block * world, np.float32), lambda mpi, s, r: mpi.Iallgather(s, r)


class Compute:
    """Slices of fixed work (one SLICE_N x SLICE_N float32 matmul each; the same on every
    rank and in every launch), a poke every poke_every slices."""

    def __init__(self) -> None:
        self.a = np.random.default_rng(0).standard_normal((SLICE_N, SLICE_N)).astype(np.float32)
        self.out = np.empty_like(self.a)

    def run(self, slices: int, progress, poke_every: int) -> int:
        pokes = 0
        for i in range(slices):
            np.matmul(self.a, self.a, out=self.out)  # BLAS: releases the GIL
            if (i + 1) % poke_every == 0:
                progress.poke()
                pokes += 1
        return pokes


def slowest(mpi, seconds: float) -> float:
    from mpi4py import MPI

    return mpi.allreduce(seconds, op=MPI.MAX)


def measure(mpi, modes: list[str], kind: str, size: int, compute: Compute, repeats: int):
    """One row per mode; the modes take turns within each repeat, so that the load of
    the moment falls on all of them alike."""
    send, recv, issue = buffers(kind, size, mpi.Get_size())
    slices = slices_like_comm(mpi, issue, send, recv, compute)
    policies = {mode: make_policy(mode, mpi) for mode in modes}
    samples = {mode: {"comm": [], "comp": [], "total": [], "wait": []} for mode in modes}
    pokes = {}
    for _ in range(repeats + 1):  # the first is a warm-up
        for mode, (progress, poke_every) in policies.items():
            got = samples[mode]
            got["comm"].append(_comm_alone(mpi, issue, send, recv, progress))
            mpi.Barrier()
            t = time.perf_counter()
            compute.run(slices, progress, poke_every)
            got["comp"].append(slowest(mpi, time.perf_counter() - t))
            total, wait, pokes[mode] = _overlapped(mpi, issue, send, recv, progress, compute,
                                                   slices, poke_every)  # fmt: skip
            got["total"].append(total)
            got["wait"].append(wait)
    for progress, _ in policies.values():
        progress.close()
    return [_row(mode, kind, size, slices, pokes[mode], samples[mode]) for mode in modes]


def _overlapped(mpi, issue, send, recv, progress, compute, slices, poke_every):
    """(total, final wait, pokes): issue, compute with pokes, Wait."""
    mpi.Barrier()
    t = time.perf_counter()
    r = issue(mpi, send, recv)
    progress.started(r)
    pokes = compute.run(slices, progress, poke_every)
    w = time.perf_counter()
    r.Wait()
    progress.finished(r)
    end = time.perf_counter()
    return slowest(mpi, end - t), slowest(mpi, end - w), pokes


def _row(mode: str, kind: str, size: int, slices: int, pokes: int, got: dict) -> dict:
    c, k, s = (median(got[key][1:]) for key in ("comm", "comp", "total"))
    return {
        "mode": mode, "kind": kind, "size_bytes": size, "comm_s": c, "compute_s": k,
        "total_s": s, "wait_s": median(got["wait"][1:]), "slices": slices, "pokes": pokes,
        "overlap": (c + k - s) / min(c, k),
    }  # fmt: skip


def _comm_alone(mpi, issue, send, recv, progress) -> float:
    mpi.Barrier()
    t = time.perf_counter()
    r = issue(mpi, send, recv)
    progress.started(r)
    r.Wait()
    progress.finished(r)
    return slowest(mpi, time.perf_counter() - t)


def slices_like_comm(mpi, issue, send, recv, compute: Compute) -> int:
    """Slices of compute that take about as long as the collective alone (every rank the
    same number: both medians are of the slowest rank); the same for every mode."""
    from zero_ref.comm.progress import progress_for

    progress = progress_for("none", mpi)
    comm_s = median([_comm_alone(mpi, issue, send, recv, progress) for _ in range(3)])
    unit_s = median([slowest(mpi, _time_unit(compute, progress)) for _ in range(3)])
    return max(1, round(comm_s / unit_s * SLICES_PER_UNIT))


def _time_unit(compute: Compute, progress) -> float:
    t = time.perf_counter()
    compute.run(SLICES_PER_UNIT, progress, SLICES_PER_UNIT)
    return time.perf_counter() - t


def worker(args) -> None:
    from mpi4py import MPI

    mpi = MPI.COMM_WORLD.Dup()
    compute = Compute()
    rows = []
    for size in args.sizes:
        for kind in ("ialltoall16", "iallgather"):
            rows += measure(mpi, args.modes, kind, size, compute, args.repeats)
    blas = mpi.allreduce(threadpool_limits_summary(), op=MPI.MAX)
    if mpi.Get_rank() == 0:
        print(json.dumps({"rows": rows, "thread_level": MPI.Query_thread(), "blas_threads": blas,
                          "load_average": load_average()}), flush=True)  # fmt: skip


def threadpool_limits_summary() -> int:
    """The most threads any BLAS pool of this rank uses (1 is what the bench asks for)."""
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info()), default=1)


# ---- the driver: a plain command that launches the worker


def netns(*calls: str) -> str:
    """Run netns_hosts.sh functions (one shell), return their stdout."""
    script = f"source {NETNS}; " + " && ".join(calls)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"netns_hosts.sh: {script}\n{done.stdout}{done.stderr}")
    return done.stdout


def launch(setting: str, mpich: bool, args) -> dict:
    world, hosts = SETTINGS[setting]
    modes = ["mpich"] if mpich else list(PLAIN_MODES)
    sizes = ",".join(str(s) for s in args.sizes)
    job = [sys.executable, str(Path(__file__).resolve()), "--worker", "--modes", ",".join(modes),
           "--sizes", sizes, "--repeats", str(args.repeats)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD}
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    # This driver imported zero_ref, which set the thread variables and named them in
    # ZERO_REF_THREAD_VARS; a rank would take them for zero_ref's and replace ONE_THREAD
    # with its own budget (2 BLAS threads for 1 rank per "host" on 2 shared cores).
    env.pop("ZERO_REF_THREAD_VARS", None)
    genv = ["-genv", "MPIR_CVAR_ASYNC_PROGRESS", "1"] if mpich else []
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    if hosts is None:
        cmd = [mpiexec, *genv, "-n", str(world), *job]
    else:
        inner = " ".join(["nh_mpiexec", PREFIX, hosts, *genv, "-n", str(world), *job])
        cmd = ["bash", "-c", f"source {NETNS}; {inner}"]
    before = netns(f"nh_bytes {PREFIX}") if hosts else None
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{setting} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if hosts:
        after = netns(f"nh_bytes {PREFIX}")
        result["link_bytes"] = sum(map(int, after.split())) - sum(map(int, before.split()))
    return result


def with_plain_overlap(rows: list[dict]) -> None:
    """overlap against the plain launch's compute time per slice (the same collective and
    size) times this row's slices: what the compute costs with no progress thread."""
    plain = {(r["kind"], r["size_bytes"]): r["compute_s"] / r["slices"]
             for r in rows if r["mode"] == "none"}  # fmt: skip
    for r in rows:
        k = plain[(r["kind"], r["size_bytes"])] * r["slices"]
        r["compute_plain_s"] = k
        r["overlap_vs_plain"] = (r["comm_s"] + k - r["total_s"]) / min(r["comm_s"], k)


def run_setting(setting: str, args) -> dict:
    hosts = SETTINGS[setting][1]
    if hosts:
        netns(f"nh_make {PREFIX} {SUBNET}", f"nh_rate {PREFIX} {args.rate}")
    try:
        plain, mpich = launch(setting, False, args), launch(setting, True, args)
    finally:
        if hosts:
            netns(f"nh_cleanup {PREFIX}")
    rows = plain["rows"] + mpich["rows"]
    with_plain_overlap(rows)
    out = {"ranks": SETTINGS[setting][0], "hosts": hosts, "rows": rows,
           "blas_threads": max(plain["blas_threads"], mpich["blas_threads"]),
           "load_average": [plain["load_average"], mpich["load_average"]]}  # fmt: skip
    if hosts:
        out |= {"rate": args.rate, "link_bytes": plain["link_bytes"] + mpich["link_bytes"]}
    return out


def print_table(name: str, res: dict) -> None:
    print(f"\n{name}: {res['ranks']} ranks, hosts {res['hosts']}, load {res['load_average']}")
    print(f"{'collective':12} {'MiB':>4} {'mode':13} {'comm ms':>8} {'compute':>8} "
          f"{'total':>8} {'wait':>7} {'slices':>6} {'pokes':>5} {'overlap':>7} "
          f"{'vs plain':>8}")  # fmt: skip
    for r in res["rows"]:
        print(f"{r['kind']:12} {r['size_bytes'] / 2**20:4.0f} {r['mode']:13} "
              f"{r['comm_s'] * 1e3:8.1f} {r['compute_s'] * 1e3:8.1f} {r['total_s'] * 1e3:8.1f} "
              f"{r['wait_s'] * 1e3:7.1f} {r['slices']:6d} {r['pokes']:5d} {r['overlap']:7.2f} "
              f"{r['overlap_vs_plain']:8.2f}")  # fmt: skip


def driver(args) -> None:
    result = {"sizes": args.sizes, "slice_n": SLICE_N, "slices_per_unit": SLICES_PER_UNIT,
              "repeats": args.repeats, "settings": {}, "skipped": {}}  # fmt: skip
    for setting in args.settings:
        if SETTINGS[setting][1]:
            why = subprocess.run(["bash", "-c", f"source {NETNS}; nh_available"],
                                 capture_output=True, text=True)  # fmt: skip
            if why.returncode != 0:
                print(f"{setting}: skipped: {why.stdout.strip()}", flush=True)
                result["skipped"][setting] = why.stdout.strip()
                continue
        result["settings"][setting] = run_setting(setting, args)
        print_table(setting, result["settings"][setting])
    emit({**result, "load_average": load_average()}, args.record)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", type=lambda s: s.split(","), default=list(SETTINGS))
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1 << 20, 4 << 20, 16 << 20],
                   help="receive-buffer bytes per rank")  # fmt: skip
    p.add_argument("--rate", default="200mbit", help="tbf rate on the namespace link")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(PLAIN_MODES))
    add_record_flag(p, "bench_progress")
    args = p.parse_args()
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        p.error(f"--settings: unknown {bad}; allowed: {', '.join(SETTINGS)}")
    if args.repeats < 1 or min(args.sizes) <= 0:
        p.error("--repeats must be >= 1 and every --sizes value > 0")
    return args


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(f"bench_progress: signal {signum}")  # so the namespaces are removed


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_term)
    a = parse_args()
    worker(a) if a.worker else driver(a)
