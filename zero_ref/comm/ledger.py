"""The communication ledger: the bytes each rank's collectives move, per step.

The bytes are *modelled*, not measured on the wire: each call's count comes from
its actual buffers (not from a formula of the model size), priced as a ring
algorithm moves them. `sent_bytes` is the data of this rank that other ranks
receive, `recv_bytes` the data this rank receives. For a reduce-scatter of N
bytes over W ranks that is (W-1)/W * N each way; for an all-gather producing N
bytes, also (W-1)/W * N. MPI may pick another algorithm (recursive halving,
trees) that moves a different amount. The paper's volumes (Sec. 7: 2 Psi for
data parallel and stages 1-2, 3 Psi for stage 3) are sums of these.

Collectives run only to check a run (the oracle's consolidation, --check-oracle)
are recorded `off_the_books()`: counted apart, never in a training step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from zero_ref.layout.grad_blocks import GradientWire
from zero_ref.numerics.dtypes import FP32, ElementBytes
from zero_ref.numerics.quantize import quantized_gather_bytes

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


def paper_sent_bytes(
    stage: int, numel: int, world_size: int, grad_accum: int, element_bytes: int = 4
) -> int:
    """Bytes one rank sends per step for parameters and gradients.

    At grad_accum = 1 this is the paper's Sec. 7 volume (2 Psi at stages 0-2,
    3 Psi at stage 3, times (W-1)/W elements of `element_bytes`: 2 in the paper's
    fp16). Each reduce-scatter or all-gather of Psi elements moves (W-1)/W * Psi
    per rank. Stage 0 all-reduces (= reduce-scatter + all-gather) every micro-step;
    stages 1-2 reduce-scatter every micro-step and all-gather once; stage 3 gathers
    twice (forward, backward) per micro-step and reduce-scatters every micro-step.
    The paper counts one micro-step; for k > 1 this is zero_ref's schedule
    (DeepSpeed's stages 0-1 reduce once)."""
    per_collective = element_bytes * numel * (world_size - 1) // world_size
    k = grad_accum
    return per_collective * {0: 2 * k, 1: k + 1, 2: k + 1, 3: 3 * k}[stage]


@dataclass(frozen=True)
class QuantizedGathers:
    """Stage 3 with qwZ: each unit's full-precision gathers per step (backward's) and its
    quantized ones (forward's: int8 values and one float32 scale per `block`)."""

    full: tuple[int, ...]
    quantized: tuple[int, ...]
    block: int


@dataclass(frozen=True)
class HierarchicalGathers:
    """Stage 3 with hpZ: each unit's gathers per step across the world (full precision,
    and with qwZ forward's quantized ones, `block`), and inside its partition group of
    `group_size` ranks from the secondary copy (the ledger's "allgather_hpz"; with qwZ
    too they send the dequantized values in the parameters' dtype)."""

    full: tuple[int, ...]
    quantized: tuple[int, ...]
    group: tuple[int, ...]
    block: int | None
    group_size: int


def expected_sent_bytes(
    stage: int,
    unit_numels: Sequence[int],
    world_size: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
    skipped: bool = False,
    after_skipped: bool = False,
    gathers: Sequence[int] | QuantizedGathers | HierarchicalGathers | None = None,
    grad_blocks: int | GradientWire | None = None,
) -> int:
    """Bytes one rank sends per step for parameters and gradients in zero_ref's schedule.

    Gradients are reduce-scattered in the wire's dtype (sizes.comm), parameters
    all-gathered in theirs (sizes.param); stage 0's all-reduce gathers the reduced
    blocks in the gradients' dtype (sizes.grad). At stage 3 the gathered-unit buffer
    is reused: the last unit's forward gather serves its backward too, and unit 0's
    backward gather serves the next micro-step's forward. unit_numels are the
    padded sizes, in forward order. A skipped step (a NaN/Inf gradient) updates
    nothing, so stages 1-2 gather nothing after it, and at stage 3 the step after
    it (`after_skipped`) finds unit 0 still in the buffer, unchanged. `gathers`: each
    unit's gathers per step where stage 3 holds more than one unit (prefetch buffers,
    persistent units: zero_ref/engine/gathered_unit.py's gathers_per_step), or with
    qwZ a QuantizedGathers: forward's gathers then send (W-1)/W * (numel + 4 numel /
    block) bytes each, backward's their parameters' dtype; with hpZ a HierarchicalGathers:
    its group gathers send (G-1)/G of their units in the parameters' dtype (hpz_sent_bytes
    gives the two parts apart). `grad_blocks` (qgZ): its GradientWire (zero_ref/layout/
    grad_blocks.py plan_wire: the packed values and the blocks of a destination row,
    summed over the buckets), or for int8 the number of blocks alone; each micro-step's
    reduce-scatter then sends (W-1) x row_bytes in place of (W-1)/W x psi x sizes.comm:
    in int8 (W-1) x (psi / W + 4 blocks), in int4 (W-1) x (sum over buckets of
    ceil(C_b / 2) + 4 blocks), C_b a bucket's columns."""
    psi, k = sum(unit_numels), grad_accum
    fraction = (world_size - 1) / world_size
    if stage == 0:
        return int(fraction * psi * k * (sizes.comm + sizes.grad))
    if grad_blocks is not None:  # qgZ: int8 or int4 gradients; the rest as without it
        no_grads = ElementBytes(sizes.param, sizes.grad, 0)  # the parameters' bytes alone
        params = expected_sent_bytes(
            stage, unit_numels, world_size, grad_accum, no_grads, skipped, after_skipped, gathers
        )
        return params + qgz_sent_bytes(psi, world_size, grad_accum, grad_blocks)
    if stage < 3:
        return int(fraction * psi * (k * sizes.comm + (0 if skipped else sizes.param)))
    if isinstance(gathers, HierarchicalGathers):
        return sum(hpz_sent_bytes(unit_numels, world_size, grad_accum, sizes, gathers))
    if isinstance(gathers, QuantizedGathers):
        full = sum(n * c for n, c in zip(unit_numels, gathers.full, strict=True))
        quantized = sum(
            quantized_gather_bytes(n, gathers.block) * c
            for n, c in zip(unit_numels, gathers.quantized, strict=True)
        )
        return int(fraction * (sizes.param * full + quantized + sizes.comm * k * psi))
    counts = gathers or stage3_gathers(
        len(unit_numels), grad_accum, held=0 if after_skipped else None
    )
    gathered = sum(n * c for n, c in zip(unit_numels, counts, strict=True))
    return int(fraction * (sizes.param * gathered + sizes.comm * k * psi))


def qgz_sent_bytes(
    psi: int, world_size: int, grad_accum: int, grad_blocks: int | GradientWire
) -> int:
    """qgZ's gradient bytes one rank sends per step: (W-1) destination rows a micro-step,
    each its packed values and a float32 scale a block (a GradientWire's row_bytes; an
    int alone: int8's psi / W values and that many blocks)."""
    if isinstance(grad_blocks, GradientWire):
        row = grad_blocks.row_bytes
    else:
        row = psi // world_size + 4 * grad_blocks  # int8: a byte a value
    return grad_accum * (world_size - 1) * row


def hpz_sent_bytes(
    unit_numels: Sequence[int],
    world_size: int,
    grad_accum: int,
    sizes: ElementBytes,
    gathers: HierarchicalGathers,
    grad_blocks: int | GradientWire | None = None,
) -> tuple[int, int]:
    """Stage 3 with hpZ, bytes one rank sends per step: (across the world: the
    gradients' reduce-scatter and the gathers from the primary shards, inside the
    partition group: the gathers from the secondary copy). Across hosts, when the
    groups are the hosts, only the first part travels. With qgZ (`grad_blocks`, as
    expected_sent_bytes takes it) the gradients are its quantized rows, not a
    reduce-scatter in sizes.comm."""
    psi, world = sum(unit_numels), (world_size - 1) / world_size
    full = sum(n * c for n, c in zip(unit_numels, gathers.full, strict=True))
    quantized = sum(
        quantized_gather_bytes(n, gathers.block) * c
        for n, c in zip(unit_numels, gathers.quantized, strict=True)
        if c
    )
    group = sum(n * c for n, c in zip(unit_numels, gathers.group, strict=True))
    inside = int((gathers.group_size - 1) / gathers.group_size * sizes.param * group)
    if grad_blocks is not None:
        across = int(world * (sizes.param * full + quantized))
        return across + qgz_sent_bytes(psi, world_size, grad_accum, grad_blocks), inside
    across = int(world * (sizes.param * full + quantized + sizes.comm * grad_accum * psi))
    return across, inside


def stage3_gathers(n_units: int, grad_accum: int, held: int | None = None) -> list[int]:
    """How often each unit is all-gathered in one step at stage 3: forward in order,
    backward in reverse, a unit already in the buffer (`held` at the start: none
    after an update, which makes every copy stale) not gathered again."""
    counts = [0] * n_units
    for _ in range(grad_accum):
        for i in [*range(n_units), *range(n_units - 1, -1, -1)]:
            if held != i:
                counts[i] += 1
                held = i
    return counts
