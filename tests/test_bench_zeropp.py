"""scripts/bench/bench_zeropp.py's pure parts (no MPI, no namespaces): the configurations as
data, the link formula, the final loss, the targets, the tables and the figures.

The two-host runs themselves use scripts/bench/overlap_runs.py's run_train, which
tests/test_bench_overlap.py runs on real namespaces.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scripts.bench import zeropp_report as zr

REPO = Path(__file__).resolve().parent.parent


HELP = (
    "--stage --precision --quantized-weights --quantized-gradients --hpz-partition-size "
    "--quantized-gradient-local-size"
)


def test_configs_are_picked_by_name_and_plain_stage_3_always_runs():
    assert [s.name for s in zr.setups_named("all")] == [s.name for s in zr.SETUPS]
    assert [s.name for s in zr.setups_named("all three")] == ["stage 3", "all three"]
    assert [s.name for s in zr.setups_named("+qgZ, +qwZ")] == ["stage 3", "+qwZ", "+qgZ"]
    with pytest.raises(ValueError, match=r"unknown \['qwz'\]; allowed: 'stage 3'"):
        zr.setups_named("qwz")
    with pytest.raises(ValueError, match="empty"):
        zr.setups_named(" , ")


def test_a_config_whose_flags_train_does_not_know_is_skipped_with_the_reason():
    by = {s.name: s for s in zr.SETUPS}
    assert not [s.name for s in zr.SETUPS if "," in s.name]  # --configs splits on commas
    assert zr.unknown_flags(by["all three"], HELP) is None
    assert "--hybrid-shard-size" in zr.unknown_flags(by["hybrid (2)"], HELP)
    # the quantize block goes only to configurations that quantize
    assert "--quantize-block" not in zr.train_flags(by["+hpZ"], 256)
    assert zr.train_flags(by["+qgZ"], 256)[-2:] == ["--quantize-block", "256"]
    assert zr.train_flags(by["stage 3"], 256) == ["--stage", "3", "--precision", "bf16"]


@pytest.mark.parametrize("world", [4, 8])
def test_the_link_formula_puts_a_world_collective_s_whole_buffer_on_the_link(world):
    """With ranks in blocks on two hosts, a flat all-gather of N bytes in all (each rank's
    ledger: (W-1)/W x N) puts L x N/2 on the link each way (recursive doubling: each of a
    host's L ranks sends half the buffer across): N at W = 4, twice the least (N/2)."""
    n, per_host = 6000 * world, world // 2
    ledger_bytes = (world - 1) * n // world
    for kind in ("allgather", "allgather_int8", "reduce_scatter", "reduce_scatter_int8"):
        assert zr.link_formula({kind: ledger_bytes}, world) == pytest.approx(per_host * n / 2)
    assert zr.link_formula({"allgather_hpz": ledger_bytes}, world) == 0.0  # inside the host
    # an all-reduce of N (ledger 2(W-1)/W x N): the whole buffer each way
    assert zr.link_formula({"loss": 2 * ledger_bytes}, world) == pytest.approx(n)
    # qgZ's two hops, the hosts as groups: the first stays, all of the second crosses
    hops = {"reduce_scatter_int4_local": 700, "reduce_scatter_int4_cross": 100}
    assert zr.link_formula(hops, world) == pytest.approx(per_host * 100)


def test_a_ledger_kind_without_a_formula_gives_none():
    assert zr.link_formula({"allgather": 300, "allreduce_max": 10}) == 400 + 10 * 2 / 3
    assert zr.link_formula({"allgather": 300, "allreduce_hybrid": 10}) is None
    assert zr.link_formula({"allgather": 300, "broadcast": 10}) is None


def test_the_paper_bytes():
    by = {s.name: s for s in zr.SETUPS}
    assert zr.paper_bytes(by["stage 3"], 1000) == 3 * 2000  # 3M, M = 2 Psi
    assert zr.paper_bytes(by["all three"], 1000) == 1.0 * 2000  # int8 qgZ: 0.5 + 0 + 0.5
    assert zr.paper_bytes(by["hybrid (2)"], 1000) is None


def test_the_final_loss_is_the_mean_of_the_last_50_steps():
    losses = [10.0] * 30 + [2.0] * 25 + [4.0] * 25
    assert zr.final_loss(losses) == pytest.approx((2.0 * 25 + 4.0 * 25) / 50)
    with pytest.raises(ValueError, match="49 losses"):
        zr.final_loss([1.0] * 49)
    s = zr.loss_summary([2.0, 2.1, 1.9])
    assert s["mean"] == pytest.approx(2.0) and s["spread"] == pytest.approx(0.2)


def run(step_s: float, rx: float, tx: float) -> dict:
    return {"step_s": step_s, "link_rx_bytes": rx, "link_tx_bytes": tx}


def made_up() -> tuple[list[dict], list[dict]]:
    links = [{"rate_mbit": None, "link_bytes_s": 1e9}, {"rate_mbit": 30.0, "link_bytes_s": 3e6}]
    plain = {
        "config": "stage 3",
        "skipped": None,
        "ledger": {"allgather": 3000, "reduce_scatter": 1500},
        "link_formula": 6000.0,
        "paper_bytes": 6000.0,
        "runs": {"unlimited": run(0.02, 6300, 6200), "30": run(0.2, 6400, 6300)},
    }
    three = {
        **plain,
        "config": "all three",
        "ledger": {"allgather_int8": 900, "allgather_hpz": 1000, "reduce_scatter_int8": 800},
        "link_formula": 2266.7,
        "runs": {"unlimited": run(0.03, 2000, 2100), "30": run(0.09, 2050, 2150)},
    }
    hybrid = {"config": "hybrid (host)", "skipped": "zero_ref.train does not know it yet"}
    return [plain, three, hybrid], links


def test_the_link_targets():
    rows, links = made_up()
    checks = zr.link_targets(rows, links)
    assert [c["holds"] for c in checks] == [False, True]
    assert checks[0]["value"] == pytest.approx(4100 / 12500)  # both directions
    assert checks[1]["value"] == pytest.approx(0.09 / 0.2)
    # stage 3's busier direction at 30 Mbit/s, 6400 B / 3e6 B/s, against its 0.02 s compute
    assert checks[1]["comm_bound"] is False and "0.1 x its compute" in checks[1]["target"]


def test_the_tables_show_formula_beside_measurement_and_skipped_rows():
    rows, links = made_up()
    text = zr.bytes_table(rows)
    line = next(x for x in text.splitlines() if x.startswith("| all three"))
    assert "allgather_hpz 1,000<br>allgather_int8 900" in line
    assert "| 2,267 | 2,000 / 2,100 | 0.93 | 0.33 |" in line
    assert "not run: zero_ref.train does not know it yet" in text
    times = zr.times_table(rows, links)
    assert "| all three | 30.0 (1.50x) | 90.0 (0.45x) |" in times
    assert "30 Mbit/s: 3.0 MB/s" in times


def loss_result() -> dict:
    import math

    curve = [3 + math.cos(i / 40) / (1 + i / 100) for i in range(300)]
    rows = [
        {"config": name, "skipped": None, "curve": [x * f for x in curve], "curve_seed": 0,
         "final_loss": [2.0 * f, 2.01 * f], "mean": 2.005 * f, "spread": 0.01 * f}
        for name, f in (("stage 3", 1.0), ("+qwZ", 1.01), ("all three", 0.99))
    ]  # fmt: skip
    rows.append({"config": "hybrid (host)", "skipped": "not known yet"})
    settings = {"quantize_block": 256, "steps_loss": 300, "seeds": [0, 1], "ranks": 4}
    return {"loss_rows": rows, "settings": settings, "targets": zr.loss_targets(rows)}


def test_the_loss_targets_and_table():
    result = loss_result()
    moved = {c["target"].split(":")[0]: c["value"] for c in result["targets"]}
    assert moved == pytest.approx({"+qwZ": 0.01, "all three": 0.01})
    text = zr.loss_table(result["loss_rows"])
    assert "| +qwZ | 2.0250 | 0.0101 | +1.00 % | 2.0200, 2.0301 |" in text


@pytest.fixture
def plot():
    from scripts.docs import plot_run, plot_zeropp

    return plot_run, plot_zeropp


def test_the_loss_figure_names_every_configuration_run(plot):
    plot_run, plot_zeropp = plot
    fig = plot_zeropp.loss_figure(loss_result())
    assert plot_run.outside_axes(fig) == []
    named = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [n.split(":")[0] for n in named] == ["stage 3", "+qwZ", "all three"]
    assert "final 2.0250 (spread 0.0101, 2 seeds)" in named[1]


def test_the_summed_figure_draws_every_tensor_in_int8_and_int4(plot):
    plot_run, plot_zeropp = plot
    bits = {"summed_grad_rel_l2_error": 0.01, "per_tensor": {"a.w": 0.01, "b.w": 0.02}}
    results = [
        {"block": b, "world": 4, "steps": 3, "precision": "fp32", **bits,
         "int4": {**bits, "summed_grad_rel_l2_error": 0.1}}
        for b in (256, 2048)
    ]  # fmt: skip
    fig = plot_zeropp.summed_figure(results)
    assert plot_run.outside_axes(fig) == []
    (ax,) = fig.axes
    assert [len(c.get_offsets()) for c in ax.collections] == [2, 2, 2, 2]  # int8, int4 each
    assert len(ax.lines) == 4  # the whole gradient's error, per record and bits
    assert "int4, blocks of <= 2048: whole gradient 10.00 %" in [
        t.get_text() for t in ax.get_legend().get_texts()
    ]


@pytest.mark.parametrize(
    "result, png, draw",
    [
        ("bench_zeropp_loss_hops", "zeropp_loss_hops.png", "loss_figure"),
        ("qgz_error_block256", "zeropp_quantize_error.png", "summed_figure"),
    ],
)
def test_the_docs_figures_are_drawn_from_recorded_results(plot, result, png, draw):
    """docs/zeropp.md shows each figure, committed beside the result it is drawn from, and
    that result draws without anything outside the axes (the loss figure: a curve for
    every configuration the result ran)."""
    import json

    plot_run, plot_zeropp = plot
    data = json.loads((REPO / "docs" / "results" / f"{result}.json").read_text())
    assert f"](img/{png})" in (REPO / "docs" / "zeropp.md").read_text()
    assert (REPO / "docs" / "img" / png).stat().st_size > 10_000
    fig = getattr(plot_zeropp, draw)(data if draw == "loss_figure" else [data])
    assert plot_run.outside_axes(fig) == []
    if draw == "loss_figure":
        ran = [r["config"] for r in data["loss_rows"] if not r.get("skipped")]
        named = [t.get_text().split(":")[0] for t in fig.legends[0].get_texts()]
        assert named == ran and len(ran) >= 4


def test_the_ledger_and_seconds_are_read_from_the_final_record(tmp_path):
    import json

    from scripts.bench import bench_zeropp

    ranks = [
        {"comm_last_step": {"allgather": {"sent_bytes": 300, "seconds": s},
                            "loss": {"sent_bytes": 48, "seconds": 0.001}}}
        for s in (0.01, 0.03, 0.02, 0.04)
    ]  # fmt: skip
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"final": True, "ranks": ranks}))
    final, ledger, equal = bench_zeropp.ledger_of(log)
    assert ledger == {"allgather": 300, "loss": 48} and equal
    assert bench_zeropp.kind_seconds(final)["allgather"] == pytest.approx(0.025)  # median
    ranks[2]["comm_last_step"]["allgather"]["sent_bytes"] = 301
    log.write_text(json.dumps({"final": True, "ranks": ranks}))
    assert bench_zeropp.ledger_of(log)[2] is False


