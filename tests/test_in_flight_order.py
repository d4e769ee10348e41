"""zero_ref/comm/in_flight.py's ordering rule, without MPI: every rank issues the second
calls of its chained flights in the order of the flights, whether a poke (Comm.advance)
or a wait issues them, and whichever flight is waited for first. Fake requests stand in
for MPI's; the log is the order the second calls go out."""

from __future__ import annotations

import pytest

from zero_ref.comm.in_flight import ChainedFlight, InFlight
from zero_ref.comm.nonblocking import NonBlockingCollectives


class FakeRequest:
    def __init__(self, done: bool = False) -> None:
        self.done = done

    def Test(self) -> bool:  # noqa: N802 (MPI's name)
        return self.done

    def Wait(self) -> None:  # noqa: N802
        self.done = True


class FakeLedger:
    where = "test"

    def record_waited(self, *args, **kw) -> None:
        pass


class FakeProgress:
    def started(self, request) -> None:
        pass

    def finished(self, request) -> None:
        pass


class FakeComm:
    """What a flight reads of its Comm; advance is the Comm's own (NonBlockingCollectives')."""

    def __init__(self) -> None:
        self.in_flight: list[InFlight] = []
        self.ledger, self.progress = FakeLedger(), FakeProgress()

    advance = NonBlockingCollectives.advance


def chained(comm: FakeComm, name: str, log: list[str], first_done: bool) -> ChainedFlight:
    def second() -> FakeRequest:
        log.append(name)
        return FakeRequest(done=True)

    return ChainedFlight(comm, name, FakeRequest(first_done), second, lambda: None)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
def test_waits_in_any_order_issue_second_calls_in_flight_order(order):
    comm, log = FakeComm(), []
    flights = [chained(comm, f"f{k}", log, first_done=False) for k in range(3)]
    for k in order:
        flights[k].wait()
    assert log == ["f0", "f1", "f2"]
    assert comm.in_flight == []


def test_a_poke_stops_at_the_first_flight_not_in():
    """f1's first call is in, f0's is not: the poke issues nothing (else a rank whose
    f0 is in would issue f0 then f1, and this one f1 then f0)."""
    comm, log = FakeComm(), []
    f0 = chained(comm, "f0", log, first_done=False)
    f1 = chained(comm, "f1", log, first_done=True)
    comm.advance()
    assert log == []
    f0.request.done = True
    comm.advance()
    assert log == ["f0", "f1"]
    f1.wait()  # already issued: nothing more goes out, and f0 is still in flight
    assert log == ["f0", "f1"] and comm.in_flight == [f0]
    f0.wait()
    assert comm.in_flight == []


def test_a_plain_flight_between_chained_ones_changes_nothing():
    comm, log = FakeComm(), []
    f0 = chained(comm, "f0", log, first_done=False)
    plain = InFlight(comm, "plain", FakeRequest(done=True))
    f1 = chained(comm, "f1", log, first_done=False)
    f1.wait()
    assert log == ["f0", "f1"]
    plain.wait()
    f0.wait()
    assert comm.in_flight == []
