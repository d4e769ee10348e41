"""An alpha-beta model of one training step at each ZeRO stage, for clusters we cannot run.

The step is compute (forward, backward, the optimizer on this rank's shard) plus each
collective of the step priced as alpha per message and beta per byte, inside a host
and across hosts, plus the rank's own overhead per collective operation (call_s, LogP's
o: what the rank itself spends issuing and completing it, which compute cannot hide but
the link's busy seconds can: a call costs nothing more while the step waits on the link
for bytes anyway, LogP's max(o, g) for a stream of messages; exposed_call_seconds).
The bytes are the ledger's (zero_ref/formulas/traffic.py expected_sent_bytes and
hpz_sent_bytes, the paper's Sec. 7 volumes: 2 Psi at stages 0-2, 3 Psi at stage 3,
ZeRO++'s qwZ, hpZ and qgZ as zero_ref sends them); this module only says which link each
byte crosses and when compute can hide it. With overlap, the collectives hide as
scripts/bench/overlap_budget.py's dependency bound splits them: stages 1-2's parameter
gathers behind forward and gradient reductions behind backward; stage 3's forward gathers
behind forward, its backward gathers and reductions behind backward; stage 0's all-reduce
behind backward. What does not fit under its phase's compute is exposed.

Cross-host bytes per host for a collective of an N-byte buffer over H hosts of L ranks:
an all-reduce is composed node-aware (MPICH ch4 and NCCL alike): 2 N (H-1)/H. An
all-gather or a reduce-scatter sends N (H-1)/H, the least (each host needs only the
others' part), when it is hierarchical or the ranks are cyclic; flat with ranks in blocks
(MPICH's one flat algorithm, issue 33) each of the host's L ranks sends its own, L N (H-1)/H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zero_ref.formulas.traffic import (
    HierarchicalGathers,
    QuantizedGathers,
    expected_sent_bytes,
    hpz_sent_bytes,
)
from zero_ref.layout.grad_blocks import GradientWire
from zero_ref.numerics.dtypes import ElementBytes

PLACEMENTS = ("block", "cyclic")
COLLECTIVES = ("flat", "hierarchical")
NODE_AWARE = ("reduce_scatter_qgz",)  # node-aware whatever the setting: qgZ's two hops
ONE_HOP = ("alltoall_qgz",)  # qgZ in one hop: every rank's own rows cross, whatever the setting


def _check(name: str, value: float, allowed: str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{name} {value!r}: {allowed}")


@dataclass(frozen=True)
class Link:
    """One kind of link: alpha seconds per message, bytes_per_s its rate (beta = 1 / rate);
    math.inf for an infinitely fast one."""

    alpha_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        _check("alpha_s", self.alpha_s, "seconds >= 0", self.alpha_s >= 0)
        _check("bytes_per_s", self.bytes_per_s, "> 0 (math.inf allowed)", self.bytes_per_s > 0)

    def seconds(self, messages: float, nbytes: float) -> float:
        return messages * self.alpha_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """hosts x ranks_per_host ranks; `inter` is one host's link to the others (its NICs
    together), `intra` one rank's link inside its host."""

    hosts: int
    ranks_per_host: int
    intra: Link
    inter: Link
    placement: str = "block"
    collectives: str = "flat"

    def __post_init__(self) -> None:
        _check("hosts", self.hosts, "an integer >= 1", self.hosts >= 1)
        _check("ranks_per_host", self.ranks_per_host, "an integer >= 1", self.ranks_per_host >= 1)
        _check("placement", self.placement, f"one of {PLACEMENTS}", self.placement in PLACEMENTS)
        ok = self.collectives in COLLECTIVES
        _check("collectives", self.collectives, f"one of {COLLECTIVES}", ok)

    @property
    def world(self) -> int:
        return self.hosts * self.ranks_per_host


