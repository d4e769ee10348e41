"""Issue 14: ranks on different hosts must be training the same job, or say why not.

The MPMD form of mpirun (`-n 1 cmd : -n 1 cmd`) gives each rank its own flags,
which is how two hosts with different files look to zero_ref."""

from __future__ import annotations

import sys

import pytest

from tests.mpi_pool import mpirun, run_watched
from zero_ref.app.agreement import JobMismatchError, check_same_job, disagreements

TRAIN = ["-m", "zero_ref.train", "--model", "mlp", "--steps", "2", "--quiet", "--sample-chars", "0"]
TEXT = "the quick brown fox jumps over the lazy dog\n" * 40


def two_ranks(args_0: list[str], args_1: list[str]) -> list[str]:
    """mpirun, rank 0 with args_0 and rank 1 with args_1."""
    return [mpirun(), "-n", "1", sys.executable, *args_0, ":", "-n", "1", sys.executable, *args_1]


def test_disagreements_name_the_part_the_ranks_and_the_hosts():
    same = {"corpus": "a", "configuration": "c"}
    everyone = [
        {"host": "h1", "parts": same},
        {"host": "h1", "parts": same},
        {"host": "h2", "parts": {"corpus": "b", "configuration": "c"}},
    ]
    assert disagreements(everyone) == [
        "corpus: ranks 0, 1 (host h1) have a; rank 2 (host h2) has b"
    ]
    assert disagreements(everyone[:2]) == []


def test_one_rank_agrees_with_itself():
    from mpi4py import MPI

    check_same_job(MPI.COMM_SELF, {"corpus": "x"})  # no error


@pytest.mark.parametrize(
    ("other_text", "differs", "agrees"),
    [
        ("".join(reversed(TEXT.splitlines(True))) + "dog the\n", ["corpus"], ["vocabulary"]),
        (TEXT.upper(), ["corpus", "vocabulary"], []),
    ],
    ids=["same-characters-other-text", "other-characters"],
)
def test_hosts_with_different_corpora_stop_before_training(tmp_path, other_text, differs, agrees):
    """The same characters in another text trained silently wrong before (exit 0);
    another character set failed inside MPI ('Message truncated'). Now: exit 2 and one
    message naming what differs, before any step."""
    mine, theirs = tmp_path / "a.txt", tmp_path / "b.txt"
    mine.write_text(TEXT)
    theirs.write_text(other_text)
    job = run_watched(two_ranks([*TRAIN, "--data", str(mine)], [*TRAIN, "--data", str(theirs)]))
    assert job.returncode == 2, job.stderr[-3000:]
    assert job.stderr.count("not training the same job") == 1, job.stderr[-3000:]
    for part in differs:
        assert f"{part}: rank 0 (host " in job.stderr
    for part in agrees:
        assert f"{part}:" not in job.stderr
    assert "Traceback" not in job.stderr and "step" not in job.stdout


def test_a_different_seed_on_one_host_is_named_too(tmp_path):
    job = run_watched(two_ranks([*TRAIN, "--seed", "1"], [*TRAIN, "--seed", "2"]))
    assert job.returncode == 2, job.stderr[-3000:]
    assert "initial parameters: rank 0" in job.stderr and "configuration: rank 0" in job.stderr


def test_the_error_is_bad_input():
    assert issubclass(JobMismatchError, ValueError)  # one line from rank 0, exit 2


def test_the_first_line_says_how_many_threads_and_why():
    """Ranks per host from MPI_Comm_split_type(COMM_TYPE_SHARED), CPUs from the affinity
    mask (taskset -c 0: one CPU for the whole job)."""
    from tests.mpi_pool import mpirun_command

    loud = [a for a in TRAIN if a != "--quiet"]  # the first line is the progress's
    job = run_watched(["taskset", "-c", "0", *mpirun_command(3, *loud, "--batch-size", "6")])
    assert job.returncode == 0, job.stderr[-3000:]
    assert "1 thread per rank (1 usable CPU / 3 ranks on this host)" in job.stdout


def test_ranks_resuming_different_steps_disagree(tmp_path):
    """The checkpoint a rank will load is named by its resolved step folder and its
    manifest, not by the folder holding `latest` (whose size is the same for every tag)."""
    from zero_ref.app.agreement import checkpoint_digest

    for tag in ("step_000010", "step_000020"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "manifest.json").write_text('{"same": "bytes"}')
    assert checkpoint_digest(tmp_path / "step_000010") != checkpoint_digest(
        tmp_path / "step_000020"
    )
