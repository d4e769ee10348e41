"""scripts/bench/step_model_check.py's pure parts: the fit recovers the constants of
step times the model itself made, and repeated sweeps merge to each case's least."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scripts.bench import step_model_check as check
from scripts.bench.step_model_runs import CONFIGS

REPO = Path(__file__).resolve().parents[1]


RATES = {None: 1.2e9, 300.0: 2.4e7, 100.0: 9.5e6, 30.0: 3.4e6}
KINDS = {  # the ledger's calls per kind the check reads (buckets, scalars): stage 0, 1-3
    0: {"allreduce": {"calls": 15}, "loss": {"calls": 1}},
    3: {"reduce_scatter": {"calls": 15}, "loss": {"calls": 1}, "norm": {"calls": 1}},
}
ZPP_KINDS = {"reduce_scatter_int8_local": {"calls": 19}, "loss": {"calls": 1}, "norm": {"calls": 1}}


def synthetic(theta: dict) -> list[dict]:
    """Every fitted configuration at every rate, its step time the model's own."""
    cases = []
    for rate, link in RATES.items():
        for config in (*check.FIT_SET, *check.OVERLAP_FIT):
            stage, flags = CONFIGS[config]
            kinds = ZPP_KINDS if "zeropp" in config else KINDS[0 if stage == 0 else 3]
            case = {"config": config, "stage": stage, "flags": list(flags), "kinds": kinds}
            case |= {"placement": "block", "rate_mbit": rate, "link_bytes_s": link}
            case |= {"alpha_s": 2e-5, "intra_bytes_s": 1.2e9}
            case["step_s"] = check.predicted(case, theta).step_s
            cases.append(case)
    return cases


def test_the_fit_recovers_the_models_own_constants():
    """The four linear constants, then each link's overlap efficiency (a different one
    per link, so a fit that shared one across links would fail)."""
    theta = {
        "compute_s": 0.03,
        "link_factor": 0.9,
        "quantize_s_per_numel": 2e-8,
        "call_s": 3e-4,
    }
    efficiency = {"None": 0.0, "300.0": 0.3, "100.0": 0.6, "30.0": 0.9}
    cases = synthetic(theta | {"overlap_efficiency": efficiency})
    fitted = check.fit(cases)["constants"]
    for name, value in theta.items():
        assert fitted[name] == pytest.approx(value, rel=1e-6), name
    # the unlimited link's runs are too short for overlap to change them: any value fits
    for rate in ("300.0", "100.0", "30.0"):
        assert fitted["overlap_efficiency"][rate] == pytest.approx(efficiency[rate]), rate


def test_a_fit_whose_shares_do_not_settle_is_refused(monkeypatch):
    """The fixed point's rounds are bounded: one round cannot confirm the shares it
    started from (0, where the calls hide), so the fit stops with a message."""
    theta = {"compute_s": 0.03, "link_factor": 0.9, "quantize_s_per_numel": 2e-8}
    cases = synthetic(theta | {"call_s": 3e-4, "overlap_efficiency": {}})
    monkeypatch.setattr(check, "FIXED_POINT_ROUNDS", 1)
    with pytest.raises(SystemExit, match="did not settle in 1 rounds"):
        check.fit(cases)


def test_nonnegative_lstsq_never_returns_a_negative_constant():
    """Where the plain fit drives a constant below 0, it is held at 0 and the others
    refit; where the plain fit is already >= 0, it is returned unchanged."""
    a = np.array([[1.0, 1.0], [1.0, 1.1], [1.0, 0.9]])
    y = np.array([1.0, 0.9, 1.1])  # the plain fit's second constant is negative
    plain, *_ = np.linalg.lstsq(a, y, rcond=None)
    assert plain[1] < 0
    theta = check.nonnegative_lstsq(a, y)
    assert (theta >= 0).all() and theta[1] == 0
    assert theta[0] == pytest.approx(1.0)  # the mean of y, the best with the second at 0
    y_ok = a @ np.array([0.5, 0.25])
    assert check.nonnegative_lstsq(a, y_ok) == pytest.approx([0.5, 0.25])