@dataclass(frozen=True)
class Workload:
    """The model and the step: unit_numels (stage 3's units, or the buckets' sizes,
        in forward order; their sum is Psi), the compute seconds of one rank's step
        (forward, backward; optimizer_s is the optimizer over all Psi, a stage >= 1 rank
        steps 1/W of it), and the options. qwz_block: qwZ's block (None: off); hpz: hpZ's
        secondary copy inside each host (stage 3); qgz_blocks: qgZ int8's scale blocks of a
        destination row (None: off); qgZ crosses in two hops (inside the host, then across),
    zero_ref's default ('host'), or with qgz_hops 1 in one (an Alltoall over every rank,
    quantized_gradient_local_size 'world')."""

    stage: int
    unit_numels: tuple[int, ...]
    forward_s: float
    backward_s: float
    optimizer_s: float = 0.0
    sizes: ElementBytes = ElementBytes(4, 4, 4)
    grad_accum: int = 1
    overlap: bool = False
    qwz_block: int | None = None
    hpz: bool = False
    qgz_blocks: int | GradientWire | None = None
    qgz_hops: int = 2
    reduce_buckets: int | None = None  # gradient messages a micro-step (None: one a unit)
    quantize_s_per_numel: float = 0.0  # ZeRO++'s (de)quantization, seconds an element
    gathers: tuple[int, ...] | None = None  # stage 3 under a prefetch plan (class doc)
    overlap_efficiency: float = 1.0  # the share of a phase's compute comm can run under
    call_s: float = 0.0  # the rank's own seconds a collective operation (LogP's overhead o)

    def __post_init__(self) -> None:
        _check("stage", self.stage, "one of 0, 1, 2, 3", self.stage in (0, 1, 2, 3))
        ok = bool(self.unit_numels) and min(self.unit_numels) >= 1
        _check("unit_numels", self.unit_numels, "one or more sizes >= 1", ok)
        for name in ("forward_s", "backward_s", "optimizer_s"):
            _check(name, getattr(self, name), "seconds >= 0", getattr(self, name) >= 0)
        _check("grad_accum", self.grad_accum, "an integer >= 1", self.grad_accum >= 1)
        buckets = self.reduce_buckets
        _check("reduce_buckets", buckets, "None or >= 1", buckets is None or buckets >= 1)
        q = self.quantize_s_per_numel
        _check("quantize_s_per_numel", q, "seconds >= 0", q >= 0)
        e = self.overlap_efficiency
        _check("overlap_efficiency", e, "between 0 and 1", 0 <= e <= 1)
        _check("call_s", self.call_s, "seconds >= 0", self.call_s >= 0)
        g = self.gathers
        ok = g is None or (len(g) == len(self.unit_numels) and min(g) >= 0)
        _check("gathers", g, "None or a count >= 0 for each unit", ok)
        zpp = self.qwz_block is not None or self.hpz
        _check("stage", self.stage, "3 with qwZ or hpZ (ZeRO++ Sec. 3)", not zpp or self.stage == 3)
        qgz = self.qgz_blocks is not None
        _check("qgz_hops", self.qgz_hops, "1 or 2", self.qgz_hops in (1, 2))
        _check("stage", self.stage, "1-3 with qgZ", not qgz or self.stage >= 1)


@dataclass(frozen=True)
class Flight:
    """One kind of collective in a step: its messages (calls), buffer bytes (N, summed
    over the calls), whether it crosses hosts, and the compute phase it can hide behind."""

    kind: str
    calls: int
    buffer_bytes: float
    across_hosts: bool
    hides_behind: str  # "forward", "backward" or "" (never hidden)


@dataclass(frozen=True)
class StepTime:
    """A predicted step: compute, the collectives' seconds hidden behind it and exposed."""

    compute_s: float
    hidden_s: float
    exposed_s: float
    flights: tuple[Flight, ...]

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s


def _buffer(sent_bytes: float, world: int) -> float:
    """The buffer N whose ring volume (W-1)/W N is the ledger's per-rank sent bytes."""
    return sent_bytes * world / (world - 1) if world > 1 else 0.0


def stage3_forward_backward(n_units: int, grad_accum: int) -> tuple[list[int], list[int]]:
    """Stage 3's gathers per unit per step, forward's and backward's (the ledger's
    stage3_gathers shared out): forward gathers every unit each micro-step but unit 0
    after the first (the previous backward left it in the buffer); backward every unit
    but the last (forward's is still there)."""
    forward = [1] + [grad_accum] * (n_units - 1)
    backward = [grad_accum] * (n_units - 1) + [0]
    if n_units == 1:
        forward, backward = [1], [0]
    else:
        backward[0] = grad_accum
    return forward, backward


def _gradient_flight(w: Workload, world: int) -> Flight:
    """The gradients' reduction each micro-step: stage 0's all-reduce, stages 1-3's
    reduce-scatter (or qgZ's quantized rows), hidden behind backward."""
    grads_only = ElementBytes(0, w.sizes.grad, w.sizes.comm)
    calls = (w.reduce_buckets or len(w.unit_numels)) * w.grad_accum
    if w.stage == 0:
        sent = expected_sent_bytes(
            0, w.unit_numels, world, w.grad_accum, ElementBytes(0, 0, w.sizes.comm)
        )
        return Flight("allreduce", calls, _buffer(sent, world), True, "backward")
    sent = expected_sent_bytes(
        w.stage, w.unit_numels, world, w.grad_accum, grads_only, grad_blocks=w.qgz_blocks
    )
    kind = "reduce_scatter"
    if w.qgz_blocks is not None:
        kind = "reduce_scatter_qgz" if w.qgz_hops == 2 else "alltoall_qgz"
    return Flight(kind, calls, _buffer(sent, world), True, "backward")


