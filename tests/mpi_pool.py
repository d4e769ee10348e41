"""Running MPI jobs from tests: long-lived pools that run parity cases (so
hypothesis can try hundreds of cases without paying mpirun's start-up for each),
and one-off jobs (`run_watched`).

How fast a job runs depends on what else loads the machine: an mpirun that takes
17 s on an idle machine has taken 148 s on a loaded one. So no test here limits
a job's total time tightly. A job is stopped when it stops making progress, i.e.
prints no line for QUIET_LIMIT_S, and only a very generous JOB_LIMIT_S caps the
whole run; either way the message says which limit it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

WORKER = Path(__file__).with_name("mpi_worker.py")
REPO = WORKER.parent.parent

QUIET_LIMIT_S = 300.0  # a loaded machine slows a step by seconds; minutes of silence is a hang
JOB_LIMIT_S = 900.0  # a backstop for a job that prints forever


class JobStalled(AssertionError):
    """A job made no progress within a limit (the message names the limit)."""


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


def run_mpi_checks(script: str, world: int, timeout: int = 300, **env: str) -> None:
    """tests/<script> (built on tests/mpi_checks.py's run_checks) on `world` ranks: fails
    with the job's output unless rank 0 says every check passed. env: extra variables."""
    done = subprocess.run(
        mpirun_command(world, str(REPO / "tests" / script)),
        cwd=REPO,
        env={**mpi_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"all checks passed on {world} ranks" in done.stdout, done.stdout[-4000:]


class LineReader:
    """The lines of a child's pipes, read by one thread per pipe into a queue, so the
    caller can wait for the next line with a timeout. (select() on a buffered text
    pipe cannot do this: lines already in Python's buffer are invisible to it, so
    two lines arriving in one chunk would leave the second waiting for the timeout.)"""

    def __init__(self, **pipes: IO[str]) -> None:
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        for name, pipe in pipes.items():
            threading.Thread(target=self._read, args=(name, pipe), daemon=True).start()

    def _read(self, name: str, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.put((name, line))
        self.lines.put((name, None))  # the pipe's end

    def next(self, timeout: float) -> tuple[str, str | None] | None:
        """(pipe name, line), or (pipe name, None) at a pipe's end; None after
        `timeout` seconds without either."""
        try:
            return self.lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None


@dataclass
class Finished:
    """A one-off job that ended by itself."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float  # from start to exit
    ended_at: float  # unix time the exit was seen


def run_watched(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    quiet_s: float = QUIET_LIMIT_S,
    limit_s: float = JOB_LIMIT_S,
    end_after: tuple[str, float] | None = None,
) -> Finished:
    """Run cmd in its own process group to its end and return its output.

    Killed (the whole group) with JobStalled when it prints no line for quiet_s
    seconds, runs past limit_s in all, or, with end_after=(text, s), is still
    running s seconds after printing a line that contains text."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=REPO,
        env=mpi_env() if env is None else env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    reader = LineReader(stdout=proc.stdout, stderr=proc.stderr)
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    limits = [(start + limit_s, f"still running after {limit_s:.0f} s in all (the backstop)")]
    last_line, pipes_open = start, 2
    while pipes_open:
        quiet = (
            last_line + quiet_s,
            f"printed nothing for {quiet_s:.0f} s (a hang: load slows "
            "a job, it does not silence it for minutes)",
        )
        deadline, why = min([*limits, quiet])
        got = reader.next(deadline - time.monotonic()) if time.monotonic() < deadline else None
        if got is None:
            _kill_group(proc)
            raise JobStalled(_stalled_message(cmd, why, out))
        name, line = got
        last_line = time.monotonic()
        if line is None:
            pipes_open -= 1
            continue
        out[name].append(line)
        if end_after is not None and end_after[0] in line:
            seconds = end_after[1]
            limits.append(
                (last_line + seconds, f"still running {seconds:.0f} s after {line.strip()!r}")
            )
            end_after = None
    returncode = _wait_for_exit(proc, cmd, out, min(limits)[0])
    stdout, stderr = "".join(out["stdout"]), "".join(out["stderr"])
    return Finished(returncode, stdout, stderr, time.monotonic() - start, time.time())


def _wait_for_exit(proc: subprocess.Popen, cmd, out, deadline: float) -> int:
    """Both pipes are closed, so the job is ending; it still must end by the deadline."""
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise JobStalled(_stalled_message(cmd, "closed its output but did not exit", out)) from None


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stalled_message(cmd, why: str, out: dict[str, list[str]]) -> str:
    stdout, stderr = "".join(out["stdout"])[-2000:], "".join(out["stderr"])[-3000:]
    return (
        f"job {why}; killed it: {' '.join(cmd)}\n"
        f"--- stdout (end) ---\n{stdout}\n--- stderr (end) ---\n{stderr}"
    )


class MPIPool:
    """One mpirun job of `world` ranks running tests/mpi_worker.py."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.proc: subprocess.Popen | None = None
        self.reader: LineReader | None = None
        self.cases_sent = 0
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
            start_new_session=True,  # so that _kill can end the ranks too, not just mpirun
        )
        self.reader = LineReader(stdout=self.proc.stdout)

    def run(self, case: dict, quiet_s: float = QUIET_LIMIT_S) -> dict:
        """Send a case and wait for its RESULT line. The worker prints a line after
        every step, so a case fails for a crash, or for quiet_s seconds without a
        line (a hang), never for being slow; either way the message holds stderr."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.cases_sent += 1
        with contextlib.suppress(BrokenPipeError):  # it died: the reader sees the end below
            self.proc.stdin.write(json.dumps({**case, "case_id": self.cases_sent}) + "\n")
            self.proc.stdin.flush()
        while True:
            got = self.reader.next(quiet_s)
            if got is None:
                raise JobStalled(
                    f"MPI worker ({self.world} ranks) printed nothing for {quiet_s:.0f} s on "
                    f"{case} (a hang: a loaded machine slows a step, it does not stop it); "
                    f"killed it:\n{self._kill()}"
                )
            line = got[1]
            if line is None:
                raise RuntimeError(
                    f"MPI worker ({self.world} ranks) died on {case}:\n{self._kill()}"
                )
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
                if result["case_id"] != self.cases_sent:  # a stale line must never pass a case
                    raise RuntimeError(
                        f"MPI worker ({self.world} ranks) answered case {result['case_id']}, "
                        f"not case {self.cases_sent} {case}:\n{self._kill()}"
                    )
                return result

    def _kill(self) -> str:
        _kill_group(self.proc)
        self.proc = None
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._kill()
