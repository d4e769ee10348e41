"""The renderers of scripts/docs/doc_tables.py for docs/step_model.md: the step-time model's
check on the namespace hosts (scripts/bench/step_model_check.py) and its tables for
clusters (scripts/bench/step_model_clusters.py); shared formatting in doc_tables_render.py.
"""

from __future__ import annotations

from scripts.docs.doc_tables_render import Result, measured_by, table


def _rate(mbit: float | None) -> str:
    return "unlimited" if mbit is None else f"{mbit:g}"


def _mbit(key: str) -> float | None:
    """A link's rate from its key in the JSON ('None' or '300.0')."""
    return None if key == "None" else float(key)


def step_model_fit(res: Result) -> str:
    """The fitted constants and the summary of the check."""
    d = res.data
    c, s = d["fit"]["constants"], d["summary"]
    rows = [
        ["compute_s (forward + backward + optimizer)", f"{c['compute_s'] * 1e3:.1f} ms"],
        ["link_factor", f"{c['link_factor']:.2f}"],
        ["quantize_s_per_numel", f"{c['quantize_s_per_numel'] * 1e9:.1f} ns"],
        ["call_s (a collective call's own overhead)", f"{c['call_s'] * 1e6:.0f} us"],
    ]
    rows += [
        [f"overlap_efficiency, {_rate(_mbit(k))} link", f"{e:.2f}"]
        for k, e in c["overlap_efficiency"].items()
    ]
    alphas = ", ".join(
        f"{_rate(x['rate_mbit'])} {x['allgather_tiny_s'] / 2 * 1e6:.0f} us" for x in d["links"]
    )
    caption = (
        f"{measured_by(res)} The runs: {d['sweeps']} sweeps of step_model_runs.measure "
        "(what `sudo python scripts/bench/step_model_check.py --raw-out FILE` runs, kept in "
        "docs/results/step_model_sweeps/; each "
        "case's step: the least of "
        "its sweeps' medians; the load average above is the fit's, not the sweeps'). "
        f"Fitted by least squares on {d['fit']['cases']} runs "
        f"({', '.join(d['fit_set'])} blocking, then {', '.join(d['overlap_fit'])} for each "
        "link's overlap_efficiency; ranks in blocks, every link); alpha measured "
        f"per link (half a tiny all-gather): {alphas}. Check: {s['within_goal']} of "
        f"{s['cases']} cases within {d['goal']:.0%}, median error "
        f"{s['median_abs_error']:.1%}, largest {s['max_abs_error']:.1%}; "
        f"{s['did_not_run']} cases did not run."
    )
    return "\n\n".join([caption, table(["constant", "fitted"], rows)])


def step_model_check(res: Result) -> str:
    """Every case: measured and predicted step time, the error, fitted or not."""
    header = ["config", "placement", "Mbit/s", "measured ms", "predicted ms", "error", "fitted"]
    header += ["link MB measured", "predicted"]
    rows = []
    for r in res.data["rows"]:
        cells = [r["config"], r["placement"], _rate(r["rate_mbit"])]
        if isinstance(r.get("error"), str):
            rows.append([*cells, "did not run", "", "", "", "", ""])
            continue
        cells += [f"{r['measured_s'] * 1e3:.1f}", f"{r['predicted_s'] * 1e3:.1f}"]
        miss = "" if r["within_goal"] else " (miss)"
        link = [f"{r[k] / 1e6:.3f}" for k in ("link_bytes_measured", "link_bytes_predicted")]
        rows.append([*cells, f"{r['error']:+.0%}{miss}", "yes" if r["fitted"] else "", *link])
    return "\n\n".join([table(header, rows), misses(res)])


def misses(res: Result) -> str:
    """Which configurations miss the goal, and how far the repeats of a case spread."""
    ran = [r for r in res.data["rows"] if not isinstance(r.get("error"), str)]
    by: dict[str, list[bool]] = {}
    for r in ran:
        by.setdefault(r["config"], []).append(r["within_goal"])
    counts = ", ".join(f"{k} {v.count(False)} of {len(v)}" for k, v in by.items() if not all(v))
    spreads = sorted(
        max(r["repeats_s"]) / min(r["repeats_s"]) - 1 for r in ran if len(r["repeats_s"]) > 1
    )
    spread = (
        f" The repeats of one case differ by {spreads[len(spreads) // 2]:.0%} at the median "
        f"case and by up to {spreads[-1]:.0%}."
        if spreads
        else ""
    )
    goal = f"Misses (error beyond {res.data['goal']:.0%})"
    return f"{goal}, per configuration: {counts}.{spread}" if counts else f"{goal}: none.{spread}"


BEYOND_LINK = ("s0", "s3", "s3_hier", "s3_zeropp")  # blocking: every collective second counts


def step_model_beyond_link(res: Result) -> str:
    """Per blocking configuration and link: the ledger's collective seconds beyond what
    the link bytes take at the link's measured rate, then the link bytes' seconds."""
    ran = [r for r in res.data["rows"] if "ledger_comm_s" in r]
    rates = list(dict.fromkeys(r["rate_mbit"] for r in ran))
    rows = []
    for config in BEYOND_LINK:
        for placement in ("block", "cyclic"):
            by = {
                r["rate_mbit"]: r
                for r in ran
                if (r["config"], r["placement"]) == (config, placement)
            }
            cells = [_beyond(by[x]) if x in by else "-" for x in rates]
            rows.append([config, placement, *cells])
    header = ["config", "placement", *(_rate(x) + ("" if x is None else " Mbit/s") for x in rates)]
    return table(header, rows)


def _beyond(r: dict) -> str:
    return f"{(r['ledger_comm_s'] - r['link_s']) * 1e3:.1f} ({r['link_s'] * 1e3:.1f})"


