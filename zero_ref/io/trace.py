"""A run's timeline, per rank, in the Chrome/Perfetto trace-event format.

`python -m zero_ref.train --trace run.json` records what each rank did and when:
each unit's forward and backward (lane "compute"), each collective with its
bytes and where in the step it ran (lane "collectives"), each host<->device
copy (lane "copies"), the optimizer step (lane "optimizer"), and after every
step the bytes the memory ledger holds by category (a counter). Rank 0 writes
all ranks' events to one JSON file that https://ui.perfetto.dev and
chrome://tracing open (one process per rank, one thread per lane);
scripts/plot_trace.py draws a step of it as a picture (docs/stages.md).

Events are complete events ("ph": "X") with microsecond times from one
perf_counter origin per rank; ranks' clocks are not synchronised beyond
starting together, so compare lanes within a rank, and ranks only roughly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

from zero_ref.io.atomic import atomic_write_bytes

LANES = {"compute": 0, "collectives": 1, "copies": 2, "optimizer": 3}


class Trace:
    """This rank's events, kept in memory until the run ends."""

    def __init__(self, rank: int, origin: float | None = None) -> None:
        self.rank = rank
        self.origin = time.perf_counter() if origin is None else origin
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        ] + [
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}}
            for lane, tid in LANES.items()
        ]

    def complete(self, name: str, lane: str, start: float, seconds: float, **args) -> None:
        """An event that began at perf_counter() time `start` and lasted `seconds`."""
        self.events.append(
            {
                "name": name,
                "cat": lane,
                "ph": "X",
                "ts": round((start - self.origin) * 1e6, 1),
                "dur": round(seconds * 1e6, 1),
                "pid": self.rank,
                "tid": LANES[lane],
                "args": args,
            }
        )

    @contextmanager
    def span(self, name: str, lane: str, **args) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.complete(name, lane, start, time.perf_counter() - start, **args)

    def counter(self, name: str, values: dict[str, float]) -> None:
        """A sampled value (e.g. the ledger's bytes by category) at this moment."""
        ts = round((time.perf_counter() - self.origin) * 1e6, 1)
        self.events.append({"name": name, "ph": "C", "ts": ts, "pid": self.rank, "args": values})


def write_trace(path: str, per_rank: list[list[dict]]) -> None:
    """All ranks' events into one trace file, atomically."""
    events = [e for rank_events in per_rank for e in rank_events]
    data = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()
    atomic_write_bytes(path, data)
