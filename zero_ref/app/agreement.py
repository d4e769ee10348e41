"""Before training, the ranks agree that they are training the same job.

Every rank reads its flags, its corpus and its initial parameters itself. On
one host they agree by construction; across hosts they may not: the default
corpus comes from the local Python's `pydoc_data`, so two Python versions
build two corpora, and a file at the same path may hold other bytes. Then the
run trains silently wrong (the same characters, different text: an export off
by up to 0.019, exit 0) or fails deep inside MPI ("Message truncated" in a
reduce-scatter, when the character sets differ and so do the model's sizes).

So before the first collective of training each rank hashes what defines the
job, and one small all-gather compares the hashes: the corpus, the
vocabulary, the initial parameters (the --init file, the --resume
checkpoint's manifest and file sizes, or for random ones the seed, the
parameter shapes and a probe of the random generator, which a NumPy version
could change), the resolved configuration and the zero_ref version. Any
difference ends the job on every rank with one message naming what differs,
which ranks hold which value and on which hosts.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections import defaultdict
from pathlib import Path

import numpy as np

from zero_ref.models.unit import named_shapes


class JobMismatchError(ValueError):
    """The ranks disagree on the job (bad input, found by every rank before training)."""


def digest(data: bytes | str) -> str:
    """A short, stable hash (the first 16 hex digits of SHA-256)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """A file's hash, read in 1 MiB pieces (no more of it in memory at once)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            h.update(piece)
    return h.hexdigest()[:16]


def checkpoint_digest(folder: str | Path) -> str:
    """The checkpoint a rank will load: its resolved folder's name (step_000123, not
    the `latest` pointer) and its manifest, which records every rank file's size and
    CRC (hashing the rank files whole would read the checkpoint twice)."""
    folder = Path(folder)
    return digest(folder.name + (folder / "manifest.json").read_text())


def random_init_digest(seed: int, shapes: list[tuple[str, tuple[int, ...]]]) -> str:
    """What random initial parameters depend on: the seed, the shapes, and the
    generator itself (a probe of its first draws: another NumPy could differ)."""
    probe = np.random.default_rng(seed).standard_normal(16).tobytes()
    return digest(json.dumps([seed, shapes]).encode() + probe)


def job_parts(
    run, zero, model, vocab_chars: str, tokens: np.ndarray, version: str, checkpoint=None
) -> dict:
    """{what: hash} for everything that defines the job on this rank; checkpoint: the
    opened --resume checkpoint (zero_ref/checkpoint/reader.py), its tag resolved."""
    if checkpoint is not None:
        init = "checkpoint " + checkpoint_digest(checkpoint.folder)
    elif run.init:
        init = "file " + file_digest(run.init)
    else:
        init = "random " + random_init_digest(run.seed, named_shapes(model))
    return {
        # the text: its token ids mean nothing without their characters (an all-caps copy
        # of a text has the same ids)
        "corpus": digest(vocab_chars.encode("utf-8") + np.ascontiguousarray(tokens).tobytes()),
        "vocabulary": digest(vocab_chars),
        "initial parameters": init,
        "configuration": digest(repr(run) + repr(zero)),
        "zero_ref version": version,
    }


def disagreements(everyone: list[dict]) -> list[str]:
    """Each part whose hash differs across ranks, as 'part: ranks 0-1 (host a) have x;
    ranks 2-3 (host b) have y'. everyone[r] = {"host": str, "parts": {name: hash}}."""
    lines = []
    for part in everyone[0]["parts"]:
        groups: dict[str, list[int]] = defaultdict(list)
        for rank, mine in enumerate(everyone):
            groups[mine["parts"].get(part, "(missing)")].append(rank)
        if len(groups) > 1:
            sides = [
                f"{_ranks(ranks)} ({_hosts(everyone, ranks)}) "
                f"{'has' if len(ranks) == 1 else 'have'} {value}"
                for value, ranks in groups.items()
            ]
            lines.append(f"{part}: " + "; ".join(sides))
    return lines


def check_same_job(mpi_comm, parts: dict[str, str]) -> None:
    """All-gather every rank's hashes; JobMismatchError on every rank if any differ.
    A collective: every rank calls it, before the first collective of training."""
    mine = {"host": socket.gethostname(), "parts": parts}
    everyone = mpi_comm.allgather(mine)  # a few hundred bytes, once: not the hot path
    lines = disagreements(everyone)
    if lines:
        raise JobMismatchError(
            "the ranks are not training the same job (hosts must have the same corpus, "
            "initial parameters, configuration and zero_ref; docs/multihost.md):\n  "
            + "\n  ".join(lines)
        )


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _hosts(everyone: list[dict], ranks: list[int]) -> str:
    hosts = sorted({everyone[r]["host"] for r in ranks})
    return ("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts)
