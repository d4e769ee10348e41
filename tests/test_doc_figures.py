"""What the docs' timeline and communication figures must state (docs/stages.md,
docs/memory.md), redrawn from one small offloaded run: whole steps on one time axis,
a legend entry for every color drawn, the offload lanes left to the zoomed panel,
and the paper's bars in bytes, labelled with the volume they are."""

from __future__ import annotations

import json

import pytest

from tests.mpi_pool import mpirun_command, run_watched
from tests.tiny_gpt import TINY_GPT


@pytest.fixture(scope="module")
def offloaded_run(tmp_path_factory, tiny_corpus):
    """A 7-step stage-3 run with both offloads, traced and logged, on 2 ranks."""
    out = tmp_path_factory.mktemp("figures")
    (out / "nvme").mkdir()
    trace, log = out / "trace.json", out / "trace.jsonl"
    p = run_watched(
        mpirun_command(
            2, "-m", "zero_ref.train", *TINY_GPT, "--data", tiny_corpus, "--stage", "3",
            "--precision", "bf16", "--steps", "7", "--offload-optimizer", "nvme",
            "--offload-param", "nvme", "--nvme-path", str(out / "nvme"),
            "--sub-group-size", "100", "--trace", str(trace), "--log-jsonl", str(log),
        )
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return trace, log


@pytest.fixture
def scripts():
    from scripts.docs import plot_run, plot_trace

    return plot_run, plot_trace


def test_whole_steps_share_one_time_axis_and_every_color_is_named(scripts, offloaded_run):
    """Two steps of different lengths: both panels end at the longer one's end, each
    title gives its step's length, and the legend names forward, backward, the
    optimizer step and every collective drawn."""
    plot_run, plot_trace = scripts
    trace, _ = offloaded_run
    fig, _ = plot_trace.figure([f"{trace}:1", f"{trace}:median"])
    assert plot_run.outside_axes(fig) == []
    first, median = fig.axes[:2]
    assert first.get_xlim() == median.get_xlim()
    assert " ms); sent" in first.get_title() and "median step" in median.get_title()
    named = {t.get_text() for t in fig.legends[0].get_texts()}
    events = json.loads(trace.read_text())["traceEvents"]
    drawn = {  # the complete events: the instant ones ("gather <unit>" marks) are not drawn
        e["name"]
        for e in events
        if e.get("pid") == 0 and e.get("cat") == "collectives" and e.get("ph") == "X"
    }
    assert {"forward", "backward", "optimizer step"} <= named
    assert drawn - {"loss"} <= named


def test_offload_lanes_are_drawn_in_the_zoomed_panel_only(scripts, offloaded_run):
    """The whole step leaves the swap and AdamW sub-group lanes to its zoomed optimizer
    panel, which has them, while both still count the swap bytes."""
    plot_run, plot_trace = scripts
    trace, _ = offloaded_run
    fig, summary = plot_trace.figure([str(trace), f"{trace}:optimizer"])
    assert plot_run.outside_axes(fig) == []
    whole, zoom = ([t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes[:2])
    lanes = {"swap reads", "adamw sub-groups", "swap writes"}
    assert not lanes & set(whole) and lanes <= set(zoom)
    assert summary["trace:last"]["swap"] == summary["trace:last:optimizer"]["swap"] != {}


def test_the_paper_bar_is_in_bytes_and_says_what_it_is(scripts, offloaded_run):
    """gpt4_comm.png's paper bar is the log's paper_sent_bytes, labelled 3(N-1)/N Psi
    at stage 3, on an axis in bytes."""
    plot_run, _ = scripts
    _, log = offloaded_run
    logs = [(log, *plot_run.read_log(log))]
    fig = plot_run.plot_comm(logs)
    assert plot_run.outside_axes(fig) == []
    ax = fig.axes[0]
    final = logs[0][2]
    assert ax.get_ylabel().startswith("bytes")
    labels = [t.get_text() for t in ax.texts]
    assert labels == [f"3(N-1)/N Psi\n{final['paper_sent_bytes']:,} B"]


def _x(pid: int, cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"pid": pid, "ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def _two_steps(pid: int, late: float) -> list[dict]:
    """Two steps of one rank as train_step records them: forward, an all-gather this
    rank reaches `late` us after the other, the optimizer step, then the loss."""
    events = []
    for step, t in ((1, 0.0), (2, 100.0)):
        events += [
            _x(pid, "compute", "forward embed", t + 1, 5),
            _x(pid, "collectives", "allgather", t + 10, 20 + late),
            _x(pid, "optimizer", f"optimizer step {step}", t + 40, 10),
            _x(pid, "collectives", "loss", t + 50, 30 + late),
        ]
    return events


def test_a_step_ends_with_its_own_loss_all_reduce_not_the_previous_one(scripts):
    """Step 2's window starts where step 1's loss all-reduce ended and holds step 2's
    own: the previous step's loss never opens it, at the first step and at the last."""
    from scripts.docs.trace_steps import step_events

    events = _two_steps(0, 0.0)
    for step, start in ((1, 0.0), (2, 80.0), (None, 80.0)):
        got, began = step_events(events, step)
        assert began == start
        assert [e["name"] for e in got if e["cat"] == "collectives"] == ["allgather", "loss"]


def test_a_collective_waits_its_length_beyond_the_fastest_rank(scripts):
    """Rank 0 reaches every call 7 us before rank 1, and of three ranks rank 2 comes
    3 us after rank 1: each bar's wait is its duration minus the shortest over all
    the ranks (the last to arrive waits for nobody); ranks whose calls do not pair up
    get no waits."""
    from scripts.docs.trace_steps import collective_waits

    ranks = [_two_steps(0, 7.0), _two_steps(1, 0.0), _two_steps(2, -3.0)]
    for world, first, second in ((2, 7.0, 0.0), (3, 10.0, 3.0)):
        events = [e for rank in ranks[:world] for e in rank]
        waits = collective_waits(events)
        mine = [e for e in events if e["pid"] == 0 and e["cat"] == "collectives"]
        assert [waits[id(e)] for e in mine] == [first] * 4
        assert sorted(collective_waits(events, rank=1).values()) == [second] * 4
    ranks[1] = [e for e in ranks[1] if e["name"] != "loss"]
    assert collective_waits([e for rank in ranks for e in rank]) == {}
    assert collective_waits(ranks[0]) == {}  # one rank: nobody to wait for


def test_calls_in_flight_together_get_rows_of_their_own(scripts):
    """Three gathers in flight at once, and a fourth after the first lands: three
    sub-rows, the fourth reusing the second's, no two overlapping bars in one row."""
    _, plot_trace = scripts
    flights = [_x(0, "in flight", "allgather", ts, dur) for ts, dur in ((0, 9), (1, 3), (2, 9))]
    flights.append(_x(0, "in flight", "reduce_scatter", 5, 2))
    bars = plot_trace.placed(flights, 0.0, order=False)
    rows = plot_trace.sub_rows(bars)
    assert [rows[id(e)] for e in flights] == [(0, 3), (1, 3), (2, 3), (1, 3)]


def test_offload_timeline_lanes_are_the_threads_that_ran_the_step(scripts, offloaded_run):
    """offload_timeline.png (scripts/bench/bench_offload.py) draws one lane per thread that
    ran the offloaded step: the main thread's AdamW updates and each thread of the
    pipeline's I/O pool, which run reads and writes alike; never more I/O lanes than
    the pool has threads, and no lane that reads only or writes only by its label."""
    from scripts.bench import bench_offload
    from zero_ref.offload.pipeline import SWAP_LANES

    trace, _ = offloaded_run
    kind = {lane: what for what, lane in SWAP_LANES.items()}
    events = [
        (kind[e["cat"]], e["args"]["sub_group"], e["ts"], e["ts"] + e["dur"], e["args"]["thread"])
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("pid") == 0 and e.get("cat") in kind and "sub_group" in e["args"]
    ]  # the pipeline's events (stage 3's readahead hints share the reads' lane)
    lanes = bench_offload.thread_lanes(events)
    io = {t for what, *_, t in events if what != "update"}
    main = {t for what, *_, t in events if what == "update"}
    assert len(main) == 1 and not main & io and 1 <= len(io) <= 2
    assert all(t.startswith("zero_ref-swap") for t in io)
    labels = list(lanes.values())
    assert labels[0] == "AdamW (main thread)"
    assert labels[1:] == [f"I/O thread {k + 1}: reads, writes" for k in range(len(io))]


def test_compute_spread_is_over_the_steps_after_the_warm_up(scripts):
    """Eight steps whose forward takes 10 x step us and backward 1 us: the spread
    counts steps 6-8 only, each with its own forward, as [least, median, most] ms."""
    from scripts.docs.trace_steps import compute_spread

    events = []
    for step in range(1, 9):
        t = 1000.0 * step
        events += [
            _x(0, "compute", "forward embed", t, 10 * step),
            _x(0, "compute", "backward embed", t + 200, 1),
            _x(0, "optimizer", f"optimizer step {step}", t + 300, 10),
            _x(0, "collectives", "loss", t + 310, 5),
        ]
    assert compute_spread(events) == {
        "forward_ms": [0.06, 0.07, 0.08],
        "backward_ms": [0.0, 0.0, 0.0],
    }
