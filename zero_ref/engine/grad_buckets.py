"""The gradient buckets of stages 1-3: pack each unit's gradient columns into the
staging matrix, reduce-scatter every bucket as soon as it is complete.

A unit's gradient is a (world_size, shard_numel_u) matrix whose row r is what
rank r owns (zero_ref/layout/flat.py). zero_ref/layout/buckets.py cuts the shard space into
windows of at most bucket_numel // world_size columns; here each window is
filled from the units that overlap it and reduce-scattered once its lowest unit
is done, landing (summed over ranks) in this rank's slice of the gradient:
the gradient shard (stages 2-3, and stage 1 with grad_accum > 1; in RAM or, with
the optimizer on NVMe, in a swap file: zero_ref/engine/grad_shard.py), or this
rank's own rows of the full gradient buffer (stage 1 with grad_accum 1: no
second gradient buffer, the paper's 2 Psi). Micro-steps after the first land in
`reduce_out` and are added, the oracle's micro-step order. Staging holds at
most bucket_numel elements, in the wire's dtype (16-bit with mixed precision:
half the bytes), so the memory for reductions does not grow with the model,
and neither do MPI's own temporaries (about one byte per element a
reduce-scatter sends).

With --overlap-comm (an OverlappingSchedule, two lanes) a bucket's reduce-scatter
is issued and backward goes on (DeepSpeed's overlap_comm): the staging is
double-buffered, bucket after bucket alternating lanes, and a lane is packed
again only after its last reduction was waited for (DeepSpeed #5523/#5606 was a
staging buffer refilled while its reduce was in flight: here an assertion, and
tests/test_overlap.py checks the order of events; tests/test_event_order.py that every
bucket has landed when backward ends). Each lane's sum lands in the
lane's own receive buffer and is moved to its landing when it is retired, oldest
first: the landings see the buckets one at a time, in the order blocking gives.

With qgZ (ZeRO++'s quantized gradients, `quantize_block`) a bucket goes to the Comm's
quantized reduce-scatter instead: each destination row cut into the blocks of
zero_ref/layout/grad_blocks.py, quantized to int8 or int4 (`quantize_bits`, two values
a byte) into the lane's send bytes, moved by
an Alltoall into its receive bytes, dequantized and summed in rank order (one pair of
byte buffers per lane, in the memory ledger as qgz_send / qgz_recv). With qgZ's hop
groups (`hops`, zero_ref/comm/groups.py qgz_hops) the same buffers carry DeepSpeed's two
hops: inside the group, then the requantized partial sums across the groups.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from zero_ref.comm.reduction import QuantizedBuffers
from zero_ref.engine.collective_schedule import BlockingSchedule
from zero_ref.engine.placement import HostPlacement
from zero_ref.layout.buckets import Bucket, BucketPlan
from zero_ref.layout.flat import FlatLayout, rank_rows
from zero_ref.layout.grad_blocks import bucket_block_starts
from zero_ref.numerics.quantize import segment_payload_bytes


class GradientBuckets:
    """The bucket plan, its staging matrix, and what each unit's gradient completes.
    Where each bucket's sum lands is the landing's business (`target`, `landed`): a
    gradient shard in RAM or on disk (zero_ref/engine/grad_shard.py), or stage 1's
    rows of the full gradient (RowsOfFullGradient)."""

    def __init__(
        self,
        layout: FlatLayout,
        plan: BucketPlan,
        schedule: BlockingSchedule,
        place: HostPlacement,
        wire_dtype: np.dtype,
        landing,
        quantize_block: int | None = None,
        quantize_bits: int = 8,
        hops=None,
    ) -> None:
        self.layout, self.plan, self.schedule, self.place = layout, plan, schedule, place
        self.landing = landing
        self.world = layout.world_size
        widest = self.plan.widest()
        names = ["bucket_staging"] + [
            f"bucket_staging (lane {k})" for k in range(1, schedule.lanes)
        ]
        self.staging = [place.zeros("buffers", n, self.world * widest, wire_dtype) for n in names]
        self.block = quantize_block  # qgZ's block (None: the plain reduce-scatter)
        self.bits = quantize_bits  # qgZ's: 8 or 4
        self.packed = self._packed_buffers(place, schedule.lanes) if quantize_block else None
        self.hops = hops  # qgZ's two hop groups (None: one hop)
        reduce = self._reduce
        if quantize_block:
            reduce = self._reduce_quantized if hops is None else self._reduce_two_hops
        self.flow = flow_for(schedule, landing, place, widest, landing.dtype, reduce)
        self.lane_of: dict[int, int] = {}  # bucket -> the lane it is packed in, until issued
        self.next_lane = 0

    def unit_ready(self, i: int, unit_grads: np.ndarray, micro: int) -> None:
        """Unit i's padded gradient range is final: pack it, fire what it completes."""
        unit = self.layout.units[i]
        rows = rank_rows(unit_grads, unit)  # (W, s_u): row r is rank r's slice
        for k in self.plan.of_unit(i):  # top-down, the order backward meets them
            bucket = self.plan[k]
            lo = max(bucket.shard_offset, unit.shard_offset)
            hi = min(bucket.shard_offset + bucket.shard_numel, unit.shard_offset + unit.shard_numel)
            lane = self._lane(k)
            staging = self._staging(bucket, lane)
            self.place.round_into(
                staging[:, lo - bucket.shard_offset : hi - bucket.shard_offset],
                rows[:, lo - unit.shard_offset : hi - unit.shard_offset],
            )  # a 16-bit wire rounds float32 gradients once here
            if bucket.first_unit == i:
                del self.lane_of[k]
                self.flow.issue(bucket, staging.reshape(-1), micro, lane)

    def flush(self) -> None:
        """The end of a micro-step's backward: every bucket's sum is in its landing."""
        self.flow.drain()

    def _lane(self, k: int) -> int:
        """The lane bucket k is packed in: the next one when it is first touched, after
        that lane's previous reduction is retired."""
        if k not in self.lane_of:
            self.lane_of[k], self.next_lane = (
                self.next_lane,
                (self.next_lane + 1) % len(self.staging),
            )
            self.flow.free(self.lane_of[k])
        return self.lane_of[k]

    def _packed_buffers(self, place: HostPlacement, lanes: int) -> list[tuple]:
        """Per lane, qgZ's send and receive bytes: W rows of the widest bucket's payload."""
        row = max(
            (
                segment_payload_bytes(b.shard_numel, len(self._starts(b)), self.bits)
                for b in self.plan
            ),  # fmt: skip
            default=0,
        )
        suffix = [""] + [f" (lane {k})" for k in range(1, lanes)]
        return [
            tuple(place.zeros("buffers", f"qgz_{w}{s}", self.world * row, np.uint8)
                  for w in ("send", "recv"))
            for s in suffix
        ]  # fmt: skip

    def _starts(self, bucket: Bucket) -> np.ndarray:
        return bucket_block_starts(self.layout, bucket, self.block)

    def _reduce(self, bucket: Bucket, staging: np.ndarray, out: np.ndarray, lane: int):
        return self.schedule.reduce_bucket(staging, out, lane)

    def _reduce_quantized(self, bucket: Bucket, staging: np.ndarray, out: np.ndarray, lane: int):
        starts, packed = self._packed(bucket, lane)
        return self.schedule.reduce_bucket_quantized(staging, out, starts, packed, lane)

    def _reduce_two_hops(self, bucket: Bucket, staging: np.ndarray, out: np.ndarray, lane: int):
        starts, packed = self._packed(bucket, lane)
        return self.schedule.reduce_bucket_two_hops(staging, out, starts, packed, self.hops, lane)

    def _packed(self, bucket: Bucket, lane: int) -> tuple[np.ndarray, QuantizedBuffers]:
        """A bucket's block starts and its QuantizedBuffers: the first W rows of the lane's
        byte buffers, each a destination row's payload."""
        starts = self._starts(bucket)
        row = segment_payload_bytes(bucket.shard_numel, len(starts), self.bits)
        send, got = (b[: self.world * row].reshape(self.world, row) for b in self.packed[lane])
        return starts, QuantizedBuffers(send, got, self.bits)

    def _staging(self, bucket: Bucket, lane: int) -> np.ndarray:
        """The (W, columns) staging matrix of `bucket` in `lane` (row r goes to rank r):
        never one whose reduction is still in flight."""
        assert not self.flow.busy(lane), f"staging lane {lane} packed while its reduce is in flight"
        return self.staging[lane][: self.world * bucket.shard_numel].reshape(self.world, -1)


