"""Who moves a non-blocking collective's bytes while compute runs: the progress policy.

ZeRO's communication is cheap only if it overlaps compute (Sec. 7 of the paper counts
stage 3's traffic at 1.5x plain data parallelism; DeepSpeed hides it with overlap_comm and
stage 3's prefetch). An MPI non-blocking collective makes no promise of overlap: MPICH
advances it only inside an MPI call (its progress engine runs in MPI_Test, MPI_Wait, ...),
unless MPICH's own progress thread is started (MPIR_CVAR_ASYNC_PROGRESS=1,
src/mpi/init/init_async.c). So someone has to call into MPI while NumPy computes. The
policies here are the ways to do that; docs/overlap_progress.md has the measurement that
chose the default.

  test    poke() calls MPI_Test; the engine pokes at unit boundaries. The default: on
          4 ranks sharing 2 cores across a 200 Mbit/s link it hid 0.54-0.94 of each
          collective of 4 MiB or more, more than either thread below.
  thread  a Python thread calls MPI_Test in a loop while compute releases the GIL
          (BLAS and Numba nogil kernels do). Needs MPI_THREAD_MULTIPLE.
  mpich   MPICH's own progress thread (MPIR_CVAR_ASYNC_PROGRESS=1 at MPI_Init).
  none    nothing: the collective moves only when the engine waits (the baseline).

The policies never touch the engine's requests. MPI forbids one request in two
concurrent completion calls (a Wait in the engine and a Test in a poll thread), and a
Test that completes a request would change the engine's handle under it (the engine
waits each request exactly once). So test and thread drive MPICH's progress engine by
testing a private request that never completes (a receive posted on a private copy of
COMM_SELF): MPI_Test runs the progress engine for every pending operation, not only for
the request it is given. started()/finished() only count what is in flight, so that a
poke with nothing in flight costs nothing and the thread sleeps while idle.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol

from mpi4py import MPI

PROGRESS_MODES = ("test", "thread", "mpich", "none")


class ProgressSetupError(ValueError):
    """A progress mode this MPI library or launch cannot run (no MPI_THREAD_MULTIPLE, not
    MPICH, no MPIR_CVAR_ASYNC_PROGRESS): bad input, found before training on every rank
    (zero_ref/app/failure.py prints it once, exit 2), not a fault of the code."""


DEFAULT_PROGRESS = "test"  # measured: docs/overlap_progress.md
ASYNC_VARS = ("MPIR_CVAR_ASYNC_PROGRESS", "MPICH_ASYNC_PROGRESS")  # MPICH reads either name
# The thread's pause between tests. On 4 ranks sharing 2 cores, where a polling thread
# takes its CPU from compute, 1 ms beat 0.1 ms, which beat 0, a bare GIL yield
# (docs/overlap_progress.md).
POLL_S = 1e-3
_IDLE_WAIT_S = 0.05  # the thread's longest sleep while nothing is in flight


class ProgressPolicy(Protocol):
    """What the engine calls around each non-blocking collective."""

    name: str

    def started(self, request: MPI.Request) -> None:
        """A non-blocking collective was issued."""

    def poke(self) -> None:
        """A unit (or layer) boundary: a chance to advance what is in flight."""

    def finished(self, request: MPI.Request) -> None:
        """The engine waited the request; stop counting it."""

    def close(self) -> None:
        """Stop whatever runs in the background (before MPI_Finalize); the policy is
        unusable afterwards."""


class _OpenRequests:
    """The requests issued and not yet finished, under a lock (the thread reads it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[MPI.Request] = []

    def add(self, request: MPI.Request) -> None:
        with self.lock:
            self.requests.append(request)

    def remove(self, request: MPI.Request) -> None:
        with self.lock:
            for i, held in enumerate(self.requests):
                if held is request:
                    del self.requests[i]
                    return
        raise ValueError(
            "progress: finished() for a request that was not started() or was "
            "already finished (each request is started and finished exactly once)"
        )

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


class _Pump:
    """A receive that never matches, on a private copy of COMM_SELF: testing it runs
    MPICH's progress engine without touching any request the engine holds."""

    def __init__(self) -> None:
        self.comm = MPI.COMM_SELF.Dup()
        self.buf = bytearray(1)
        self.request = self.comm.Irecv(self.buf, source=0, tag=0)

    def pump(self) -> None:
        self.request.Test()

    def close(self) -> None:
        if self.comm == MPI.COMM_NULL:  # closed already
            return
        self.request.Cancel()
        self.request.Wait()
        self.comm.Free()


class NoProgress:
    """The baseline: a collective moves only inside the engine's Wait."""

    name = "none"

    def __init__(self) -> None:
        self.open_requests = _OpenRequests()

    def started(self, request: MPI.Request) -> None:
        self.open_requests.add(request)

    def poke(self) -> None:
        pass

    def finished(self, request: MPI.Request) -> None:
        self.open_requests.remove(request)

    def close(self) -> None:
        pass


class MpichProgress(NoProgress):
    """MPICH's progress thread advances everything; the engine need do nothing."""

    name = "mpich"

    def __init__(self) -> None:
        super().__init__()
        require_mpich_async()


class TestProgress(NoProgress):
    """MPI_Test at every poke while anything is in flight (no thread, any thread level)."""

    __test__ = False  # not a pytest class, whatever its name says
    name = "test"

    def __init__(self) -> None:
        super().__init__()
        self.pumper = _Pump()
        self.pokes = 0  # the pokes that called into MPI

    def poke(self) -> None:
        if self.open_requests.count():
            self.pumper.pump()
            self.pokes += 1

    def close(self) -> None:
        self.pumper.close()


class ThreadProgress(NoProgress):
    """A daemon thread calls MPI_Test while anything is in flight, POLL_S apart.

    It runs Python only while the main thread has released the GIL (inside BLAS, a
    Numba nogil kernel, or an MPI call), which is exactly when compute runs."""

    name = "thread"

    def __init__(self, poll_s: float = POLL_S) -> None:
        if poll_s < 0:
            raise ValueError(f"progress: poll_s must be >= 0 seconds, got {poll_s}")
        require_thread_multiple("thread")
        super().__init__()
        self.poll_s = poll_s
        self.pumper = _Pump()
        self.tests = 0  # MPI_Test calls the thread made (read after close)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="zero_ref-progress", daemon=True)
        self.thread.start()

    def started(self, request: MPI.Request) -> None:
        super().started(request)
        self.wake.set()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            if not self.open_requests.count():
                self.wake.wait(_IDLE_WAIT_S)
                self.wake.clear()
                continue
            self.pumper.pump()
            self.tests += 1
            time.sleep(self.poll_s)  # sleep(0) still lets the main thread take the GIL

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        self.stopping.set()
        self.wake.set()
        self.thread.join()
        self.pumper.close()


def require_thread_multiple(mode: str) -> None:
    """Raise unless MPI was initialised with MPI_THREAD_MULTIPLE."""
    names = {
        MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
        MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
        MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
        MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
    }
    level = MPI.Query_thread()
    if level != MPI.THREAD_MULTIPLE:
        raise ProgressSetupError(
            f"progress mode {mode!r} calls MPI from a second thread, which needs "
            f"MPI_THREAD_MULTIPLE, but MPI was initialised with {names.get(level, level)} "
            "(mpi4py asks for MULTIPLE unless mpi4py.rc.thread_level was changed before "
            "'from mpi4py import MPI'); use --progress test, which needs no thread"
        )


def mpich_async_requested(environ=os.environ) -> bool:
    """Whether the environment asks MPICH for its progress thread (as MPICH reads a
    boolean cvar: 1, true, yes or on)."""
    return any(environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ASYNC_VARS)


def require_mpich_async() -> None:
    """Raise unless MPICH's progress thread was asked for at MPI_Init and can run."""
    if "MPICH" not in MPI.Get_library_version():
        raise ProgressSetupError(
            "progress mode 'mpich' uses MPICH's progress thread, but this MPI is not MPICH: "
            + MPI.Get_library_version().splitlines()[0]
        )
    if not mpich_async_requested():
        raise ProgressSetupError(
            "progress mode 'mpich' needs MPICH's progress thread, started only when "
            "MPIR_CVAR_ASYNC_PROGRESS=1 is in every rank's environment before MPI_Init: "
            "launch with `mpirun -genv MPIR_CVAR_ASYNC_PROGRESS 1 -n N python ...` "
            "(or export it first), or use --progress test"
        )
    require_thread_multiple("mpich")  # MPICH prints a warning and starts no thread without it


def progress_for(mode: str, mpi_comm: MPI.Comm | None = None, **options) -> ProgressPolicy:
    """The progress policy named by mode (one of PROGRESS_MODES).

    mpi_comm: the engine's communicator (unused today: MPICH's progress is per process;
    kept so a policy could need it). options: poll_s for "thread"."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {', '.join(PROGRESS_MODES)}")
    if options and mode != "thread":
        raise ValueError(f"progress mode {mode!r} takes no options, got {sorted(options)}")
    if mode == "thread":
        return ThreadProgress(**options)
    return {"test": TestProgress, "mpich": MpichProgress, "none": NoProgress}[mode]()
