"""zero_ref/formulas/step_model.py's algebra at its boundaries: one rank, one host, no latency,
infinite bandwidth, the paper's 1x vs 1.5x volumes, placement and hiding."""

import math

import pytest

from zero_ref.formulas.step_model import (
    Cluster,
    Link,
    Workload,
    exposed_call_seconds,
    flight_seconds,
    flights_of,
    host_link_bytes,
    link_seconds,
    predict,
    stage3_forward_backward,
)
from zero_ref.formulas.traffic import stage3_gathers

UNITS = (1000, 3000, 2000, 500)
FAST = Link(0.0, math.inf)


def cluster(hosts=2, per_host=4, alpha=1e-5, rate=1e9, placement="block", coll="flat"):
    return Cluster(hosts, per_host, Link(alpha, 1e11), Link(alpha, rate), placement, coll)


def work(stage, **kw):
    return Workload(stage, UNITS, forward_s=0.01, backward_s=0.02, optimizer_s=0.004, **kw)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_rank_is_compute_alone(stage):
    c = Cluster(1, 1, Link(1.0, 1.0), Link(1.0, 1.0))
    p = predict(work(stage), c)
    assert p.exposed_s == 0.0 and p.hidden_s == 0.0
    assert p.step_s == pytest.approx(0.034)  # the optimizer is all on the one rank


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_infinite_bandwidth_zero_latency_is_compute(stage):
    c = Cluster(4, 8, FAST, FAST)
    assert predict(work(stage), c).step_s == pytest.approx(0.03 + 0.004 / (1 if stage == 0 else 32))


def test_latency_alone_counts_messages():
    c = Cluster(2, 1, Link(0.0, math.inf), Link(1e-3, math.inf))
    p = predict(work(1, reduce_buckets=3), c, scalars=0)
    assert p.exposed_s == pytest.approx(1e-3 * (3 + len(UNITS)))  # log2(2) = 1 message a call


def test_one_host_puts_nothing_on_the_link():
    c = Cluster(1, 8, Link(0.0, 1e9), Link(0.0, 1.0))  # a crawling link, never used
    for stage in range(4):
        assert all(host_link_bytes(f, c) == 0 for f in flights_of(work(stage), c))
        assert predict(work(stage), c).exposed_s < 1e-3


def link_bytes(stage, c, **kw):
    return sum(host_link_bytes(f, c) for f in flights_of(work(stage, **kw), c))


@pytest.mark.parametrize("coll,placement", [("hierarchical", "block"), ("flat", "cyclic")])
def test_stage3_moves_one_and_a_half_times_stage0(coll, placement):
    """Paper Sec. 7: 2 Psi (stage 0's all-reduce) vs 3 Psi (stage 3), less the last
    unit's backward gather (forward's copy is still in the buffer): 1.5 x (1 - 1/(3n))."""
    units = (4096,)
    c = cluster(placement=placement, coll=coll)
    w0 = Workload(0, units * 8, 0.0, 0.0)
    w3 = Workload(3, units * 8, 0.0, 0.0)
    psi_bytes = 4 * 4096 * 8
    b0 = sum(host_link_bytes(f, c) for f in flights_of(w0, c))
    b3 = sum(host_link_bytes(f, c) for f in flights_of(w3, c))
    assert b0 == pytest.approx(2 * psi_bytes / 2)  # 2 N (H-1)/H, H = 2
    assert b3 / b0 == pytest.approx((3 * 8 - 1) / (2 * 8))  # the last unit's reuse
    assert b3 / b0 < 1.5


def test_flat_in_blocks_pays_ranks_per_host_times():
    flat = link_bytes(1, cluster(per_host=4))
    least = link_bytes(1, cluster(per_host=4, coll="hierarchical"))
    assert flat == pytest.approx(4 * least)
    assert link_bytes(1, cluster(per_host=4, placement="cyclic")) == pytest.approx(least)
    assert link_bytes(0, cluster(per_host=4)) == link_bytes(0, cluster(coll="hierarchical"))


def test_zeropp_cuts_the_link_bytes():
    c = cluster(coll="hierarchical")
    plain = link_bytes(3, c)
    zpp = link_bytes(3, c, qwz_block=250, hpz=True, qgz_blocks=4)
    assert zpp < plain / 3  # int8 forward, no backward gather across, int8 gradients


def test_overlap_hides_up_to_the_phase_compute():
    c = cluster(rate=1e6)  # a slow link: comm far above compute
    blocking, overlapped = predict(work(3), c), predict(work(3, overlap=True), c)
    assert overlapped.hidden_s == pytest.approx(0.03)  # forward + backward, all of it
    assert blocking.step_s - overlapped.step_s == pytest.approx(0.03)
    fast = cluster(rate=1e15, alpha=0.0)
    assert predict(work(3, overlap=True), fast).exposed_s == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("n,k", [(1, 1), (1, 3), (4, 1), (5, 2), (7, 3)])
def test_forward_backward_split_sums_to_the_ledgers(n, k):
    forward, backward = stage3_forward_backward(n, k)
    assert [f + b for f, b in zip(forward, backward, strict=True)] == stage3_gathers(n, k)


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: Workload(4, UNITS, 0.0, 0.0), "stage"),
        (lambda: Workload(1, (), 0.0, 0.0), "unit_numels"),
        (lambda: Workload(1, UNITS, -1.0, 0.0), "forward_s"),
        (lambda: Workload(2, UNITS, 0.0, 0.0, hpz=True), "stage"),
        (lambda: Workload(0, UNITS, 0.0, 0.0, qgz_blocks=3), "stage"),
        (lambda: Workload(1, UNITS, 0.0, 0.0, qgz_blocks=3, qgz_hops=3), "qgz_hops"),
        (lambda: Workload(1, UNITS, 0.0, 0.0, qgz_hops=0), "qgz_hops"),
        (lambda: Workload(1, UNITS, 0.0, 0.0, call_s=-1e-6), "call_s"),
        (lambda: Workload(1, UNITS, 0.0, 0.0, overlap_efficiency=1.01), "overlap_efficiency"),
        (lambda: Cluster(0, 1, FAST, FAST), "hosts"),
        (lambda: Cluster(1, 1, FAST, FAST, placement="ring"), "placement"),
        (lambda: Cluster(1, 1, FAST, FAST, collectives="tree"), "collectives"),
        (lambda: Link(0.0, 0.0), "bytes_per_s"),
    ],
)
def test_bad_input_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_overlap_efficiency_scales_what_compute_can_cover():
    c = cluster(rate=1e6)
    full = predict(work(3, overlap=True), c)
    none = predict(work(3, overlap=True, overlap_efficiency=0.0), c)
    half = predict(work(3, overlap=True, overlap_efficiency=0.5), c)
    assert none.step_s == pytest.approx(predict(work(3), c).step_s)
    assert half.hidden_s == pytest.approx(full.hidden_s / 2)


def test_a_prefetch_plans_gathers_move_fewer_backward_bytes():
    """A plan that keeps a unit gathered across the turn (gathers_per_step) sends fewer
    backward gathers: the bytes fall by that unit's share."""
    c = cluster(coll="hierarchical")
    plain = link_bytes(3, c)
    held = link_bytes(3, c, gathers=(2, 2, 1, 1))  # units 2 and 3 held over the turn
    assert plain - held == pytest.approx(4 * 2000 * (2 - 1) / 2)
    with pytest.raises(ValueError, match="gathers"):
        work(3, gathers=(1, 1))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("overlap", [False, True])
def test_each_call_costs_its_overhead_where_no_link_is_waited_on(stage, overlap):
    """call_s is the rank's own CPU around each call: with no link seconds to wait on
    (an infinitely fast link across hosts), added whole once a call (the flights' and the
    scalars'), whatever the overlap; compute never hides it."""
    c = cluster(rate=math.inf)
    base = predict(work(stage, overlap=overlap), c, scalars=2)
    more = predict(work(stage, overlap=overlap, call_s=1e-3), c, scalars=2)
    calls = sum(f.calls for f in flights_of(work(stage), c)) + 2
    assert more.step_s - base.step_s == pytest.approx(1e-3 * calls)
    assert more.hidden_s == base.hidden_s
    one_rank = Cluster(1, 1, FAST, FAST)  # no collective at all: no overhead
    assert predict(work(stage, call_s=1.0), one_rank).step_s == pytest.approx(
        predict(work(stage), one_rank).step_s
    )


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_calls_the_waited_link_covers_cost_nothing_more(stage):
    """A slow link, blocking: the calls' seconds are paid less the link seconds' share of
    the step with every call paid, so more than nothing and less than all of them."""
    c = cluster(rate=1e6)
    base = predict(work(stage), c, scalars=2)
    own = 1e-3 * (sum(f.calls for f in base.flights) + 2)
    link = link_seconds(base.flights, c)
    paid = predict(work(stage, call_s=1e-3), c, scalars=2).step_s - base.step_s
    assert paid == pytest.approx(own * (1 - link / (base.step_s + own)))
    assert 0 < paid < own


