"""Two hosts on one Linux machine, for benchmarks that need a network that costs (root).

Python's twin of scripts/two_host_check.sh's setup: two network namespaces joined by a
veth pair, a launcher that lets Hydra's rsh start a proxy inside a namespace, the link's
rate set with tbf on both ends (netem does not work on this kernel; tbf does), and the
veth's byte counters read cheaply (from /proc/PID/net/dev of a process held in the first
namespace, so a counter read is a file read, not a process start). The hosts are named
by their addresses, so /etc/hosts is never touched. Everything made here is removed by
close(), which `with NetnsPair(...)` calls whatever happens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = """#!/usr/bin/env bash
# Hydra starts a remote proxy as `LAUNCHER <host> <command line>`, as it would call rsh.
host=$1; shift
case "$host" in
{cases}
  *) echo "netns launcher: unknown host $host" >&2; exit 2;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


PLACEMENTS = ("block", "cyclic")


class NetnsError(RuntimeError):
    """The namespaces could not be made (not root, no `ip`, no netns support)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def _tc(ns: str, *args: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if done.returncode:
        raise NetnsError(f"`tc {' '.join(args)}` in {ns} failed: {done.stderr.strip()}")


def tbf_args(rate_mbit: float, burst_bytes: int) -> list[str]:
    """tbf's rate, burst and latency for a link of rate_mbit Mbit/s.

    latency 50 ms: the queue TCP may fill before tbf drops."""
    if not rate_mbit > 0:
        raise ValueError(f"link rate {rate_mbit!r} Mbit/s: must be > 0")
    if burst_bytes < 1600:
        raise ValueError(f"tbf burst {burst_bytes} bytes: at least 1600 (one 1500-byte frame)")
    return ["rate", f"{rate_mbit:g}mbit", "burst", str(burst_bytes), "latency", "50ms"]


class NetnsPair:
    """Hosts PREFIXh1 (ADDR.1) and PREFIXh2 (ADDR.2), joined by veth PREFIX0."""

    def __init__(self, prefix: str = "zrn_", subnet: str = "10.81.0") -> None:
        self.ns = (f"{prefix}h1", f"{prefix}h2")
        self.dev = f"{prefix.rstrip('_')}0"
        if len(self.dev) > 15:
            raise ValueError(f"prefix {prefix!r}: the veth name {self.dev!r} is over 15 chars")
        self.addr = (f"{subnet}.1", f"{subnet}.2")
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}netns_"))
        self.launcher = self.tmp / "rsh"
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
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root (this process is not)")
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise NetnsError("`ip` and `tc` (iproute2) are needed and not on PATH")
        self._remove_namespaces()  # leftovers of an interrupted earlier run
        h1, h2 = self.ns
        _ip("netns", "add", h1)
        _ip("netns", "add", h2)
        _ip(
            "link",
            "add",
            self.dev,
            "netns",
            h1,
            "type",
            "veth",
            "peer",
            "name",
            self.dev,
            "netns",
            h2,
        )
        for ns, addr in zip(self.ns, self.addr, strict=True):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", self.dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", self.dev, "up")
        self.holder = subprocess.Popen(["ip", "netns", "exec", h1, "sleep", "infinity"])
        self._wait_up()
        cases = "\n".join(f"  {a}) ns={n};;" for a, n in zip(self.addr, self.ns, strict=True))
        self.launcher.write_text(LAUNCHER.format(cases=cases))
        self.launcher.chmod(0o755)

    def _wait_up(self) -> None:
        """A veth comes up a moment after `link set up`; UCX skips a device that is down."""
        for _ in range(100):
            states = [self._read(ns, f"/sys/class/net/{self.dev}/operstate") for ns in self.ns]
            if states == ["up", "up"] and self._net_dev_ready():
                return
            time.sleep(0.05)
        raise NetnsError(f"{self.dev} did not come up in both namespaces within 5 s")

    def _net_dev_ready(self) -> bool:
        try:
            self.counters()
        except (OSError, KeyError):
            return False
        return True

    @staticmethod
    def _read(ns: str, path: str) -> str:
        done = subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True)
        return done.stdout.decode().strip()

    def set_rate(self, rate_mbit: float | None, burst_bytes: int = 1600) -> None:
        """tbf at rate_mbit on both ends (each direction limited); None: unlimited."""
        for ns in self.ns:
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", self.dev, "root"],
                capture_output=True,
            )
            if rate_mbit is not None:
                _tc(
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    self.dev,
                    "root",
                    "tbf",
                    *tbf_args(rate_mbit, burst_bytes),
                )
        self.rate_mbit = rate_mbit

    def counters(self) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of the veth's end in the first host."""
        assert self.holder is not None, "open() first"
        for line in Path(f"/proc/{self.holder.pid}/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == self.dev:
                fields = rest.split()
                return int(fields[0]), int(fields[8])
        raise KeyError(f"{self.dev} not in the first host's /proc/net/dev")

    def mpiexec(
        self, per_host: int, argv: list[str], env: dict[str, str], placement: str = "block"
    ) -> list[str]:
        """The command that runs argv on 2 x per_host ranks, with UCX forced onto TCP over
        the veth (so the hosts' ranks really exchange their bytes over the link) and env
        passed to every rank. placement "block": ranks 0..per_host-1 on the first host;
        "cyclic": even ranks on the first host, odd ranks on the second."""
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r}: allowed are {', '.join(PLACEMENTS)}")
        mpiexec = Path(sys.executable).with_name("mpiexec")
        genv = {**env, "UCX_TLS": "tcp", "UCX_NET_DEVICES": self.dev}
        slots = per_host if placement == "block" else 1  # Hydra wraps round the host list
        hosts = ",".join(f"{a}:{slots}" for a in self.addr)
        cmd = ["ip", "netns", "exec", self.ns[0], str(mpiexec), "-launcher", "rsh"]
        cmd += ["-launcher-exec", str(self.launcher), "-localhost", self.addr[0]]
        cmd += ["-hosts", hosts, "-n", str(2 * per_host)]
        for k, v in genv.items():
            cmd += ["-genv", k, v]
        return cmd + argv

    def host_cmd(self, host: int, argv: list[str]) -> list[str]:
        """argv run inside host 0 or 1."""
        return ["ip", "netns", "exec", self.ns[host], *argv]

    def _remove_namespaces(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def close(self) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
            self.holder = None
        self._remove_namespaces()
        shutil.rmtree(self.tmp, ignore_errors=True)
