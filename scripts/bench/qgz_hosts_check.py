"""qgZ's default hops on two real hosts: `host` groups from MPI's shared-memory split.

    sudo python scripts/bench/qgz_hosts_check.py

Two network-namespace hosts of 2 ranks (scripts/bench/netns_pair.py), a deterministic int4 qgZ
run at stage 3 with --check-oracle and the default --quantized-gradient-local-size host:
with ranks placed in blocks it must run in two hops (the ledger's
reduce_scatter_int4_local and _cross kinds) and be bitwise the oracle, which is given
the groups MPI made; placed round-robin, the hosts' ranks are not consecutive and the
run must stop with the error naming the setting. One JSON line last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.netns_pair import NetnsPair, unavailable
from scripts.bench.overlap_runs import rank_env

FLAGS = (
    "--model", "mlp", "--steps", "3", "--stage", "3", "--quantized-gradients",
    "--quantized-gradient-bits", "4", "--deterministic", "--check-oracle", "--quiet",
    "--sample-chars", "0",
)  # fmt: skip


def run(pair: NetnsPair, placement: str, log: Path) -> dict:
    """One run across the hosts: its exit status, the oracle's verdict, the ledger's kinds."""
    env = rank_env()
    argv = [sys.executable, "-m", "zero_ref.train", *FLAGS, "--log-jsonl", str(log)]
    done = subprocess.run(
        pair.mpiexec(2, argv, env, placement), capture_output=True, text=True, env=env, timeout=300
    )
    out = done.stdout + done.stderr
    kinds = []
    if done.returncode == 0:
        final = json.loads(log.read_text().splitlines()[-1])
        kinds = sorted(final["ranks"][0]["comm_last_step"])
    return {
        "placement": placement,
        "rc": done.returncode,
        "bitwise_oracle": "bitwise equal to the single-rank oracle" in out,
        "kinds": kinds,
        "error": next((ln for ln in out.splitlines() if "quantized_gradient_local_size" in ln), ""),
    }


def main() -> None:
    why = unavailable()
    if why:
        raise SystemExit(f"qgz_hosts_check: {why}")
    with tempfile.TemporaryDirectory() as tmp, NetnsPair("zrqh", "10.89.0") as pair:
        block, cyclic = (run(pair, p, Path(tmp) / f"{p}.jsonl") for p in ("block", "cyclic"))
    checks = {
        "block_two_hops_bitwise": block["rc"] == 0
        and block["bitwise_oracle"]
        and {"reduce_scatter_int4_local", "reduce_scatter_int4_cross"} <= set(block["kinds"]),
        "cyclic_refused_by_name": cyclic["rc"] != 0 and "not consecutive" in cyclic["error"],
    }
    for r in (block, cyclic):
        print(f"{r['placement']}: rc {r['rc']}, oracle bitwise {r['bitwise_oracle']}, "
              f"kinds {', '.join(r['kinds']) or '-'} {r['error'][:200]}")  # fmt: skip
    print(json.dumps({"runs": [block, cyclic], "checks": checks}))


if __name__ == "__main__":
    main()
