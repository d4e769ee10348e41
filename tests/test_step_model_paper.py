"""scripts/bench/step_model_zeropp_paper.py: the model's ZeRO++ speedups beside the
paper's, and the record docs/step_model.md renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench import step_model_zeropp_paper as paper

RESULT = Path(__file__).resolve().parents[1] / "docs" / "results" / "step_model_zeropp_paper.json"


@pytest.mark.parametrize("quantize", list(paper.QUANTIZATION))
@pytest.mark.parametrize("efficiency", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("tokens", [1024, 2048])
def test_a_slower_link_gains_more_from_zeropp(quantize, efficiency, tokens):
    """ZeRO++ cuts link bytes, so its gain over ZeRO-3 grows as the link slows."""
    fast = paper.speedup((400, 400), tokens, efficiency, quantize)
    slow = paper.speedup((100, 100), tokens, efficiency, quantize)
    assert slow > fast


@pytest.mark.parametrize("efficiency", [0.0, 0.5, 1.0])
def test_free_quantization_is_the_most_zeropp_can_gain(efficiency):
    for gbps in (400, 100):
        paid = paper.speedup((gbps, gbps), 1024, efficiency, "at HBM rate")
        free = paper.speedup((gbps, gbps), 1024, efficiency, "free")
        assert free > paid


def test_full_overlap_on_a_fast_link_leaves_nothing_to_gain():
    """At 400 Gb/s with 2k tokens ZeRO-3's traffic fits under compute: ZeRO++ with free
    (de)quantization is exactly as fast, whatever it saves on the link."""
    assert paper.speedup((400, 400), 2048, 1.0, "free") == pytest.approx(1.0, abs=1e-3)
    assert paper.comm_over_compute(400, 2048) < 1


@pytest.mark.parametrize(
    "values, runs",
    [
        ([], []),
        ([0.3], [[0.3, 0.3]]),
        ([0.0, 0.01, 0.02, 0.5, 0.51], [[0.0, 0.02], [0.5, 0.51]]),
        ([0.1, 0.12], [[0.1, 0.1], [0.12, 0.12]]),
    ],
)
def test_spans_join_consecutive_grid_values(values, runs):
    assert paper.spans(values) == runs


def test_fig8_puts_zero3_on_the_fast_link_and_zeropp_on_the_slow_one():
    """Fig. 8's rows compare ZeRO-3 at 800 Gb/s with ZeRO++ at 200: ZeRO++ on the slower
    link is slower than ZeRO++ on 800 would be, so the ratio is below that ratio."""
    fig8 = [r for r in paper.rows() if r["zero3_gbps"] != r["zeropp_gbps"]]
    assert fig8 and all((r["zero3_gbps"], r["zeropp_gbps"]) == (800, 200) for r in fig8)
    for r in fig8:
        for e in paper.EFFICIENCIES:
            same_link = paper.speedup((800, 800), r["tokens_per_gpu"], e, r["quantization"])
            assert r["model"][str(e)] <= same_link + 1e-12


def test_checkpointed_compute_splits_one_to_three():
    """8 flops a parameter a token: forward 2, backward 4 and the forward again."""
    w = paper.workload(False, 1024, 1.0, 0.0, 0.32)
    assert w.backward_s == pytest.approx(3 * w.forward_s)
    flops = 8 * paper.params() * 1024
    assert w.forward_s + w.backward_s == pytest.approx(flops / (125e12 * 0.32))


def test_both_is_where_the_two_figures_fit_at_once():
    for x in paper.sensitivity():
        fig6 = {e for a, b in x["spans"]["400"] for e in _grid(a, b)}
        fig7 = {e for a, b in x["spans"]["100"] for e in _grid(a, b)}
        both = {e for a, b in x["both"] for e in _grid(a, b)}
        assert both == fig6 & fig7


def _grid(first: float, last: float) -> list[float]:
    return [round(k / 100, 2) for k in range(round(first * 100), round(last * 100) + 1)]


def test_the_record_is_what_the_script_computes():
    """docs/step_model.md renders the recorded result: it must be the script's output at
    this commit (rerun `python scripts/bench/step_model_zeropp_paper.py --record`)."""
    recorded = json.loads(RESULT.read_text())
    assert recorded["settings"] == json.loads(json.dumps(paper.SETTINGS))
    assert recorded["rows"] == json.loads(json.dumps(paper.rows()))
    assert recorded["sensitivity"] == json.loads(json.dumps(paper.sensitivity()))
