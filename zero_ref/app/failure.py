"""When one rank fails, the whole job ends, with one message.

MPI has no notion of a failed rank. If one process raises and exits, the others
wait in their next collective forever: sys.exit(1) on one rank of four hangs
mpirun. FailureGuard wraps each rank's whole job so that never happens:

* An exception on one rank during training (any type, anywhere: model, engine,
  data, disk) prints the rank, the step and the error once, from that rank,
  then calls MPI_Abort: mpirun ends every rank within seconds, non-zero.
* An exception every rank raises together is printed once, by rank 0, and every
  rank exits cleanly: bad input found before training (every rank reads the
  same flags and files) and CollectiveError, which ranks decide collectively
  (a schedule mismatch, a NaN gradient). The guard first makes sure every rank
  really did fail, with a barrier on its own communicator and a deadline; if a
  rank is missing it aborts instead.
* Ctrl-C (SIGINT) and SIGTERM, which mpirun passes to every rank, end the job with
  one line, rank 0's, then an abort (zero_ref/app/interrupts.py).
* SystemExit passes through (argparse's --help and usage errors).
* A full disk (ENOSPC, EDQUOT, anywhere in the error's causes) is the machine's
  state, not a bug: its line (which names the file and the bytes) comes without
  the traceback.

A rank killed from outside (SIGKILL, the OOM killer) runs no Python at all;
there mpirun itself notices the dead process and kills the rest (measured in
docs/reliability.md). No module here imports mpi4py: the guard calls MPI
through the communicator it is given.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import signal
import stat
import sys
import termios
import time
import traceback
from typing import NoReturn

from zero_ref.app.interrupts import InterruptWatch
from zero_ref.runtime.errors import CollectiveError

INPUT_ERRORS = (ValueError, FileNotFoundError)  # bad flags, configs, files: no traceback
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no room on a disk: no traceback either
INJECT_FAULT_ENV = "ZERO_REF_INJECT_FAULT"  # zero_ref/app/faults.py reads it
AGREE_TIMEOUT_S = 5.0  # how long failed ranks wait for the others before aborting
DRAIN_TIMEOUT_S = 5.0  # the longest a failing rank waits for its message to leave the pipe
FORWARD_GRACE_S = 0.2  # then a moment for the launcher to pass it on, before the abort


class _StepInProgress:
    """The training step this process is in (None before the first), for the message."""

    step: int | None = None


_here = _StepInProgress()  # per process, like faulthandler's state: not the world


def step_started(step: int, engine=None) -> None:
    """Call at the top of each training step (1-based, as the log prints it).

    Remembers the step for the error message and, with an engine, fires the
    fault ZERO_REF_INJECT_FAULT asks for on this rank and step, if any."""
    if engine is not None and os.environ.get(INJECT_FAULT_ENV):
        from zero_ref.app.faults import inject_from_env  # only when a fault is asked for

        inject_from_env(step, engine)  # a malformed spec fails on every rank before step 1
    _here.step = step


class FailureGuard:
    """`with FailureGuard(MPI.COMM_WORLD, "zero_ref.train") as guard:` around a rank's job.

    After the block, guard.exit_code is 0, or the code to exit with when every
    rank failed together (2 for bad input, one of `input_errors` raised before
    training; 1 otherwise). A lone failure never returns: it aborts the job."""

    def __init__(
        self,
        mpi_comm,
        prog: str,
        input_errors: tuple[type[BaseException], ...] = INPUT_ERRORS,
        agree_timeout_s: float = AGREE_TIMEOUT_S,
    ) -> None:
        self.mpi, self.prog, self.input_errors = mpi_comm, prog, input_errors
        self.agree_timeout_s = agree_timeout_s
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        # Its own communicator: the guard's barrier can never pair with a job collective.
        self.agree_comm = mpi_comm.Dup()
        self.exit_code = 0
        self.interrupts = InterruptWatch(self.rank, self._say_interrupted, self._abort)

    def __enter__(self) -> FailureGuard:
        _here.step = None
        self.interrupts.start()
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if not isinstance(error, KeyboardInterrupt):
            self.interrupts.close()
        if error is None or isinstance(error, (SystemExit, GeneratorExit)):
            return False
        step = _here.step
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C: mpirun passes it to every rank
            self.interrupts.handle(signal.SIGINT)
        together = step is None or isinstance(error, CollectiveError)
        if together and self._every_rank_failed():
            if self.rank == 0:
                self._report_together(error, step)
            self.exit_code = 2 if step is None and isinstance(error, self.input_errors) else 1
            return True
        self._report_alone(error, step)
        self._abort(1)

    def _say_interrupted(self, signum: signal.Signals) -> None:
        _write_stderr(f"{self.prog}: interrupted {_where(_here.step)} ({signum.name})\n")
        wait_until_read(2, DRAIN_TIMEOUT_S)
        time.sleep(FORWARD_GRACE_S)

    def _abort(self, code: int) -> NoReturn:
        self.mpi.Abort(code)
        os._exit(code)  # MPI_Abort can return once an MPI error has broken the library

    def _every_rank_failed(self) -> bool:
        """Did every rank reach the guard within the deadline? (a non-blocking barrier)"""
        request = self.agree_comm.Ibarrier()
        deadline = time.monotonic() + self.agree_timeout_s
        while not request.Test():
            if time.monotonic() > deadline:
                return False  # some rank is still working, or waiting in a collective
            time.sleep(0.005)
        return True

    def _report_together(self, error: BaseException, step: int | None) -> None:
        if step is None and isinstance(error, self.input_errors):
            print(f"{self.prog}: error: {error}", file=sys.stderr, flush=True)
            return
        if not isinstance(error, CollectiveError):
            traceback.print_exception(error)
        print(
            f"{self.prog}: every rank stopped {_where(step)}: {type(error).__name__}: {error}",
            file=sys.stderr,
            flush=True,
        )

    def _report_alone(self, error: BaseException, step: int | None) -> None:
        """The summary line first, then the traceback, in one unbuffered write.

        MPI_Abort makes mpirun kill every rank, and whatever this rank's output
        pipe still holds may never reach the user: across two hosts a fixed
        pause lost it in 4 of 28 runs. So the rank writes the whole message at
        once and waits until the launcher's proxy has read all of it from the
        pipe (FIONREAD reaches 0) before aborting: Hydra's proxy passes what it
        read to mpiexec on the same connection it later passes the abort on,
        so the message is ahead of the abort."""
        summary = (
            f"{self.prog}: rank {self.rank} of {self.size} failed {_where(step)}: "
            f"{type(error).__name__}: {error} -- aborting all {self.size} ranks\n"
        )
        detail = ""
        if not isinstance(error, (*self.input_errors, CollectiveError)) and not disk_full(error):
            detail = "".join(traceback.format_exception(error))
        _write_stderr(summary + detail)
        wait_until_read(2, DRAIN_TIMEOUT_S)
        time.sleep(FORWARD_GRACE_S)


def disk_full(error: BaseException) -> bool:
    """Is `error`, or an error it was raised from, an OSError for a full disk?"""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return True
        error = error.__cause__ or error.__context__
    return False


def _write_stderr(text: str) -> None:
    """Write text to file descriptor 2 directly, bypassing Python's buffers."""
    sys.stderr.flush()
    data = text.encode("utf-8", "replace")
    while data:
        data = data[os.write(2, data) :]


def unread_bytes(fd: int) -> int:
    """Bytes written to fd (a pipe or socket) that its reader has not read yet; 0 for
    anything else (a terminal or a file: nothing is waiting to be forwarded). A pipe
    answers FIONREAD for what sits in it; a socket answers TIOCOUTQ (SIOCOUTQ) for
    what it has not yet handed on (its FIONREAD would count what came in)."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            request = termios.FIONREAD
        elif stat.S_ISSOCK(mode):
            request = termios.TIOCOUTQ
        else:
            return 0
        count = array.array("i", [0])
        fcntl.ioctl(fd, request, count)
        return count[0]
    except OSError:
        return 0  # closed, or no FIONREAD here: nothing more to wait for


def wait_until_read(fd: int, timeout_s: float) -> bool:
    """Wait until the reader of fd has taken everything written to it (True), or
    timeout_s passed (False: a reader that stopped reading must not hang the abort)."""
    deadline = time.monotonic() + timeout_s
    while unread_bytes(fd):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _where(step: int | None) -> str:
    return "before training" if step is None else f"at step {step}"
