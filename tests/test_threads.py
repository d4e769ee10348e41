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
