"""Each rank's thread budget (zero_ref/runtime/threads.py)."""

from __future__ import annotations


def test_a_childs_thread_budget_is_its_own_not_its_parents(monkeypatch):
    """A process that imported zero_ref set one rank's budget; the ranks mpirun starts
    from it must set their own (cores / ranks), while a user's setting still wins."""
    from zero_ref.runtime import threads

    monkeypatch.setattr(threads, "threads_per_rank", lambda: 1)
    parent_set = {"OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2"}
    marker = {"ZERO_REF_THREAD_VARS": "NUMBA_NUM_THREADS,OMP_NUM_THREADS"}
    env = {**parent_set, **marker, "MKL_NUM_THREADS": "3"}
    threads.apply_default_thread_budget(env)
    assert (env["OMP_NUM_THREADS"], env["NUMBA_NUM_THREADS"]) == ("1", "1")
    assert env["MKL_NUM_THREADS"] == "3" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert "MKL_NUM_THREADS" not in env["ZERO_REF_THREAD_VARS"]  # the user's, by name
    user = {"OMP_NUM_THREADS": "1"}  # the user's value equals the budget: still the user's
    threads.apply_default_thread_budget(user)
    assert user["OMP_NUM_THREADS"] == "1" and "OMP" not in user["ZERO_REF_THREAD_VARS"]


def test_once_mpi_counts_the_ranks_on_the_host_numba_and_blas_follow(monkeypatch):
    """Issue 14: the launcher's variables can overcount (srun without
    --ntasks-per-node); MPI's count of the ranks sharing the host, and the CPUs this
    process may use, set the threads once MPI is up."""
    import numba
    from threadpoolctl import threadpool_info

    from zero_ref.runtime import threads

    before = numba.get_num_threads()
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)
    names = ",".join(threads._THREAD_VARS)  # as if zero_ref had set all of them
    monkeypatch.setenv("ZERO_REF_THREAD_VARS", names)  # settle rewrites these: restored after
    for var in threads._THREAD_VARS:
        monkeypatch.setenv(var, threads.os.environ.get(var, "1"))
    try:
        budget = threads.settle_thread_budget(8)  # 8 CPUs, 8 ranks here: one thread each
        assert budget.threads == 1 and not budget.user_set
        assert numba.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
        assert budget.describe() == "1 thread per rank (8 usable CPUs / 8 ranks on this host)"
        numba_env = threads.os.environ["NUMBA_NUM_THREADS"]
        assert numba_env == str(numba.config.NUMBA_NUM_THREADS)  # untouched: see below
    finally:
        numba.set_num_threads(before)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the user's choice (not in zero_ref's list)
    others = [v for v in threads._THREAD_VARS if v != "OMP_NUM_THREADS"]
    monkeypatch.setenv("ZERO_REF_THREAD_VARS", ",".join(others))  # wins, and is shown
    budget = threads.settle_thread_budget(8)
    assert budget.user_set and "OMP_NUM_THREADS=7" in budget.describe()


def test_usable_cpus_are_the_affinity_mask():
    import os

    from zero_ref.runtime.threads import usable_cpus

    assert usable_cpus() == len(os.sched_getaffinity(0))


def test_numba_compiles_after_the_budget_is_settled(tmp_path):
    """Numba re-reads NUMBA_NUM_THREADS at every compile and refuses a value other than
    its pool's: settling the budget must not change it (a fresh cache, launcher counts
    off: a compile after the settle crashed every rank before the fix)."""
    import subprocess

    from tests.mpi_pool import REPO, mpi_env, mpirun_command

    env = {**mpi_env(), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    cmd = mpirun_command(
        2,
        "-m",
        "zero_ref.train",
        "--model",
        "mlp",
        "--steps",
        "2",
        "--stage",
        "1",
        "--batch-size",
        "4",
        "--quiet",
        "--sample-chars",
        "0",
    )
    cmd = [*cmd[:3], "env", "-u", "MPI_LOCALNRANKS", *cmd[3:]]  # the launcher says nothing
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
