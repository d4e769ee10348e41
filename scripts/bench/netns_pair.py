"""Two hosts on one Linux machine, from Python: scripts/bench/netns_hosts.sh's functions, plus
what a benchmark needs beside them (root needed).

scripts/bench/netns_hosts.sh makes the hosts (namespaces P_h1 and P_h2 joined by a veth P0,
host names Ph1 and Ph2), sets tbf on the link, runs mpiexec across both and removes it
all; each of its functions is called here through `bash -c 'source ...; nh_...'`. Added
here: the veth's byte counters read cheaply (from /proc/PID/net/dev of a process held in
the first host, a file read instead of the library's `nh_bytes`, which starts processes:
scripts/bench/bench_overlap.py reads them once per training step), and the rank placement
(blocks or cyclic) as Hydra's host list. `with NetnsPair(...)` removes everything it
made, whatever happens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent / "netns_hosts.sh"
PLACEMENTS = ("block", "cyclic")


class NetnsError(RuntimeError):
    """The namespaces could not be made (not root, no `ip`, no netns support)."""


def nh(*args: str) -> str:
    """One of netns_hosts.sh's functions, e.g. nh("nh_rate", "zrn", "100mbit")."""
    cmd = ["bash", "-c", 'source "$0"; "$@"', str(LIBRARY), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise NetnsError(f"{' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (netns_hosts.sh's nh_available), or None."""
    try:
        nh("nh_available")
    except NetnsError as exc:
        return str(exc)
    return None


def tbf_burst(burst_bytes: int) -> str:
    """tbf's burst: at least one 1500-byte frame (tbf holds a larger packet forever)."""
    if burst_bytes < 1600:
        raise ValueError(f"tbf burst {burst_bytes} bytes: at least 1600 (one 1500-byte frame)")
    return str(burst_bytes)


class NetnsPair:
    """Hosts PREFIXh1 (SUBNET.1) and PREFIXh2 (SUBNET.2), joined by veth PREFIX0."""

    def __init__(self, prefix: str = "zrn", subnet: str = "10.81.0") -> None:
        if not prefix.isalnum() or len(prefix) > 12:
            raise ValueError(f"prefix {prefix!r}: letters and digits, at most 12")
        self.prefix, self.subnet = prefix, subnet
        self.ns = (f"{prefix}_h1", f"{prefix}_h2")
        self.hosts = (f"{prefix}h1", f"{prefix}h2")
        self.addr = (f"{subnet}.1", f"{subnet}.2")
        self.dev = f"{prefix}0"
        self.holder: subprocess.Popen | None = None
        self.rate_mbit: float | None = None

    def __enter__(self) -> NetnsPair:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        why = unavailable()
        if why:
            raise NetnsError(why)
        nh("nh_make", self.prefix, self.subnet)
        self.holder = subprocess.Popen(["ip", "netns", "exec", self.ns[0], "sleep", "infinity"])
        self.counters()  # the holder's /proc/PID/net/dev shows the veth

    def set_rate(self, rate_mbit: float | None, burst_bytes: int = 1600) -> None:
        """tbf at rate_mbit on both ends (each direction limited); None: unlimited."""
        if rate_mbit is None:
            nh("nh_rate", self.prefix, "off")
        elif not rate_mbit > 0:
            raise ValueError(f"link rate {rate_mbit!r} Mbit/s: must be > 0")
        else:
            nh("nh_rate", self.prefix, f"{rate_mbit:g}mbit", tbf_burst(burst_bytes), "50ms")
        self.rate_mbit = rate_mbit

    def counters(self) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of the veth's end in the first host."""
        assert self.holder is not None, "open() first"
        for _ in range(100):  # the holder enters the namespace a moment after it starts
            text = Path(f"/proc/{self.holder.pid}/net/dev").read_text()
            for line in text.splitlines():
                name, _, rest = line.partition(":")
                if name.strip() == self.dev:
                    fields = rest.split()
                    return int(fields[0]), int(fields[8])
            subprocess.run(["sleep", "0.02"])
        raise NetnsError(f"{self.dev} not in the first host's /proc/net/dev")

    def mpiexec(
        self, per_host: int, argv: list[str], env: dict[str, str], placement: str = "block"
    ) -> list[str]:
        """The command that runs argv on 2 x per_host ranks across the hosts (netns_hosts.sh's
        nh_mpiexec: UCX over TCP on the veth, this environment for every rank; env's
        PYTHON must be the interpreter beside mpiexec). placement "block": ranks
        0..per_host-1 on the first host; "cyclic": even ranks on the first host."""
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r}: allowed are {', '.join(PLACEMENTS)}")
        if env.get("PYTHON") != sys.executable:
            raise ValueError("env['PYTHON'] must be sys.executable (nh_mpiexec's mpiexec)")
        slots = per_host if placement == "block" else 1  # Hydra wraps round the host list
        hosts = ",".join(f"{h}:{slots}" for h in self.hosts)
        lib = ["bash", "-c", 'source "$0"; "$@"', str(LIBRARY)]
        return [*lib, "nh_mpiexec", self.prefix, hosts, "-n", str(2 * per_host), *argv]

    def host_cmd(self, host: int, argv: list[str]) -> list[str]:
        """argv run inside host 0 or 1."""
        return [
            "bash",
            "-c",
            'source "$0"; "$@"',
            str(LIBRARY),
            "nh_exec",
            self.prefix,
            str(host + 1),
            *argv,
        ]

    def close(self) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
            self.holder = None
        nh("nh_cleanup", self.prefix)
