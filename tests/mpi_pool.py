"""Long-lived MPI jobs that run test cases, so hypothesis can try hundreds of
cases without paying mpirun's start-up for each."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).with_name("mpi_worker.py")
REPO = WORKER.parent.parent


def mpirun() -> str:
    """The mpirun installed beside this Python (the mpich wheel puts it there, where a
    fresh shell may not have it on PATH yet), else the one on PATH."""
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.exists() else "mpirun"


def mpirun_command(world: int, *args: str) -> list[str]:
    """mpirun for `world` ranks of this Python; oversubscribing a small machine is fine."""
    return [mpirun(), "-n", str(world), sys.executable, *args]


def mpi_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    return env


class MPIPool:
    """One mpirun job of `world` ranks running tests/mpi_worker.py."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.proc: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (a pipe could fill up)

    def _start(self) -> None:
        self.stderr.seek(0)
        self.stderr.truncate()
        self.proc = subprocess.Popen(
            mpirun_command(self.world, str(WORKER)),
            cwd=REPO,
            env=mpi_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )

    def run(self, case: dict, timeout: float = 120.0) -> dict:
        """Send a case, wait for its RESULT line; on a crash or timeout, raise with stderr."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else ""
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
            if not line:
                err = self._kill()
                raise RuntimeError(
                    f"MPI worker ({self.world} ranks) died or timed out on {case}:\n{err}"
                )

    def _kill(self) -> str:
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()