def test_merged_takes_each_cases_least_repeat_and_keeps_them_all():
    link = {"rate_mbit": None, "link_bytes_s": 1e9, "allgather_tiny_s": 4e-5}
    case = {"config": "s0", "placement": "block", "rate_mbit": None, "step_s": 0.05}
    failed = {"config": "s3_zeropp", "placement": "cyclic", "rate_mbit": None, "error": "x"}
    sweeps = [
        {"links": [link], "cases": [case, failed]},
        {"links": [link | {"link_bytes_s": 3e9}], "cases": [case | {"step_s": 0.04}, failed]},
    ]
    out = check.merged(sweeps)
    (ran,) = [c for c in out["cases"] if "error" not in c]
    assert ran["step_s"] == 0.04 and ran["step_s_repeats"] == [0.05, 0.04]
    assert ran["link_bytes_s"] == out["links"][0]["link_bytes_s"] == 2e9  # the median
    assert out["sweeps"] == 2 and sum("error" in c for c in out["cases"]) == 1


TINY = {"allgather_tiny_s": 4e-5}


def test_merged_takes_the_ledger_and_bytes_of_the_least_run():
    """A case's ledger seconds and link bytes come from the run whose step is the least,
    whichever sweep it is in, so they describe the step the check compares."""
    run = {"config": "s3", "placement": "block", "rate_mbit": 100.0}
    slow = run | {"step_s": 0.09, "ledger_comm_s": 0.07, "link_rx_bytes": 9, "link_tx_bytes": 9}
    fast = run | {"step_s": 0.08, "ledger_comm_s": 0.06, "link_rx_bytes": 5, "link_tx_bytes": 6}
    slow["link_bytes_s"], fast["link_bytes_s"] = 1e7, 2e7  # each its own sweep's rate
    for order in ([slow, fast], [fast, slow]):
        sweeps = [
            {
                "links": [{"rate_mbit": 100.0, "link_bytes_s": c["link_bytes_s"]} | TINY],
                "cases": [c],
            }
            for c in order
        ]
        (case,) = check.merged(sweeps)["cases"]
        assert (case["step_s"], case["ledger_comm_s"], case["link_tx_bytes"]) == (0.08, 0.06, 6)
        assert case["sweep_link_bytes_s"] == 2e7 and case["link_bytes_s"] == 1.5e7


def test_configs_of_names_every_allowed_one_on_a_bad_name():
    assert check.configs_of(None) == list(CONFIGS)
    assert check.configs_of("s3_hier, s0") == ["s3_hier", "s0"]
    for bad in ("s9", "", " , "):
        with pytest.raises(SystemExit, match="allowed are s0, s1"):
            check.configs_of(bad)


@pytest.mark.parametrize(
    "flags,expected",
    [
        ([], "flat"),
        (["--collectives", "hierarchical"], "hierarchical"),
        (["--collectives", "hierarchical", "--collectives", "flat"], "flat"),  # the last wins
        (["--overlap-comm", "--collectives", "hierarchical"], "hierarchical"),
    ],
)
def test_collectives_of_reads_the_runs_flag(flags, expected):
    assert check.collectives_of({"flags": flags}) == expected
    case = {"flags": flags, "link_bytes_s": 1e7, "intra_bytes_s": 1e9, "alpha_s": 2e-5}
    case["placement"] = "block"
    assert check.cluster_of(case, {"link_factor": 1.0}).collectives == expected


def test_every_hierarchical_config_says_so_and_pairs_a_flat_one():
    """Each two-level configuration is a flat one's flags plus --collectives
    hierarchical, so the check compares like with like."""
    hier = {k: v for k, v in CONFIGS.items() if k.endswith("_hier")}
    assert hier
    for name, (stage, flags) in hier.items():
        flat_stage, flat_flags = CONFIGS[name.removesuffix("_hier")]
        assert stage == flat_stage
        assert [f for f in flags if f not in ("--collectives", "hierarchical")] == list(flat_flags)


def test_a_sweep_without_the_fitted_configs_says_what_to_merge():
    theta = {"compute_s": 0.03, "link_factor": 1.0, "quantize_s_per_numel": 0.0, "call_s": 0.0}
    cases = [c for c in synthetic(theta) if c["config"] not in check.FIT_SET]
    with pytest.raises(SystemExit, match="--from-raw"):
        check.fit(cases)