class BlockingFlow:
    """Each bucket reduced straight into its landing and waited for at once."""

    def __init__(self, schedule: BlockingSchedule, landing, reduce) -> None:
        self.schedule, self.landing, self.reduce = schedule, landing, reduce

    def issue(self, bucket: Bucket, staging: np.ndarray, micro: int, lane: int) -> None:
        out = self.landing.target(bucket, micro)
        self.schedule.wait(self.reduce(bucket, staging, out, lane))
        self.landing.landed(bucket, out, micro)

    def free(self, lane: int) -> None:
        """Nothing is in flight."""

    def busy(self, lane: int) -> bool:
        return False

    def drain(self) -> None:
        """Nothing is in flight."""


class OverlappedFlow:
    """Reductions in flight, one per lane, each into its lane's receive buffer; retired
    oldest first into the landing (the landings' order is blocking's)."""

    def __init__(self, schedule: BlockingSchedule, landing, place, widest: int, dtype, reduce):
        self.schedule, self.landing, self.place, self.reduce = schedule, landing, place, reduce
        self.recv = [
            place.zeros("buffers", f"bucket_recv (lane {k})", widest, dtype)
            for k in range(schedule.lanes)
        ]
        self.queue: deque = deque()  # (lane, bucket, pending, micro), oldest first

    def issue(self, bucket: Bucket, staging: np.ndarray, micro: int, lane: int) -> None:
        out = self.recv[lane][: bucket.shard_numel]
        self.queue.append((lane, bucket, self.reduce(bucket, staging, out, lane), micro))

    def busy(self, lane: int) -> bool:
        return any(queued[0] == lane for queued in self.queue)

    def free(self, lane: int) -> None:
        """Retire reductions, oldest first, until none is in flight in `lane`."""
        while self.busy(lane):
            self._retire()

    def drain(self) -> None:
        while self.queue:
            self._retire()

    def _retire(self) -> None:
        lane, bucket, pending, micro = self.queue.popleft()
        self.schedule.wait(pending)
        out = self.landing.target(bucket, micro)
        self.place.round_into(out, self.recv[lane][: bucket.shard_numel])  # same dtype: a copy
        self.landing.landed(bucket, out, micro)


