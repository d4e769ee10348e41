"""scripts/bench/netns_hosts.sh: two namespace hosts are made, joined by a rate-limited link that
MPI really uses, and removed without a trace. Needs root (network namespaces); where
they cannot be made the test skips and says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "scripts" / "bench" / "netns_hosts.sh"
PREFIX, SUBNET = "zrpt", "10.79.1"  # this test's own names, apart from the benchmark's

HELLO = (  # each rank writes its line to a file of its own: Hydra may drop a rank's last
    # stdout when the job ends at once (seen once in CI), a file it cannot
    "import socket, sys, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "out = np.empty(c.size << 20, np.uint8); c.Allgather(np.full(1 << 20, c.rank, np.uint8), out); "
    "open(f'{sys.argv[1]}/rank{c.rank}', 'w').write("
    "f'HOST {c.rank} {socket.gethostname()} {int(out.sum())}')"
)


def nh(*calls: str) -> subprocess.CompletedProcess:
    script = f"source {LIB}; " + " && ".join(calls)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)


@pytest.fixture
def hosts():
    why = nh("nh_available")
    if why.returncode != 0:  # skip only for the library's own reason, never for a broken one
        assert why.stdout.startswith("netns_hosts: "), why.stdout + why.stderr
        pytest.skip(why.stdout.strip())
    made = nh(f"nh_make {PREFIX} {SUBNET}")
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        yield
    finally:
        nh(f"nh_cleanup {PREFIX}")


def test_two_hosts_share_a_rate_limited_link_and_leave_nothing_behind(hosts, tmp_path):
    assert nh(f"nh_rate {PREFIX} 100mbit").returncode == 0
    qdisc = nh(f"ip netns exec {PREFIX}_h2 tc qdisc show dev {PREFIX}0")
    assert "tbf" in qdisc.stdout and "100Mbit" in qdisc.stdout, qdisc.stdout
    before = nh(f"nh_bytes {PREFIX}").stdout.split()
    env = f"PYTHON={sys.executable}"
    run = nh(f"{env} nh_mpiexec {PREFIX} {PREFIX}h1:1,{PREFIX}h2:1 -n 2 {sys.executable} "
             f"-c \"{HELLO}\" {tmp_path}")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = sorted(f.read_text().split() for f in tmp_path.glob("rank*"))
    assert [(r, h) for _, r, h, _ in lines] == [("0", f"{PREFIX}h1"), ("1", f"{PREFIX}h2")]
    assert all(int(total) == 1 << 20 for *_, total in lines)  # rank 1's bytes arrived
    after = nh(f"nh_bytes {PREFIX}").stdout.split()
    crossed = sum(map(int, after)) - sum(map(int, before))
    assert crossed >= 2 << 20, f"only {crossed} bytes crossed the link"
    assert nh(f"nh_rate {PREFIX} off").returncode == 0

    nh(f"nh_cleanup {PREFIX}")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{PREFIX}_h" not in listed
    assert not Path(f"/etc/netns/{PREFIX}_h1").exists()
    assert not Path(f"/tmp/{PREFIX}_netns_rsh").exists()
