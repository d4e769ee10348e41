"""What hpZ keeps off the link between two hosts: bf16 stage 3 on 2 network-namespace
hosts x 2 ranks (scripts/netns_hosts.sh), without hpZ and with --hpz-partition-size host,
the link's byte counters (h1's end of the veth pair, both directions) read by rank 0
inside h1 around the measured steps, beside rank 0's ledger by kind. Root needed.

    python scripts/hpz_link.py [--steps 4] [--d-model 64]

The namespaces are named hpz_h1 / hpz_h2 and removed at the end. A short check, not a
benchmark (the link is not rate-limited; the lead's bench_zeropp.py measures times).
JSON line last.
"""

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NETNS = REPO / "scripts" / "netns_hosts.sh"
PREFIX, SUBNET = "hpz", "10.86.0"
TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. " * 40


def link_bytes() -> int:
    """rx + tx of this namespace's end of the link (rank 0 runs in h1)."""
    stats = Path(f"/sys/class/net/{PREFIX}0/statistics")
    return sum(int((stats / f"{d}_bytes").read_text()) for d in ("rx", "tx"))


def worker(args) -> None:
    from mpi4py import MPI

    from zero_ref.app.data import encode_corpus, sequence_batches
    from zero_ref.comm.choose import comm_for
    from zero_ref.config import ZeroConfig
    from zero_ref.engine.ladder import make_engine
    from zero_ref.models.gpt import GPT, GPTConfig
    from zero_ref.models.unit import init_params

    mpi = MPI.COMM_WORLD
    partition = args.hpz if args.hpz == "host" else int(args.hpz)
    cfg = ZeroConfig(stage=3, precision="bf16", deterministic=True, hpz_partition_size=partition)
    vocab, tokens = encode_corpus(TEXT)
    model = GPT(GPTConfig(vocab.size, context=16, n_layer=2, n_head=2, d_model=args.d_model))
    comm = comm_for(mpi, cfg)
    engine = make_engine(model, init_params(model, 0), cfg, comm)
    w, r = comm.size, comm.rank

    def step(s: int) -> None:
        x, t = sequence_batches(tokens, 16, 2, w, 1, s, 0)
        engine.train_step(x[:, r], t[:, r])

    step(0)  # warm-up: connections made, buffers touched
    mpi.Barrier()
    before = link_bytes() if r == 0 else 0
    for s in range(1, args.steps + 1):
        step(s)
    mpi.Barrier()
    after = link_bytes() if r == 0 else 0
    hosts = mpi.gather(socket.gethostname(), root=0)
    ledger = comm.ledger.history[-args.steps :]
    engine.close()
    if r == 0:
        kinds = sorted({k for s in ledger for k in s})
        per_step = {k: sum(s.get(k, {}).get("sent_bytes", 0) for s in ledger) // args.steps
                    for k in kinds}  # fmt: skip
        print(json.dumps({"hpz": args.hpz, "hosts": hosts, "padded_numel": engine.layout.full_numel,
                          "link_bytes_per_step": (after - before) // args.steps,
                          "ledger_sent_per_step": per_step}), flush=True)  # fmt: skip


def netns(*calls: str) -> str:
    script = f"source {NETNS}; " + " && ".join(calls)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"netns_hosts.sh: {script}\n{done.stdout}{done.stderr}")
    return done.stdout


def launch(hpz: str, args) -> dict:
    job = [sys.executable, str(Path(__file__).resolve()), "--worker", "--hpz", hpz,
           "--steps", str(args.steps), "--d-model", str(args.d_model)]  # fmt: skip
    inner = " ".join(["nh_mpiexec", PREFIX, f"{PREFIX}h1:2,{PREFIX}h2:2", "-n", "4", *job])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    env.pop("ZERO_REF_THREAD_VARS", None)
    cmd = ["bash", "-c", f"source {NETNS}; {inner}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"hpz={hpz} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def driver(args) -> None:
    netns(f"nh_make {PREFIX} {SUBNET}")
    try:
        runs = [launch(h, args) for h in ("1", "host")]
    finally:
        netns(f"nh_cleanup {PREFIX}")
    for run in runs:
        print(f"hpz {run['hpz']:>4}: link {run['link_bytes_per_step']:>10,} bytes/step; "
              f"ledger {run['ledger_sent_per_step']}")  # fmt: skip
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps({"steps": args.steps, "d_model": args.d_model, "runs": runs,
                      "load_average": load}))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hpz", default="1", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
