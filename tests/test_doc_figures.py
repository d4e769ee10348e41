"""What the docs' timeline and communication figures must state (docs/stages.md,
docs/memory.md), redrawn from one small offloaded run: whole steps on one time axis,
a legend entry for every color drawn, the offload lanes left to the zoomed panel,
and the paper's bars in bytes, labelled with the volume they are."""

from __future__ import annotations

import json

import pytest

from tests.mpi_pool import REPO, mpirun_command, run_watched
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
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import plot_run
    import plot_trace

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
    drawn = {e["name"] for e in events if e.get("pid") == 0 and e.get("cat") == "collectives"}
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
