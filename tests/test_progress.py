"""zero_ref.comm.progress: each progress policy moves a non-blocking collective while the
main thread makes no MPI call (and "none" does not), the values never depend on the mode,
the thread policies refuse a thread level or launch that cannot work, and close() ends
the thread. The in-process tests run on COMM_SELF and a copy of COMM_WORLD; the
arrival checks need two real ranks (tests/mpi_progress_check.py under mpirun)."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi_pool import REPO, mpi_env, run_mpi_checks
from zero_ref.comm.progress import (
    ASYNC_VARS,
    PROGRESS_MODES,
    ProgressSetupError,
    ThreadProgress,
    mpich_async_requested,
    progress_for,
)

IN_PROCESS_MODES = ("test", "thread", "none")  # "mpich" needs a launch that sets its variable


def test_ranks_poked_or_polled_receive_before_waiting():
    """test/thread: the other rank's block arrives with no MPI call but poke(); none: not."""
    run_mpi_checks("mpi_progress_check.py", 2, timeout=180)


def test_mpich_progress_thread_receives_before_waiting():
    run_mpi_checks("mpi_progress_check.py", 2, timeout=180, MPIR_CVAR_ASYNC_PROGRESS="1")


@pytest.mark.parametrize("mode", IN_PROCESS_MODES)
def test_values_do_not_depend_on_the_mode(mode, mpi_comm):
    rng = np.random.default_rng(7)
    send = rng.standard_normal(1009).astype(np.float32)
    want = np.empty(mpi_comm.size * send.size, np.float32)
    mpi_comm.Allgather(send, want)
    got = np.full_like(want, np.nan)
    progress = progress_for(mode, mpi_comm)
    request = mpi_comm.Iallgather(send, got)
    progress.started(request)
    progress.poke()
    request.Wait()
    progress.finished(request)
    progress.close()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_policy_never_completes_the_engines_request(mpi_comm):
    """The engine waits each request exactly once: pokes must not null its handle."""
    progress = progress_for("test", mpi_comm)
    request = mpi_comm.Ibarrier()
    progress.started(request)
    for _ in range(50):
        progress.poke()
    assert request != MPI.REQUEST_NULL
    request.Wait()
    progress.finished(request)
    progress.close()
    progress.close()  # a second close is harmless
    assert progress.pokes == 50


def test_close_joins_the_thread(mpi_comm):
    progress = progress_for("thread", mpi_comm)
    assert isinstance(progress, ThreadProgress)
    request = mpi_comm.Ibarrier()
    progress.started(request)
    request.Wait()
    progress.finished(request)
    assert progress.thread.is_alive()
    progress.close()
    assert not progress.thread.is_alive()
    assert progress.thread not in threading.enumerate()
    progress.close()  # a second close is harmless


def test_a_request_is_finished_once():
    progress = progress_for("none", MPI.COMM_SELF)
    request = MPI.COMM_SELF.Ibarrier()
    progress.started(request)
    request.Wait()
    progress.finished(request)
    with pytest.raises(ValueError, match="exactly once"):
        progress.finished(request)


def test_unknown_mode_and_options_are_refused():
    with pytest.raises(ValueError, match="test, thread, mpich, none"):
        progress_for("async", MPI.COMM_SELF)
    with pytest.raises(ValueError, match="takes no options"):
        progress_for("test", MPI.COMM_SELF, poll_s=0.001)
    with pytest.raises(ValueError, match="poll_s must be >= 0"):
        progress_for("thread", MPI.COMM_SELF, poll_s=-1.0)
    assert PROGRESS_MODES == ("test", "thread", "mpich", "none")


def test_mpich_refuses_without_its_variable(monkeypatch):
    for var in ASYNC_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not mpich_async_requested()
    with pytest.raises(ProgressSetupError, match="-genv MPIR_CVAR_ASYNC_PROGRESS 1"):
        progress_for("mpich", MPI.COMM_SELF)


def test_mpich_variable_is_read_as_mpich_reads_a_boolean():
    assert mpich_async_requested({"MPIR_CVAR_ASYNC_PROGRESS": "1"})
    assert mpich_async_requested({"MPICH_ASYNC_PROGRESS": "yes"})
    assert not mpich_async_requested({"MPIR_CVAR_ASYNC_PROGRESS": "0"})
    assert not mpich_async_requested({})


def single_threaded_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """code run in a fresh Python whose MPI was initialised with MPI_THREAD_SINGLE."""
    prologue = "import mpi4py; mpi4py.rc.thread_level = 'single'; from mpi4py import MPI\n"
    return subprocess.run(
        [sys.executable, "-c", prologue + code],
        cwd=REPO,
        env={**mpi_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_thread_mode_refuses_without_thread_multiple():
    code = (
        "from zero_ref.comm.progress import progress_for\n"
        "assert MPI.Query_thread() == MPI.THREAD_SINGLE, MPI.Query_thread()\n"
        "progress_for('thread', MPI.COMM_WORLD)\n"
    )
    done = single_threaded_python(code)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "ProgressSetupError" in done.stderr, done.stderr
    assert "needs MPI_THREAD_MULTIPLE" in done.stderr, done.stderr
    assert "MPI_THREAD_SINGLE" in done.stderr, done.stderr


def test_mpich_variable_raises_the_thread_level_itself():
    """MPICH's cvar doc: setting MPIR_CVAR_ASYNC_PROGRESS raises the thread level to
    MULTIPLE, so "mpich" works even where mpi4py asked for less."""
    code = (
        "from zero_ref.comm.progress import progress_for\n"
        "assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()\n"
        "p = progress_for('mpich', MPI.COMM_WORLD); p.close(); print('ok')\n"
    )
    done = single_threaded_python(code, MPIR_CVAR_ASYNC_PROGRESS="1")
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr


def test_test_mode_works_single_threaded():
    code = (
        "from zero_ref.comm.progress import progress_for\n"
        "p = progress_for('test', MPI.COMM_WORLD)\n"
        "r = MPI.COMM_WORLD.Ibarrier(); p.started(r); p.poke(); r.Wait(); p.finished(r)\n"
        "p.close(); print('ok')\n"
    )
    done = single_threaded_python(code)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr
