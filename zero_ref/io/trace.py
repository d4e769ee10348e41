"""A run's timeline, per rank, in the Chrome/Perfetto trace-event format.

`python -m zero_ref.train --trace run.json` records what each rank did and when:
each unit's forward and backward (lane "compute"), each collective with its
bytes and where in the step it ran (lane "collectives"), with --overlap-comm
each non-blocking collective from issue to completion (lane "in flight", drawn under
the compute it hides behind) and the time a rank waited for it (lane "collectives"),
both naming the caller's lane ("unit 3", "bucket 0", "gather 1"; stage 3 marks each
unit's gather with an instant event naming its buffer), so the order of each wait
and the read of its result can be checked (tests/test_event_order.py),
each host<->device copy (lane "copies"), the optimizer step (lane "optimizer"); with the optimizer
state in swap files (--offload-optimizer nvme) each sub-group's read, AdamW
kernel and write-back (lanes "swap reads", "adamw sub-groups", "swap writes",
zero_ref/offload/pipeline.py); with stage 3's parameters in a swap file
(--offload-param nvme) each neighbour's range the kernel is asked to read ahead
(instant events "readahead <unit>" in lane "swap reads", zero_ref/engine/stage3.py);
every checkpoint file written, checked or read (lane "checkpoint"); and after
every step the bytes the memory ledger holds by category (a counter). Every I/O
event carries the bytes it moved (or, for readahead, asked for) in its args.
Rank 0 writes all ranks' events to one JSON file that https://ui.perfetto.dev
and chrome://tracing open (one process per rank, one thread per lane);
scripts/docs/plot_trace.py draws a step of it as a picture (docs/stages.md).

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

LANES = {
    "compute": 0,
    "collectives": 1,
    "copies": 2,
    "optimizer": 3,
    "swap reads": 4,  # the offloaded update's I/O threads ...
    "adamw sub-groups": 5,  # ... the main thread's kernel on each sub-group ...
    "swap writes": 6,  # ... and the write-back behind it
    "checkpoint": 7,
    "in flight": 8,  # a non-blocking collective from its issue to its completion (--overlap-comm)
}


class Trace:
    """This rank's events, kept in memory until the run ends.

    The offloaded update's two I/O threads record into it while the main thread
    does too: each record is one list.append, which is atomic in CPython (the GIL),
    so no lock is needed; events may land out of time order, and readers sort."""

    def __init__(self, rank: int, origin: float | None = None) -> None:
        self.rank = rank
        self.origin = time.perf_counter() if origin is None else origin
        self.step: int | None = None  # the run's step under way (the trainer sets it)
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        ] + [
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}}
            for lane, tid in LANES.items()
        ]

    def _us(self, t: float) -> float:
        """perf_counter() time t as microseconds since this trace's origin."""
        return round((t - self.origin) * 1e6, 1)

    def complete(self, name: str, lane: str, start: float, seconds: float, /, **args) -> None:
        """An event that began at perf_counter() time `start` and lasted `seconds`."""
        event = {
            "name": name,
            "cat": lane,
            "ph": "X",
            "ts": self._us(start),
            "dur": round(seconds * 1e6, 1),
            "pid": self.rank,
            "tid": LANES[lane],
            "args": args,
        }
        self.events.append(event)  # one append: safe from the I/O threads too

    @contextmanager
    def span(self, name: str, lane: str, /, **args) -> Iterator[dict]:
        """The block as one event; yields its args, for what is known only at its end."""
        start = time.perf_counter()
        try:
            yield args
        finally:
            self.complete(name, lane, start, time.perf_counter() - start, **args)

    def instant(self, name: str, lane: str, /, **args) -> None:
        """Something that happened at this moment, with no duration (e.g. a resume's
        description of the checkpoint it reads)."""
        ts = self._us(time.perf_counter())
        self.events.append(
            {"name": name, "cat": lane, "ph": "i", "s": "t", "ts": ts, "pid": self.rank}
            | {"tid": LANES[lane], "args": args}
        )

    def counter(self, name: str, values: dict[str, float]) -> None:
        """A sampled value (e.g. the ledger's bytes by category) at this moment."""
        ts = self._us(time.perf_counter())
        self.events.append({"name": name, "ph": "C", "ts": ts, "pid": self.rank, "args": values})


def write_trace(path: str, per_rank: list[list[dict]]) -> None:
    """All ranks' events into one trace file, atomically."""
    events = [e for rank_events in per_rank for e in rank_events]
    data = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()
    atomic_write_bytes(path, data)
