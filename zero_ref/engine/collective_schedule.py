"""When each of a step's collectives is issued and when it is waited for: a policy.

ZeRO's stages (Sec. 5) name the collectives of a step: stage 0 all-reduces the
gradients (Sec. 5.1's baseline), stages 1-3 reduce-scatter them in buckets
(Sec. 5.2), stages 1-2 all-gather the updated parameters, and stage 3 gathers
each unit's parameters before its forward and its backward (Sec. 5.3). A stage
asks the schedule to issue one (`allreduce_chunk`, `reduce_bucket`,
`gather_unit`, `gather_updated`) and gets a `Pending` it hands back to `wait`
before it reads the result.

Two schedules, chosen once from the config (`schedule_for`):

  BlockingSchedule     every collective issued and completed by the call that
                       issues it: the oracle's order of MPI calls (the default).
  OverlappingSchedule  --overlap-comm (DeepSpeed's overlap_comm): the Comm's
                       non-blocking calls (zero_ref/comm/nonblocking.py); a stage
                       waits only when it reads the result, so backward goes on
                       while a bucket is reduced and stage 3 computes while the
                       next unit is gathered. Its `lanes` (two) tell the buckets
                       to double-buffer their staging, its `prefetches` tell stage
                       3 to gather ahead, and `poke()` at unit boundaries lets the
                       progress policy (zero_ref/comm/progress.py) drive MPI.

Either way a result is the same: the same sums in the same order, whenever the
bytes move. (Not comm/signatures.py, which checks that all ranks enter the same
collective.)
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.comm.in_flight import InFlight
from zero_ref.comm.progress import progress_for


class Pending:
    """A blocking collective, already complete: what the schedule returns for it (an
    issued one is an InFlight, zero_ref/comm/in_flight.py); wait() once, as for those."""

    def __init__(self, what: str) -> None:
        self.what, self.waited = what, False

    def wait(self) -> None:
        assert not self.waited, f"{self.what} waited for twice"
        self.waited = True


class BlockingSchedule:
    """Every collective issued and completed by the call that issues it."""

    lanes = 1  # staging buffers a bucket flow needs: one, refilled after each wait
    prefetches = False  # stage 3 gathers each unit when it is needed

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def allreduce_chunk(self, staging, grads: np.ndarray) -> Pending:
        """Stage 0: grads <- the sum over ranks (through the precision's AllreduceStaging)."""
        staging.allreduce(self.comm, grads)
        return Pending("allreduce")

    def reduce_bucket(self, staging: np.ndarray, out: np.ndarray, lane: int = 0) -> Pending:
        """Stages 1-3: out <- this rank's block of the sum of a bucket's staging."""
        self.comm.reduce_scatter_sum(staging, out)
        return Pending("reduce_scatter")

    def reduce_bucket_quantized(self, staging, out, starts, packed, lane: int = 0) -> Pending:
        """Stages 1-3 with qgZ: reduce_bucket through int8 or int4 blocks (the Comm's
        quantized one; packed: its QuantizedBuffers)."""
        self.comm.reduce_scatter_quantized(staging, out, starts, packed)
        return Pending(f"reduce_scatter_int{packed.bits}")

    def reduce_bucket_two_hops(self, staging, out, starts, packed, hops, lane: int = 0) -> Pending:
        """Stages 1-3 with qgZ in two hops (hops: zero_ref/comm/groups.py QgzHops): inside
        the group, then across the groups."""
        self.comm.reduce_scatter_quantized_two_hops(staging, out, starts, packed, hops)
        return Pending(f"reduce_scatter_int{packed.bits} in two hops")

    def gather_unit(self, shard: np.ndarray, out: np.ndarray, lane: int = 0) -> Pending:
        """Stage 3: out <- a unit's full parameters from every rank's shard of it."""
        self.comm.allgather(shard, out)
        return Pending("allgather")

    def gather_unit_bytes(self, send: np.ndarray, recv: np.ndarray, lane: int = 0) -> Pending:
        """Stage 3 with qwZ: recv <- every rank's quantized slice of a unit (bytes)."""
        self.comm.allgather_bytes(send, recv)
        return Pending("allgather_int8")

    def gather_updated(self, unit_params: np.ndarray, lane: int = 0) -> Pending:
        """Stages 1-2: every rank's updated block of a unit, in place."""
        self.comm.allgather_in_place(unit_params)
        return Pending("allgather")

    def wait(self, pending: Pending | InFlight) -> None:
        """Block until `pending` is complete (a blocking one already is), once each."""
        pending.wait()

    def full_gradient_unit_done(self, i: int, reduce_unit) -> None:
        """Stage 1 (a full gradient buffer): backward is done with unit i. Blocking, its
        buckets wait for the end of backward (DeepSpeed's stage 1 without overlap_comm
        reduces in reduce_gradients() after backward)."""

    def full_gradient_done(self, n_units: int, reduce_unit) -> None:
        """Stage 1: backward is done: every unit through the buckets, last first."""
        for i in range(n_units - 1, -1, -1):
            reduce_unit(i)

    def poke(self) -> None:
        """A unit boundary: nothing is in flight."""

    def settle(self) -> None:
        """Nothing is in flight."""

    def close(self) -> None:
        """Nothing to stop."""


class OverlappingSchedule(BlockingSchedule):
    """Collectives issued now and waited for when their result is read (--overlap-comm).
    `lane`: which of a caller's buffers a call uses (a bucket's staging lane, a
    gathered-unit buffer, a unit); calls in flight together have distinct lanes, so a
    staged device Comm keeps a host buffer pair for each."""

    lanes = 2  # double-buffered staging: one bucket packs while the other is reduced
    prefetches = True

    def reduce_bucket(self, staging: np.ndarray, out: np.ndarray, lane: int = 0) -> InFlight:
        return self.comm.ireduce_scatter_sum(staging, out, f"bucket {lane}")

    def reduce_bucket_quantized(self, staging, out, starts, packed, lane: int = 0) -> InFlight:
        return self.comm.ireduce_scatter_quantized(staging, out, starts, packed, f"bucket {lane}")

    def reduce_bucket_two_hops(self, staging, out, starts, packed, hops, lane: int = 0) -> InFlight:
        """The first hop issued; the second issued at the first unit boundary after the
        first is in (the schedule's poke), or when the bucket is waited for."""
        lane_name = f"bucket {lane}"
        return self.comm.ireduce_scatter_quantized_two_hops(
            staging, out, starts, packed, hops, lane_name
        )

    def gather_unit(self, shard: np.ndarray, out: np.ndarray, lane: int = 0) -> InFlight:
        return self.comm.iallgather(shard, out, lane=f"gather {lane}")

    def gather_unit_bytes(self, send: np.ndarray, recv: np.ndarray, lane: int = 0) -> InFlight:
        return self.comm.iallgather_bytes(send, recv, lane=f"gather {lane}")

    def gather_updated(self, unit_params: np.ndarray, lane: int = 0) -> InFlight:
        """Stages 1-2: `lane` is the unit's index (every unit's gather is in flight)."""
        return self.comm.iallgather_in_place(unit_params, f"unit {lane}")

    def full_gradient_unit_done(self, i: int, reduce_unit) -> None:
        """Stage 1: unit i's gradients into the buckets now, while backward goes on
        (DeepSpeed's stage_1_and_2.py hooks each gradient when partition_gradients or
        overlap_comm is set)."""
        reduce_unit(i)

    def full_gradient_done(self, n_units: int, reduce_unit) -> None:
        """Stage 1: every unit was sent through the buckets during backward."""

    def poke(self) -> None:
        """A unit boundary: let the progress policy drive what is in flight, and issue
        the second calls of chained collectives whose first is in (qgZ's second hop)."""
        self.comm.progress.poke()
        self.comm.advance()

    def settle(self) -> None:
        """Wait for everything still in flight (before state is read or written)."""
        self.comm.settle()

    def close(self) -> None:
        """Stop the progress policy (its thread, if it has one); the Comm is left with
        "none", so an engine made on it later starts from nothing running."""
        self.comm.settle()
        self.comm.progress.close()
        self.comm.progress = progress_for("none", self.comm.mpi)


def schedule_for(cfg, comm: Comm) -> BlockingSchedule:
    """The schedule a config asks for: OverlappingSchedule with cfg.overlap.comm, its
    progress policy (cfg.overlap.progress) given to the Comm here, once; else blocking (every
    collective waited for where it is issued, as the oracle's order is)."""
    if not cfg.overlap.comm:
        return BlockingSchedule(comm)
    comm.progress.close()  # a Comm reused by a new engine: the old policy stops
    comm.progress = progress_for(cfg.overlap.progress, comm.mpi)
    return OverlappingSchedule(comm)
