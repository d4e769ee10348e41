"""The --log-jsonl metrics log: one JSON object per line, at its real path.

A JSONL log is append-only by nature, so it is not written atomically: each
record is written and flushed as its step ends, so `tail -f` shows training as
it goes, and a run that dies keeps every step it logged (at most its last line
is cut short; readers skip a last line without its newline). Whole files --
exports, later checkpoints -- are still written atomically (zero_ref/io/atomic.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zero_ref.io.atomic import atomic_write_bytes


class JsonlLog:
    """A new log at `path` (an older file there is replaced), one record per line.

    `after_step` continues a resumed run's log instead: the step records up to
    that step are kept (rewritten atomically), later ones and the old run's
    final record are dropped (the resumed run redoes those steps), and new
    records are appended."""

    def __init__(self, path: str | os.PathLike[str], after_step: int | None = None) -> None:
        self.path = Path(path)
        mode = "w"
        if after_step is not None and self.path.exists():
            kept = [r for r in read_jsonl(self.path) if _before(r, after_step)]
            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in kept).encode())
            mode = "a"
        self.f = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed in close())

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()  # to the OS: readers see it now, and it survives this process

    def close(self) -> Path:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return self.path


def _before(record: dict, step: int) -> bool:
    return (
        not record.get("final") and isinstance(record.get("step"), int) and record["step"] <= step
    )


def read_jsonl(path: str | os.PathLike[str]) -> list[dict]:
    """Every complete record of a log, also of a run that died mid-line."""
    text = Path(path).read_text(encoding="utf-8")
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