def _stage3_gathers(w: Workload, world: int, per_host: int) -> list[Flight]:
    """Stage 3's parameter gathers, forward's and backward's apart; with qwZ forward's in
    int8, with hpZ backward's inside the host from the secondary copy."""
    params_only = ElementBytes(w.sizes.param, 0, 0)
    n = len(w.unit_numels)
    forward, backward = stage3_forward_backward(n, w.grad_accum)
    if w.gathers is not None:  # a prefetch plan's: backward finds more units held
        backward = [max(0, g - f) for g, f in zip(w.gathers, forward, strict=True)]
    fwd: list[int] | QuantizedGathers = forward
    if w.qwz_block is not None:
        fwd = QuantizedGathers(full=(0,) * n, quantized=tuple(forward), block=w.qwz_block)
    sent_f = expected_sent_bytes(3, w.unit_numels, world, w.grad_accum, params_only, gathers=fwd)
    flights = [Flight("allgather_forward", sum(forward), _buffer(sent_f, world), True, "forward")]
    if w.hpz:
        hg = HierarchicalGathers(
            full=(0,) * n,
            quantized=(0,) * n,
            group=tuple(backward),
            block=w.qwz_block or 1,
            group_size=per_host,
        )
        _, inside = hpz_sent_bytes(w.unit_numels, world, w.grad_accum, params_only, hg)
        flights.append(
            Flight("allgather_hpz", sum(backward), _buffer(inside, per_host), False, "backward")
        )
        return flights
    sent_b = expected_sent_bytes(
        3, w.unit_numels, world, w.grad_accum, params_only, gathers=backward
    )
    flights.append(
        Flight("allgather_backward", sum(backward), _buffer(sent_b, world), True, "backward")
    )
    return flights


def flights_of(w: Workload, c: Cluster) -> tuple[Flight, ...]:
    """Every collective kind of one step (the ledger's bytes, as buffers)."""
    world = c.world
    flights = [_gradient_flight(w, world)]
    if w.stage in (1, 2):
        sent = expected_sent_bytes(
            w.stage, w.unit_numels, world, w.grad_accum, ElementBytes(w.sizes.param, 0, 0)
        )
        flights.append(
            Flight("allgather", len(w.unit_numels), _buffer(sent, world), True, "forward")
        )
    elif w.stage == 3:
        flights += _stage3_gathers(w, world, c.ranks_per_host)
    return tuple(flights)


def host_link_bytes(f: Flight, c: Cluster) -> float:
    """Bytes one host puts on its link to the others for flight f (module docstring)."""
    hosts = c.hosts
    if not f.across_hosts or hosts == 1:
        return 0.0
    least = f.buffer_bytes * (hosts - 1) / hosts
    if f.kind == "allreduce":
        return 2 * least
    if f.kind in NODE_AWARE:
        return least
    if f.kind in ONE_HOP:
        return least * c.ranks_per_host
    flat_blocks = c.collectives == "flat" and c.placement == "block"
    return least * (c.ranks_per_host if flat_blocks else 1)


def flight_seconds(f: Flight, c: Cluster) -> float:
    """alpha per message and beta per byte, inside the host (each rank its (L-1)/L of
    the buffer, log2 L messages a call) and across (the host's link bytes, log2 H
    messages a call; an Alltoall one to each other rank); an all-reduce twice each
    (reduce-scatter + all-gather)."""
    twice = 2 if f.kind == "allreduce" else 1
    per_host = c.ranks_per_host
    group = c.world if f.across_hosts else per_host
    if group == 1:
        return 0.0
    intra_bytes = twice * f.buffer_bytes * (per_host - 1) / per_host
    intra_msgs = twice * f.calls * math.ceil(math.log2(per_host))
    inter_msgs = twice * f.calls * math.ceil(math.log2(c.hosts)) if f.across_hosts else 0
    if f.kind in ONE_HOP:  # an Alltoall: a message to every other rank
        intra_msgs, inter_msgs = f.calls * (per_host - 1), f.calls * (c.world - per_host)
    intra = c.intra.seconds(intra_msgs, intra_bytes) if per_host > 1 else 0.0
    return intra + c.inter.seconds(inter_msgs, host_link_bytes(f, c))


