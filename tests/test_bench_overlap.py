"""scripts/bench_overlap.py at a tiny size on one slow link: two namespace hosts really
exchange the training's bytes over a rate-limited veth, and everything made is removed.

Needs root (network namespaces); where they cannot be made the test is skipped with the
reason, never passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from netns_pair import unavailable  # noqa: E402

PREFIX = "zrnt"  # apart from the bench's own zrn, so a bench run and this test never meet
RATE_MBIT = 20.0
TINY = "--d-model 16 --n-layer 1 --n-head 2 --batch-size 8 --context 16"


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def bench() -> dict:
    why = unavailable()
    if why:
        pytest.skip(f"cannot make network namespaces here: {why}")
    cmd = [sys.executable, str(REPO / "scripts" / "bench_overlap.py"), "--prefix", PREFIX]
    cmd += [
        "--parts",
        "sweep",
        "--stages",
        "3",
        "--rates",
        f"{RATE_MBIT:g}",
        "--steps",
        "7",
        "--probe-numel",
        "4096",
        "--model-flags",
        TINY,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(result: dict) -> dict[tuple[float | None, int], dict]:
    return {(r["rate_mbit"], r["stage"]): r for r in result["rows"]}


def test_every_link_and_stage_ran(bench):
    assert set(rows(bench)) == {(None, 3), (RATE_MBIT, 3)}
    assert {r["placement"] for r in bench["rows"]} == {"block"}


def test_tbf_limits_the_link(bench):
    slow = rows(bench)[RATE_MBIT, 3]
    fast = rows(bench)[None, 3]
    rate_bytes = RATE_MBIT * 1e6 / 8
    # one TCP stream gets most of the rate and never more (headers and ACKs take the rest)
    assert 0.7 * rate_bytes < slow["link_bytes_s"] <= 1.02 * rate_bytes
    assert fast["link_bytes_s"] > 10 * rate_bytes
    assert slow["blocking"]["step_s"] > fast["blocking"]["step_s"]


def test_the_training_bytes_cross_the_link(bench):
    for r in bench["rows"]:
        b = r["blocking"]
        # stage 3's two all-gathers and one reduce-scatter must move at least half of each
        # full buffer across the cut between the hosts (stage 0's all-reduce: all of it)
        least = (1.5 if r["stage"] == 3 else 1.0) * 4 * b["numel_padded"]
        assert min(b["link_rx_bytes"], b["link_tx_bytes"]) >= least, r
        assert b["collectives"] > 0 and b["ledger_comm_s"] > 0


def test_overlapped_is_measured_or_null_with_a_reason(bench):
    for r in bench["rows"]:
        if r["stage"] == 0:
            continue
        if r["overlapped"] is None:
            assert r["overlapped_null_reason"], r
            assert r["overlapped_over_max"] is None
        else:
            assert r["overlapped"]["step_s"] > 0 and r["overlapped_over_max"] > 0


def test_the_hosts_are_removed(bench):
    assert f"{PREFIX}_h" not in namespaces()
    assert not Path(f"/etc/netns/{PREFIX}_h1").exists()
