"""Each rank's thread budget (zero_ref/app/threads.py)."""

from __future__ import annotations


def test_a_childs_thread_budget_is_its_own_not_its_parents(monkeypatch):
    """A process that imported zero_ref set one rank's budget; the ranks mpirun starts
    from it must set their own (cores / ranks), while a user's setting still wins."""
    from zero_ref.app import threads

    monkeypatch.setattr(threads, "threads_per_rank", lambda: 1)
    parent_set = {"OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2"}
    env = {**parent_set, "ZERO_REF_THREAD_BUDGET": "2", "MKL_NUM_THREADS": "3"}
    threads.apply_default_thread_budget(env)
    assert (env["OMP_NUM_THREADS"], env["NUMBA_NUM_THREADS"]) == ("1", "1")
    assert env["MKL_NUM_THREADS"] == "3" and env["OPENBLAS_NUM_THREADS"] == "1"
    user = {"OMP_NUM_THREADS": "2"}
    threads.apply_default_thread_budget(user)
    assert user["OMP_NUM_THREADS"] == "2"


def test_once_mpi_counts_the_ranks_on_the_host_numba_and_blas_follow(monkeypatch):
    """Issue 14: the launcher's variables can overcount (srun without
    --ntasks-per-node); MPI's count of the ranks sharing the host, and the CPUs this
    process may use, set the threads once MPI is up."""
    import numba
    from threadpoolctl import threadpool_info

    from zero_ref.app import threads

    before = numba.get_num_threads()
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)
    ours = threads.os.environ.get("ZERO_REF_THREAD_BUDGET", "1")
    monkeypatch.setenv("ZERO_REF_THREAD_BUDGET", ours)  # settle rewrites these: restored after
    for var in threads._THREAD_VARS:
        monkeypatch.setenv(var, ours)
    try:
        budget = threads.settle_thread_budget(8)  # 8 CPUs, 8 ranks here: one thread each
        assert budget.threads == 1 and not budget.user_set
        assert numba.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
        assert budget.describe() == "1 thread per rank (8 usable CPUs / 8 ranks on this host)"
    finally:
        numba.set_num_threads(before)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the user's choice wins, and is shown
    budget = threads.settle_thread_budget(8)
    assert budget.user_set and "OMP_NUM_THREADS=7" in budget.describe()


def test_usable_cpus_are_the_affinity_mask():
    import os

    from zero_ref.app.threads import usable_cpus

    assert usable_cpus() == len(os.sched_getaffinity(0))