def flow_for(schedule: BlockingSchedule, landing, place, widest: int, dtype, reduce):
    """The flow the schedule's lanes ask for: one lane blocks, more overlap. reduce(bucket,
    staging, out, lane) issues a bucket's reduce-scatter (plain or quantized)."""
    if schedule.lanes == 1:
        return BlockingFlow(schedule, landing, reduce)
    return OverlappedFlow(schedule, landing, place, widest, dtype, reduce)


class RowsOfFullGradient:
    """Stage 1 with grad_accum 1: a bucket's sum lands in reduce_out and is copied into
    this rank's rows of the full gradient buffer (no second gradient buffer: the
    paper's 2 Psi)."""

    def __init__(self, layout: FlatLayout, full_grads: np.ndarray, rank: int, place, widest):
        self.layout, self.full_grads, self.rank = layout, full_grads, rank
        self.dtype = full_grads.dtype
        self.reduce_out = place.zeros("buffers", "reduce_out", widest, full_grads.dtype)

    def target(self, bucket: Bucket, micro: int) -> np.ndarray:
        return self.reduce_out[: bucket.shard_numel]

    def landed(self, bucket: Bucket, out: np.ndarray, micro: int) -> None:
        """Copy a bucket's sum into this rank's rows of the units it spans. Its columns
        belong to no other bucket, so no bucket still to be packed reads them."""
        lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
        for i in range(bucket.first_unit, bucket.last_unit + 1):
            unit = self.layout.units[i]
            a, b = max(lo, unit.shard_offset), min(hi, unit.shard_offset + unit.shard_numel)
            if a < b:
                mine = rank_rows(self.full_grads[unit.full_slice()], unit)[self.rank]
                mine[a - unit.shard_offset : b - unit.shard_offset] = out[a - lo : b - lo]