def test_the_loss_part_runs_seed_by_seed_and_skips_what_train_does_not_know(monkeypatch):
    import argparse

    from scripts.bench import bench_zeropp

    calls = []

    def fake_run(flags, seed, a, log):
        calls.append((flags[-1] if "--quantized-weights" in flags else "plain", seed))
        return [{"loss": 3.0 - i / 100 + seed, "step_time_s": 0.1} for i in range(60)]

    monkeypatch.setattr(bench_zeropp, "loss_run", fake_run)
    a = argparse.Namespace(seeds=[0, 1], quantize_block=256, model_flags="", prefix="t")
    setups = zr.setups_named("+qwZ,hybrid (2)")
    rows = bench_zeropp.loss_part(setups, HELP, a)
    assert [c[1] for c in calls] == [0, 0, 1, 1]  # every configuration of a seed, then the next
    plain, qwz, hybrid = rows
    assert hybrid["skipped"] and hybrid["final_loss"] == [] and "mean" not in hybrid
    assert plain["final_loss"] == pytest.approx([3.0 - 0.345, 4.0 - 0.345])  # last 50 of 60
    assert plain["curve_seed"] == 0 and len(plain["curve"]) == 60 and plain["curve"][0] == 3.0
    assert qwz["spread"] == pytest.approx(1.0)


TINY_QUANTIZED = ["--stage", "3", "--quantize-block", "16", "--d-model", "16", "--n-layer", "1"]
TINY_QUANTIZED += ["--n-head", "2", "--context", "8"]


@pytest.mark.parametrize(
    "script, flags, key",
    [
        ("qgz_error.py", [], "int4"),
    ],
)
def test_the_error_scripts_run_on_a_tiny_model_and_end_with_json(script, flags, key):
    """The figures' scripts run as docs/zeropp.md gives them (scaled down): a quantization
    error in int8 and int4 from the oracle's gradients after a step."""
    import json
    import subprocess

    argv = [
        sys.executable,
        str(REPO / "scripts" / "bench" / script),
        "--steps",
        "1",
        "--world",
        "2",
    ]
    done = subprocess.run(
        [*argv, "--", *TINY_QUANTIZED, *flags], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world"] == 2 and result["steps"] == 1 and key in result
    assert result["per_tensor"] and result[key]["per_tensor"].keys() == result["per_tensor"].keys()