def quantized_numel(w: Workload) -> int:
    """Elements ZeRO++ (de)quantizes a step: qwZ each forward gather's full unit, qgZ
    the gradients once a micro-step a hop (each hop quantizes and dequantizes)."""
    numel = 0
    if w.qwz_block is not None:
        forward, _ = stage3_forward_backward(len(w.unit_numels), w.grad_accum)
        numel += sum(n * c for n, c in zip(w.unit_numels, forward, strict=True))
    if w.qgz_blocks is not None:
        numel += w.qgz_hops * sum(w.unit_numels) * w.grad_accum
    return numel


def compute_seconds(w: Workload, world: int) -> float:
    """Forward, backward, ZeRO++'s quantization and the optimizer on this rank's shard
    (all of it at stage 0)."""
    optimizer = w.optimizer_s / (1 if w.stage == 0 else world)
    return w.forward_s + w.backward_s + optimizer + w.quantize_s_per_numel * quantized_numel(w)


def link_seconds(flights: tuple[Flight, ...], c: Cluster) -> float:
    """The seconds a host's link is busy with the step's bytes (beta only, no alpha)."""
    return sum(host_link_bytes(f, c) / c.inter.bytes_per_s for f in flights)


def waited_share(waited_link_s: float, rest_s: float, own_s: float) -> float:
    """The share of a step in which it waits on the link's bytes, with every call paid:
    waited_link_s over rest_s (compute and the exposed collectives, the waited link
    among them) plus the calls' own seconds own_s; the share of the calls the link
    hides (exposed_call_seconds)."""
    ok = 0 <= waited_link_s <= rest_s * (1 + 1e-12)  # part of the rest; rounding's slack
    _check("waited_link_s", waited_link_s, f"between 0 and the rest of the step, {rest_s!r} s", ok)
    step = rest_s + own_s
    return waited_link_s / step if step > 0 else 0.0


def exposed_call_seconds(own_s: float, waited_link_s: float, rest_s: float) -> float:
    """What the step pays of its calls' own seconds own_s (call_s a call), beside rest_s
    (compute and the exposed collectives) of which waited_link_s is the link's bytes it
    waits on: the calls fall anywhere in the step, and those that fall while the link is
    busy with bytes the step waits for anyway cost nothing more (with a host's ranks on
    one link, a rank's Python runs while the link carries the others' bytes; LogP charges
    a stream of messages max(o, g), not o + g). Their share is the waited link seconds'
    share of the step with every call paid (waited_share), so no constant is added: 0
    with no link to wait on, nearly all of them when the link is the step."""
    return own_s * (1 - waited_share(waited_link_s, rest_s, own_s))


def predict(w: Workload, c: Cluster, scalars: int = 1) -> StepTime:
    """One step's time: compute plus what of each flight its phase's compute cannot hide
    (everything, without overlap), plus `scalars` blocking all-reduces of a few bytes
    (the loss, a gradient norm), each alpha across the hosts and inside; and each call's
    own overhead (call_s: the rank's CPU seconds to issue and complete it, which no
    compute hides because the rank itself spends them), less those of them that run
    while the step waits on the link (exposed_call_seconds)."""
    flights, compute = flights_of(w, c), compute_seconds(w, c.world)
    behind = {"forward": 0.0, "backward": 0.0, "": 0.0}  # each phase's collective seconds
    link = dict.fromkeys(behind, 0.0)  # and of them its link bytes' seconds
    for f in flights:
        phase = f.hides_behind if w.overlap else ""
        behind[phase] += flight_seconds(f, c)
        link[phase] += link_seconds((f,), c)
    covered = {"": 0.0}  # what each phase's compute hides of its collectives
    for phase, phase_s in (("forward", w.forward_s), ("backward", w.backward_s)):
        covered[phase] = min(behind[phase], w.overlap_efficiency * phase_s)
    hidden = sum(covered.values())
    exposed = sum(behind.values()) - hidden
    # the link seconds the step waits on: each phase's, less the share compute hid
    waited = sum(link[p] * (1 - covered[p] / behind[p]) for p in behind if behind[p] > 0)
    if c.world > 1:
        alpha = c.intra.alpha_s * math.ceil(math.log2(c.ranks_per_host))
        exposed += scalars * 2 * (alpha + c.inter.alpha_s * math.ceil(math.log2(c.hosts)))
        # one operation a call; a qgZ bucket is one in one hop or two (on the two hosts
        # both cost the same: docs/step_model.md)
        own = w.call_s * (sum(f.calls for f in flights) + scalars)
        exposed += exposed_call_seconds(own, waited, compute + exposed)
    return StepTime(compute, hidden, exposed, flights)
