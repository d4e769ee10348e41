"""A non-blocking collective between its issue and its completion.

ZeRO hides its extra traffic behind compute (DeepSpeed's `overlap_comm`, FSDP's
all-gather and reduce-scatter streams): a bucket's reduce-scatter is issued and
backward goes on; stage 3 issues the next unit's all-gather while this one
computes. `Comm.ireduce_scatter_sum` / `iallgather` / `iallgather_in_place`
(zero_ref/comm/nonblocking.py) return an `InFlight`: the MPI request, the
buffers MPI is still reading or writing (kept alive here, and never touched by
the caller until `wait`), and what completes the call once the bytes are in:
for a deterministic sum, adding the received rows in rank order; for a 16-bit
sum, widening, adding and rounding once. So the values are those of the blocking
call, whenever the bytes happen to arrive.

MPI advances a request only inside MPI calls unless something drives it: the
Comm's progress policy (zero_ref/comm/progress.py) is told of each request when
it is issued and when it is waited for.

A `ChainedFlight` is a collective made of two calls, the second computed from the
first's bytes (qgZ's two hops, zero_ref/comm/reduction.py; the two-level gather and sum,
zero_ref/comm/hierarchical.py): the schedule's poke at a unit boundary (`Comm.advance`)
issues the second as soon as the first is in, so it too moves behind compute; its wait
issues the second if no poke did. When a second call goes out depends on when bytes
arrive, which differs between ranks, while MPI pairs the collectives of a communicator
by the order each rank issues them (MPI-3.1, Sec. 5.12: every process calls a
communicator's collectives, blocking and nonblocking, in the same order). Two rules
keep the pairs right: every rank issues second calls in the order of their flights
(`Comm.advance` stops at the first whose first call is not in; a wait issues the older
ones' first), and a second call's communicator carries no call the program issues in
its own order.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mpi4py import MPI

Finish = Callable[[], None]


class InFlight:
    """One issued collective; `wait()` once, then its output is valid."""

    def __init__(
        self,
        comm,
        kind: str,
        request: MPI.Request,
        finish: Finish | None = None,
        keep: tuple = (),
        args: dict | None = None,
    ) -> None:
        """kind: the ledger's name for it; finish: what turns the received bytes into
        the result (None: MPI wrote the result itself); keep: the temporaries MPI
        reads or writes until it completes."""
        self.comm, self.kind, self.request = comm, kind, request
        self.finishers: list[Finish] = [] if finish is None else [finish]
        self.keep = keep
        self.args = args or {}
        self.where = comm.ledger.where
        self.issued_at = time.perf_counter()
        self.issue_seconds = 0.0  # the time the issuing call itself blocked
        self.done = False
        comm.progress.started(request)
        comm.in_flight.append(self)

    def then(self, finish: Finish) -> InFlight:
        """Run `finish` after this call's own completion (a staged device copy back)."""
        self.finishers.append(finish)
        return self

    def wait(self) -> None:
        """Block until the bytes are in, complete the result, record the wait."""
        assert not self.done, f"{self.kind} issued at {self.where!r} waited for twice"
        t0 = time.perf_counter()
        self.comm.progress.finished(self.request)  # no other thread touches it from here
        self.request.Wait()
        for finish in self.finishers:
            finish()
        self.done, self.keep = True, ()
        self.comm.in_flight.remove(self)
        blocked = self.issue_seconds + time.perf_counter() - t0
        self.comm.ledger.record_waited(self.kind, self.issued_at, blocked, self.where, **self.args)


class ChainedFlight(InFlight):
    """Two issued calls, the second needing the first's bytes; `wait()` once, as for one."""

    def __init__(
        self,
        comm,
        kind: str,
        request: MPI.Request,
        second: Callable[[], MPI.Request],
        finish: Finish,
        keep: tuple = (),
        args: dict | None = None,
    ) -> None:
        """second: what turns the first call's bytes into the second call, issued (its
        request); finish: what completes the result after the second."""
        super().__init__(comm, kind, request, finish, keep, args)
        self.second = second
        self.second_issued = False

    def advance(self) -> bool:
        """Issue the second call if the first is complete (MPI_Test); whether it is
        issued. The progress policies never test the engine's requests, so this is the
        one thread that does."""
        if not self.second_issued and self.request.Test():
            self._issue_second()
        return self.second_issued

    def wait(self) -> None:
        """The first call waited for and the second issued, if no poke did (first the
        second calls of the chained flights issued before this one, so that every rank
        issues second calls in the order of their flights); then the second waited for
        and the result completed (the time blocked: both)."""
        if not self.second_issued:
            t0 = time.perf_counter()
            for flight in list(self.comm.in_flight):  # oldest first, up to this one
                if isinstance(flight, ChainedFlight) and not flight.second_issued:
                    flight.request.Wait()
                    flight._issue_second()
                if flight is self:
                    break
            self.issue_seconds += time.perf_counter() - t0
        super().wait()

    def _issue_second(self) -> None:
        self.comm.progress.finished(self.request)
        self.request = self.second()
        self.comm.progress.started(self.request)
        self.second_issued = True
