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


def test_each_span_gives_the_reported_range_and_its_neighbours_do_not():
    """The table's last column: every efficiency in a span puts the model's ratio in the
    reported range, and the grid value just outside a span does not."""
    for r in paper.rows():
        low, high = r["reported_range"]
        gbps = (r["zero3_gbps"], r["zeropp_gbps"])

        def inside(e: float, r: dict = r, gbps: tuple = gbps, lo=low, hi=high) -> bool:
            ratio = paper.speedup(gbps, r["tokens_per_gpu"], e, r["quantization"])
            return lo - 0.005 <= ratio <= hi + 0.005

        for first, last in r["efficiencies_within"]:
            assert inside(first) and inside(last)
            assert first == 0.0 or not inside(round(first - 0.01, 2))
            assert last == 1.0 or not inside(round(last + 0.01, 2))


def test_the_record_is_what_the_script_computes():
    """docs/step_model.md renders the recorded result: it must be the script's output at
    this commit (rerun `python scripts/bench/step_model_zeropp_paper.py --record`)."""
    recorded = json.loads(RESULT.read_text())
    assert recorded["settings"] == json.loads(json.dumps(paper.SETTINGS))
    assert recorded["rows"] == json.loads(json.dumps(paper.rows()))
