"""One training run, and the link's own cost, across scripts/bench/netns_pair.py's two hosts.

scripts/bench/bench_overlap.py's measuring parts: the link's rate (one TCP stream), what one
collective costs on it (scripts/bench/link_probe.py), and one `python -m zero_ref.train` with
--log-jsonl whose link bytes per step are read from the veth counters as each step's
line appears in the log.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from scripts.bench.netns_pair import NetnsPair

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parents[1]
SKIP_FIRST = 2  # steps left out: the first steps pay one-off costs
PER_HOST = 2  # ranks on each of the two hosts
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


# ---- the link: its rate and one message's cost


def link_rate(pair: NetnsPair, seconds: float = 0.5) -> float:
    """Bytes per second of one TCP stream from the second host to the first."""
    nbytes = int(max(2e6, (pair.rate_mbit or 8000) * 1e6 / 8 * seconds))
    port = 5201
    server = (
        "import socket,time,sys\n"
        f"s=socket.create_server(('{pair.addr[0]}',{port}));print('up',flush=True)\n"
        "c,_=s.accept();n=0;t0=time.perf_counter()\n"
        f"while n<{nbytes}:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\n"
        "print(n/(time.perf_counter()-t0))\n"
    )
    rx = subprocess.Popen(
        pair.host_cmd(0, [sys.executable, "-c", server]), stdout=subprocess.PIPE, text=True
    )
    assert rx.stdout is not None
    rx.stdout.readline()  # listening
    sender = (
        "import socket\n"
        f"c=socket.create_connection(('{pair.addr[0]}',{port}))\n"
        f"b=b'x'*(1<<20);n={nbytes}\n"
        "while n>0:\n c.sendall(b[:n]);n-=len(b)\n"
        "c.close()\n"
    )
    subprocess.run(pair.host_cmd(1, [sys.executable, "-c", sender]), check=True, timeout=120)
    out, _ = rx.communicate(timeout=120)
    return float(out.strip())


def link_probe(pair: NetnsPair, env: dict[str, str], numel: int, placement: str = "block") -> dict:
    """scripts/bench/link_probe.py across the hosts (2 x PER_HOST ranks): one tiny all-gather's
    time, and each collective kind's seconds and link bytes per call of numel values."""
    argv = [sys.executable, str(SCRIPTS / "link_probe.py"), "--numel", str(numel)]
    argv += ["--dev", pair.dev]
    done = subprocess.run(
        pair.mpiexec(PER_HOST, argv, env, placement),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if done.returncode:
        raise SystemExit(f"link_probe.py failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- one training run


def rank_env() -> dict[str, str]:
    """This environment for the ranks, less the thread budget importing zero_ref may have
    set here (each rank sets its own from the ranks on its host)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), PYTHON=sys.executable)
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    for var in THREAD_VARS:
        env.pop(var, None)
    return env


class StepWatcher(threading.Thread):
    """Reads the veth counters each time a step's line appears in the --log-jsonl log
    (rank 0 writes and flushes it as each step ends)."""

    def __init__(self, pair: NetnsPair, log: Path, poll_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.pair, self.log, self.poll_s = pair, log, poll_s
        self.at_step: dict[int, tuple[int, int]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        offset, partial = 0, ""
        while not self.done.is_set():
            time.sleep(self.poll_s)
            try:
                with open(self.log, encoding="utf-8") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            counters = self.pair.counters()
            offset += len(chunk.encode())
            *lines, partial = (partial + chunk).split("\n")
            records = [json.loads(line) for line in lines if line.strip()]
            # several lines at once: the counters belong to the last of them only (the
            # earlier ones were read late); with the final record, to none of them
            steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
            if steps and not any(r.get("final") for r in records):
                self.at_step[steps[-1]] = counters


def run_train(
    pair: NetnsPair, flags: list[str], log: Path, timeout_s: float, placement: str = "block"
) -> dict:
    """One `python -m zero_ref.train FLAGS` across the hosts: its step time, link bytes per
    step and the ledger's last step (summarize)."""
    log.unlink(missing_ok=True)
    env = rank_env()
    argv = [sys.executable, "-m", "zero_ref.train", *flags, "--log-jsonl", str(log)]
    cmd = pair.mpiexec(PER_HOST, argv, env, placement)
    watcher = StepWatcher(pair, log)
    watcher.start()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(flags)} timed out after {timeout_s:g} s") from None
    finally:
        watcher.done.set()
        watcher.join()
    if done.returncode:
        raise SystemExit(
            f"{' '.join(flags)} failed (rc {done.returncode}):\n"
            f"{(done.stderr or done.stdout)[-3000:]}"
        )
    return summarize(read_log(log), watcher.at_step)


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def link_bytes_per_step(at_step: dict[int, tuple[int, int]], last: int) -> tuple[float, float]:
    """(rx, tx) bytes per step: the slope of the counters against the step number, from
    step SKIP_FIRST to the last (a fit, so one late read of the counters moves it little)."""
    seen = sorted(s for s in at_step if SKIP_FIRST <= s <= last)
    if len(seen) < 2 or seen[-1] - seen[0] < (last - SKIP_FIRST) / 2:
        raise SystemExit(f"the counters were read at steps {seen} only, of {SKIP_FIRST}-{last}")
    rx = statistics.linear_regression(seen, [at_step[s][0] for s in seen]).slope
    tx = statistics.linear_regression(seen, [at_step[s][1] for s in seen]).slope
    return rx, tx


def summarize(records: list[dict], at_step: dict[int, tuple[int, int]]) -> dict:
    """Median step time after SKIP_FIRST steps, link bytes per step each way, and from the
    last step's ledger (median over ranks) the seconds in collectives and their count."""
    steps = [r for r in records if "step_time_s" in r and not r.get("final")]
    final = records[-1]
    if not final.get("final"):
        raise SystemExit("the last --log-jsonl record is not the final one")
    rx, tx = link_bytes_per_step(at_step, steps[-1]["step"])
    comm = [r["comm_last_step"] for r in final["ranks"]]
    return {
        "step_s": statistics.median(s["step_time_s"] for s in steps[SKIP_FIRST:]),
        "link_rx_bytes": rx,
        "link_tx_bytes": tx,
        "ledger_comm_s": statistics.median(sum(k["seconds"] for k in c.values()) for c in comm),
        "collectives": sum(k["calls"] for k in comm[0].values()),
        "ledger_sent_bytes": steps[-1]["sent_bytes"],
        "numel_padded": final["numel_padded"],
    }