def step_model_clusters(res: Result) -> str:
    """Per model, stage, ZeRO++ and collectives: the overlapped step time and the
    communication over compute, per cluster."""
    d = res.data
    heads = [f"{c['nodes']}x8, {c['gbps']} Gb/s" for c in d["rows"][0]["cells"]]
    rows = []
    for r in d["rows"]:
        zpp = "-" if not r["zeropp"] else ("qwZ+hpZ+qgZ" if r["stage"] == 3 else "qgZ")
        cells = [
            f"{c['step_s']:.2f} s / {(c['hidden_s'] + c['exposed_s']) / c['compute_s']:.2f}"
            for c in r["cells"]
        ]
        rows.append([r["model"], str(r["stage"]), zpp, r["collectives"], *cells])
    caption = (
        f"{measured_by(res)} Arithmetic, no run. Each cell: the overlapped step time, "
        "then the step's communication seconds over its compute seconds (above 1 no "
        "overlap can hide it)."
    )
    return "\n\n".join([caption, table(["model", "stage", "ZeRO++", "collectives", *heads], rows)])


def step_model_break_even(res: Result) -> str:
    """The fewest tokens per GPU at which overlapped stage 3 is within 5 % of stage 2."""
    even = res.data["break_even"]
    keys = list(dict.fromkeys((r["model"], r["gbps"], r["collectives"]) for r in even))
    nodes = sorted({r["nodes"] for r in even})
    rows = []
    for model, gbps, coll in keys:
        by = {
            r["nodes"]: r
            for r in even
            if (r["model"], r["gbps"], r["collectives"]) == (model, gbps, coll)
        }
        rows.append([model, f"{gbps} Gb/s", coll, *(f"{by[n]['tokens_per_gpu']:,}" for n in nodes)])
    return table(["model", "link", "collectives", *(f"{n} nodes" for n in nodes)], rows)


def step_model_volume(res: Result) -> str:
    """Stage 3's cross-node bytes per step per column of ZeRO++'s table, in units of M,
    the model's beside the published."""
    rows = []
    for r in res.data["volume"]:
        cells = [f"{m:.2f} ({p:g})" for m, p in zip(r["model_m"], r["published_m"], strict=True)]
        rows.append([r["model"], r["config"], str(r["qgz_bits"] or "-"), *cells])
    header = ["model", "config", "qgZ bits", "forward gather", "backward gather"]
    header += ["gradients", "total"]
    return table(header, rows)


def _spans(runs: list[list[float]]) -> str:
    """Efficiency spans as text: '0.10-0.33, 0.62-1.00', or 'none'."""
    return ", ".join(f"{a:.2f}-{b:.2f}" if a != b else f"{a:.2f}" for a, b in runs) or "none"


def step_model_zeropp_paper(res: Result) -> str:
    """ZeRO++'s throughput over ZeRO-3's: the model's at three overlap efficiencies and
    two costs of (de)quantization, beside the ratio the ZeRO++ posts report."""
    d, s = res.data, res.data["settings"]
    effs = list(d["rows"][0]["model"])
    rows = []
    for r in d["rows"]:
        cells = [f"{r['model'][e]:.2f}x" for e in effs]
        low, high = r["reported_range"]
        reported = f"{low:.2f}-{high:.2f}x: {r['reported']}"
        rows.append([r["quantization"], r["link"], f"{r['tokens_per_gpu']:,}"])
        rows[-1] += [f"{r['zero3_comm_over_compute']:.2f}", *cells, reported]
        rows[-1].append(_spans(r["efficiencies_within"]))
    header = ["(de)quantization", "link per node", "tokens per GPU", "ZeRO-3 comm / compute"]
    header += [f"model, efficiency {float(e):g}" for e in effs]
    header += ["reported", "efficiencies in the range"]
    caption = (
        f"{measured_by(res)} Arithmetic, no run: the {d['params'] / 1e9:.1f}e9-parameter "
        f"GPT ({s['layers']} layers, hidden {s['hidden']}) at stage 3 on {s['nodes']} nodes "
        f"of {s['gpus_per_node']} V100s at {s['hardware_flops_utilization']:.0%} of peak, "
        f"{s['collectives']} collectives, overlapped; ZeRO++ is qwZ + hpZ (the node) + qgZ "
        f"at {s['qgz_bits']} bits. Each model cell: its ZeRO-3 step over its ZeRO++ step. "
        "ZeRO-3 comm / compute: its collectives' seconds over its compute's (the cluster "
        "tables' second number)."
    )
    return "\n\n".join([caption, table(header, rows)])


def step_model_zeropp_sensitivity(res: Result) -> str:
    """Per utilization and (de)quantization, the efficiencies that give Fig. 6's and
    Fig. 7's 1k-token ratios, and both."""
    rows = [
        [f"{x['utilization']:.0%}", x["quantization"]]
        + [_spans(x["spans"][g]) for g in ("400", "100")]
        + [_spans(x["both"])]
        for x in res.data["sensitivity"]
    ]
    header = ["utilization", "(de)quantization", "400 Gb/s (Fig. 6)", "100 Gb/s (Fig. 7)"]
    return table([*header, "both"], rows)


RENDERERS = {
    "step_model_zeropp_sensitivity": step_model_zeropp_sensitivity,
    "step_model_beyond_link": step_model_beyond_link,
    "step_model_zeropp_paper": step_model_zeropp_paper,
    "step_model_volume": step_model_volume,
    "step_model_fit": step_model_fit,
    "step_model_check": step_model_check,
    "step_model_clusters": step_model_clusters,
    "step_model_break_even": step_model_break_even,
}
