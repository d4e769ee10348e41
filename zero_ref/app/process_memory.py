"""What the process really holds: resident memory from /proc/self/status (Linux).

The memory ledger (zero_ref/engine/memory.py) counts the arrays the engine registers;
this module reads what the kernel says the process holds, so the report can put
the two side by side and call the difference "untracked" (activations, MPI's
own buffers, Python objects). VmHWM is the peak resident set since the process
started, or since the last reset: writing "5" to /proc/self/clear_refs resets
it (Linux 4.0+), which lets a run measure the peak of each phase -- init,
training, finish -- on its own. Also what the host has left for a run
(MemAvailable), which the estimate checks a run against before it starts.
"""

from __future__ import annotations

import re
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def resident_bytes() -> dict[str, int]:
    """{"rss": current, "peak": high-water mark} in bytes; {} where /proc is missing."""
    try:
        text = STATUS.read_text()
    except OSError:
        return {}
    found = {k: re.search(rf"^{k}:\s+(\d+) kB", text, re.M) for k in ("VmRSS", "VmHWM")}
    if not all(found.values()):
        return {}
    return {"rss": int(found["VmRSS"][1]) * 1024, "peak": int(found["VmHWM"][1]) * 1024}


def reset_peak() -> bool:
    """Start a new high-water mark at the current resident size; False if unsupported."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """Peak resident bytes per phase of a run, above the baseline taken at creation
    (after imports and the kernels' compilation, so those are not charged to ZeRO)."""

    def __init__(self) -> None:
        self.baseline = resident_bytes().get("rss", 0)
        self.peaks: dict[str, int] = {}
        self.resettable = reset_peak()

    def end(self, phase: str) -> None:
        """Record the peak since the last phase ended, and start the next one."""
        peak = resident_bytes().get("peak", 0)
        self.peaks[phase] = max(0, peak - self.baseline)
        if self.resettable:
            reset_peak()


def mem_available_bytes(
    meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup"
) -> int | None:
    """What this host has left for a run: MemAvailable, or less where a cgroup (v2)
    limit leaves less room; None where neither says."""
    try:
        lines = Path(meminfo).read_text().splitlines()
    except OSError:
        lines = []
    kib = [int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")]
    known = [kib[0] * 1024] if kib else []
    try:
        limit = (Path(cgroup) / "memory.max").read_text().strip()
        used = int((Path(cgroup) / "memory.current").read_text())
        if limit != "max":
            known.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(known, default=None)
