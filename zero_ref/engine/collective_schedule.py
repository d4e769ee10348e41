"""When each of a step's collectives is issued and when it is waited for: a policy.

ZeRO's stages (Sec. 5) name the collectives of a step: stage 0 all-reduces the
gradients (Sec. 5.1's baseline), stages 1-3 reduce-scatter them in buckets
(Sec. 5.2), stages 1-2 all-gather the updated parameters, and stage 3 gathers
each unit's parameters before its forward and its backward (Sec. 5.3). A stage
asks the schedule to issue one (`allreduce_chunk`, `reduce_bucket`,
`gather_unit`, `gather_updated`) and gets a `Pending` it hands back to `wait`
before it reads the result.

Today every collective blocks: `BlockingSchedule` issues and waits at once (the
returned `Pending` is already complete), so results and the order of MPI calls
are the ones the oracle follows. An overlapping schedule (issue a bucket's
reduction, or the next unit's gather, and wait for it later) plugs in here with
the same calls; the stage classes do not change. (Not comm/schedule.py, which
checks that all ranks enter the same collective.)
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm


class Pending:
    """A collective the schedule issued; its output is valid after schedule.wait()."""

    def __init__(self, what: str) -> None:
        self.what, self.waited = what, False


class BlockingSchedule:
    """Every collective issued and completed by the call that issues it."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def allreduce_chunk(self, wire, grads: np.ndarray) -> Pending:
        """Stage 0: grads <- the sum over ranks (through the precision's wire)."""
        wire.allreduce(self.comm, grads)
        return Pending("allreduce")

    def reduce_bucket(self, staging: np.ndarray, out: np.ndarray) -> Pending:
        """Stages 1-3: out <- this rank's block of the sum of a bucket's staging."""
        self.comm.reduce_scatter_sum(staging, out)
        return Pending("reduce_scatter")

    def gather_unit(self, shard: np.ndarray, out: np.ndarray) -> Pending:
        """Stage 3: out <- a unit's full parameters from every rank's shard of it."""
        self.comm.allgather(shard, out)
        return Pending("allgather")

    def gather_updated(self, unit_params: np.ndarray) -> Pending:
        """Stages 1-2: every rank's updated block of a unit, in place."""
        self.comm.allgather_in_place(unit_params)
        return Pending("allgather")

    def wait(self, pending: Pending) -> None:
        """Block until `pending` is complete (here it already is); once per Pending."""
        assert not pending.waited, f"{pending.what} waited for twice"
        pending.waited = True


def schedule_for(cfg, comm: Comm) -> BlockingSchedule:
    """The schedule a config asks for: blocking, the only one so far (every collective
    waited for where it is issued, as the oracle's order is)."""
    return BlockingSchedule(comm)
