"""The communication ledger: the bytes each rank's collectives move, per step.

The bytes are *modelled*, not measured on the wire: each call's count comes from
its actual buffers (not from a formula of the model size), priced as a ring
algorithm moves them. `sent_bytes` is the data of this rank that other ranks
receive, `recv_bytes` the data this rank receives. For a reduce-scatter of N
bytes over W ranks that is (W-1)/W * N each way; for an all-gather producing N
bytes, also (W-1)/W * N. MPI may pick another algorithm (recursive halving,
trees) that moves a different amount. The paper's volumes (Sec. 7: 2 Psi for
data parallel and stages 1-2, 3 Psi for stage 3) are sums of these; the formulas that
say what a step should book are zero_ref/formulas/traffic.py's.

Collectives run only to check a run (the oracle's consolidation, --check-oracle)
are recorded `off_the_books()`: counted apart, never in a training step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# The GPU path's PCIe copies: collectives staged through host memory, and ZeRO-Offload's
# gradients down to the CPU optimizer and parameters back up.
COPY_KINDS = (
    "device_to_host",
    "host_to_device",
    "offload_grads_to_host",
    "offload_params_to_device",
)


@dataclass
class KindTotals:
    """Totals for one collective kind within one step."""

    calls: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    seconds: float = 0.0
    copied_bytes: int = 0  # host <-> device copies (COPY_KINDS): never network bytes

    def as_dict(self) -> dict[str, float]:
        out = {
            "calls": self.calls,
            "sent_bytes": self.sent_bytes,
            "recv_bytes": self.recv_bytes,
            "seconds": self.seconds,
        }
        if self.copied_bytes:
            out["copied_bytes"] = self.copied_bytes
        return out


@dataclass
class CommLedger:
    """Per-kind totals for the step in progress, and the finished steps' totals."""

    current: dict[str, KindTotals] = field(default_factory=lambda: defaultdict(KindTotals))
    history: list[dict[str, dict[str, float]]] = field(default_factory=list)
    checking: dict[str, KindTotals] = field(default_factory=lambda: defaultdict(KindTotals))
    trace: object | None = None  # a zero_ref.io.trace.Trace: each record becomes an event
    where: str = ""  # the Comm's context label ("micro-step 0 backward h1"), for the trace

    @contextmanager
    def off_the_books(self) -> Iterator[None]:
        """Collectives inside go to `checking`, not to the step in progress."""
        step, self.current = self.current, self.checking
        try:
            yield
        finally:
            self.checking, self.current = self.current, step

    @contextmanager
    def timed(self, kind: str, sent_bytes: int, recv_bytes: int) -> Iterator[None]:
        """Time the block and record it as one call of `kind` (not if it raises); with
        run() below, the only ways a collective or a copy is timed into this ledger."""
        t0 = time.perf_counter()
        yield
        self.record(kind, sent_bytes, recv_bytes, time.perf_counter() - t0)

    def run(self, kind: str, sent_bytes: int, recv_bytes: int, fn: Callable, *args) -> None:
        """timed(), for a call: fn(*args) timed and recorded (not if it raises), without a
        generator's enter and exit (a collective's hot path runs ~800 of these a step)."""
        t0 = time.perf_counter()
        fn(*args)
        self.record(kind, sent_bytes, recv_bytes, time.perf_counter() - t0)

    @contextmanager
    def timed_copy(self, kind: str, nbytes: int) -> Iterator[None]:
        """timed(), for a host-device copy (record_copy)."""
        t0 = time.perf_counter()
        yield
        self.record_copy(kind, nbytes, time.perf_counter() - t0)

    def record(self, kind: str, sent_bytes: int, recv_bytes: int, seconds: float) -> None:
        t = self.current[kind]
        t.calls += 1
        t.sent_bytes += int(sent_bytes)
        t.recv_bytes += int(recv_bytes)
        t.seconds += seconds
        if self.trace is not None:
            start = time.perf_counter() - seconds
            args = {"sent_bytes": int(sent_bytes), "recv_bytes": int(recv_bytes)}
            self.trace.complete(kind, "collectives", start, seconds, where=self.where, **args)

    def record_issued(self, kind: str, sent_bytes: int, recv_bytes: int) -> None:
        """A non-blocking collective was issued: one call and its bytes, counted in the
        step that issues it (zero_ref/comm/in_flight.py); its seconds come at its wait."""
        t = self.current[kind]
        t.calls += 1
        t.sent_bytes += int(sent_bytes)
        t.recv_bytes += int(recv_bytes)

    def record_waited(
        self, kind: str, issued_at: float, blocked: float, where: str, **args
    ) -> None:
        """A non-blocking collective completed: the seconds this rank was blocked on it
        (issuing it, and its wait) go to the step in progress, so a step's seconds are
        the communication compute did not hide. On the trace it is two events: the
        whole flight, issue to completion (lane "in flight"), and the wait (lane
        "collectives"), each naming the caller's lane ("unit 3", "bucket 0"): which
        call a wait was for, so a test can check it came before the result was read."""
        self.current[kind].seconds += blocked
        if self.trace is not None:
            now = time.perf_counter()
            self.trace.complete(kind, "in flight", issued_at, now - issued_at, where=where, **args)
            lane = args.get("lane", "")
            self.trace.complete(
                f"wait {kind}", "collectives", now - blocked, blocked, where=where, lane=lane
            )

    def record_copy(self, kind: str, nbytes: int, seconds: float) -> None:
        """A copy between host and device memory (kind in COPY_KINDS): PCIe bytes,
        counted apart from what crosses the network."""
        if kind not in COPY_KINDS:
            raise ValueError(f"copy kind {kind!r}: allowed are {', '.join(COPY_KINDS)}")
        t = self.current[kind]
        t.calls += 1
        t.copied_bytes += int(nbytes)
        t.seconds += seconds
        if self.trace is not None:
            start = time.perf_counter() - seconds
            self.trace.complete(kind, "copies", start, seconds, bytes=int(nbytes))

    def end_step(self) -> dict[str, dict[str, float]]:
        """Close the step: move its totals to history and return them."""
        totals = {k: v.as_dict() for k, v in sorted(self.current.items())}
        self.history.append(totals)
        self.current = defaultdict(KindTotals)
        return totals

    def last_step(self) -> dict[str, dict[str, float]]:
        return self.history[-1] if self.history else {}

    def last_step_sent_bytes(self) -> int:
        return self.step_sent_bytes(self.last_step())

    @staticmethod
    def step_sent_bytes(totals: dict[str, dict[str, float]]) -> int:
        return int(sum(v["sent_bytes"] for v in totals.values()))

    @staticmethod
    def step_copied_bytes(totals: dict[str, dict[str, float]], kind: str) -> int:
        """Bytes copied host -> device or device -> host in one step's totals."""
        return int(totals.get(kind, {}).get("copied_bytes", 0))