@pytest.mark.parametrize("efficiency", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("zpp", [{}, {"hpz": True}], ids=["plain", "hpz"])
def test_overlap_leaves_each_phases_link_waited_on_by_the_share_it_did_not_hide(efficiency, zpp):
    """Overlapped, a phase's compute hides a share of its collectives, and the step
    waits on the rest of its link seconds only: hpZ's backward gathers, inside the host,
    cover compute without freeing any link second of forward's."""
    c = Cluster(2, 4, Link(1e-5, 2e6), Link(1e-5, 1e6))  # a slow host, to weigh hpZ's
    kw = {"overlap": True, "overlap_efficiency": efficiency, **zpp}
    base = predict(work(3, **kw), c, scalars=2)
    waited = 0.0
    for phase, compute in (("forward", 0.01), ("backward", 0.02)):
        mine = tuple(f for f in base.flights if f.hides_behind == phase)
        phase_s = sum(flight_seconds(f, c) for f in mine)
        waited += link_seconds(mine, c) * (1 - min(phase_s, efficiency * compute) / phase_s)
    assert 0 < waited <= link_seconds(base.flights, c)
    if efficiency > 0:
        assert waited < link_seconds(base.flights, c)  # some of it hidden
    own = 1e-3 * (sum(f.calls for f in base.flights) + 2)
    paid = predict(work(3, call_s=1e-3, **kw), c, scalars=2).step_s - base.step_s
    assert paid == pytest.approx(own * (1 - waited / (base.step_s + own)))


def test_only_the_link_seconds_overlap_left_exposed_cover_calls():
    """Overlapped with compute covering every link second, the step waits on none of
    them: every call's seconds are paid, as on an infinitely fast link."""
    c = cluster(rate=1e8)
    base = predict(work(3, overlap=True), c, scalars=2)
    assert base.hidden_s >= link_seconds(base.flights, c) > 0
    own = 1e-3 * (sum(f.calls for f in base.flights) + 2)
    more = predict(work(3, overlap=True, call_s=1e-3), c, scalars=2)
    assert more.step_s - base.step_s == pytest.approx(own)


@pytest.mark.parametrize(
    "own,waited,rest,paid",
    [
        (2.0, 0.0, 6.0, 2.0),  # no link waited on: all paid
        (2.0, 6.0, 6.0, 0.5),  # the step is all link: the calls' share of it is paid
        (2.0, 3.0, 6.0, 1.25),  # half the rest is link: 2 x (1 - 3/8)
        (0.0, 3.0, 6.0, 0.0),  # no calls
        (2.0, 0.0, 0.0, 2.0),  # the calls alone: all paid
        (0.0, 0.0, 0.0, 0.0),  # nothing at all
    ],
)
def test_exposed_call_seconds_at_its_ends(own, waited, rest, paid):
    assert exposed_call_seconds(own, waited, rest) == pytest.approx(paid)


@pytest.mark.parametrize("waited", [-1e-3, 6.01])
def test_a_waited_link_outside_the_step_is_refused(waited):
    """The waited link seconds are part of the rest of the step: below 0 or above it is
    a caller's error, named, not a negative or clamped payment."""
    with pytest.raises(ValueError, match="waited_link_s"):
        exposed_call_seconds(2.0, waited, 6.0)


def test_a_qgz_bucket_is_one_operation_in_one_hop_or_two():
    """call_s is paid once a bucket whatever qgZ's hops (what the two hosts measured)."""
    c = cluster(rate=math.inf)  # no link to wait on: every call's seconds paid
    for hops in (1, 2):
        plain = work(1, qgz_blocks=4, reduce_buckets=3, qgz_hops=hops)
        costly = work(1, qgz_blocks=4, reduce_buckets=3, qgz_hops=hops, call_s=1.0)
        extra = predict(costly, c, 0).step_s - predict(plain, c, 0).step_s
        assert extra == pytest.approx(3 + len(UNITS)), hops  # 3 buckets, a gather a unit


@pytest.mark.parametrize("per_host", [2, 3])
@pytest.mark.parametrize("placement", ["block", "cyclic"])
def test_one_hop_qgz_sends_each_ranks_rows_across(per_host, placement):
    """qgZ in one hop is an Alltoall: every rank's rows for the other hosts cross, L
    times the least whatever the placement; two hops send the least."""
    c = cluster(hosts=3, per_host=per_host, placement=placement, coll="hierarchical")
    one = flights_of(work(2, qgz_blocks=4, qgz_hops=1), c)[0]
    two = flights_of(work(2, qgz_blocks=4), c)[0]
    assert (one.kind, two.kind) == ("alltoall_qgz", "reduce_scatter_qgz")
    assert one.buffer_bytes == two.buffer_bytes  # the ledger's bytes: (W-1)/W N either way
    least = two.buffer_bytes * 2 / 3
    assert host_link_bytes(two, c) == pytest.approx(least)
    assert host_link_bytes(one, c) == pytest.approx(per_host * least)
