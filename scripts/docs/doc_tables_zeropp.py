"""The renderers of docs/zeropp.md's measured tables (scripts/docs/doc_tables.py calls them):
qwZ's padding and its quantization error per block, from scripts/bench/quantize_error.py's
recorded results, qgZ's error per gradient block, from scripts/bench/qgz_error.py's, and the
two-host measurements of scripts/bench/bench_zeropp.py (its tables are zeropp_report.py's)."""

from __future__ import annotations

from scripts.bench.zeropp_report import (
    PLAIN,
    both_ways,
    bytes_table,
    checks_text,
    loss_table,
    times_table,
)
from scripts.docs.doc_tables_render import Result, measured_by, table

# docs/zeropp.md's "which to choose": each option's model states per rank (K = 12, 16-bit
# parameters and gradients, N = 4, G = 2: the two-host run's) beside its measured link bytes
CHOICES = (
    (PLAIN, "stage 3", "(2 + 2 + K) Psi / N = 4 Psi", "-"),
    ("+hpZ", "hpZ, groups of a host", "+ 2 Psi / G (the secondary copy) = 5 Psi",
     "stage 3's (with qwZ backward reads the dequantized weights)"),
    ("hybrid (2)", "hybrid, groups of a host", "(2 + 2 + K) Psi / G = 8 Psi",
     "another order of the sums"),
    ("+qwZ", "qwZ", "stage 3's, plus the alignment's padding", "forward reads int8"),
    ("+qgZ int4 2-hop", "qgZ int4, two hops", "stage 3's, plus the wire buffers",
     "gradients in int4"),
    ("all three (2-hop int4 qgZ)", "all three (int4 qgZ, two hops)", "hpZ's",
     "the three together"),
)  # fmt: skip


def qwz_padding(large: Result, small: Result) -> str:
    """The layout's elements aligned to W x block against the plain one, two blocks."""
    a, b = large.data, small.data
    rows = [
        [
            str(p["world"]),
            f"{p['plain_padded']:,}",
            f"{p['aligned_padded']:,}",
            f"+{100 * p['extra_fraction']:.1f} %",
            f"{q['aligned_padded']:,}",
            f"+{100 * q['extra_fraction']:.1f} %",
        ]
        for p, q in zip(a["padding"], b["padding"], strict=True)
    ]
    header = [
        "ranks",
        "padded elements, plain",
        f"aligned to N x {a['block']}",
        "extra",
        f"aligned to N x {b['block']}",
        "extra",
    ]
    return f"{measured_by(large, small)}\n\n{table(header, rows)}"


def qwz_error(*results: Result) -> str:
    """max |x - x'| / amax per block, its mean, and the RMS error, per recorded run."""
    rows = [
        [
            "initial (seed 0)" if r.data["source"].startswith("initial") else "trained",
            f"{r.data['blocks']} of {r.data['block']}",
            f"{r.data['max_rel_error']:.7f}",
            f"{r.data['mean_rel_error']:.7f}",
            f"{r.data['mean_rms_rel_error']:.5f}",
        ]
        for r in results
    ]
    header = ["parameters", "blocks", "max err / amax", "mean per-block max", "mean RMS / amax"]
    bound = results[0].data["bound"]
    return (
        f"{measured_by(*results)}\n\n{table(header, rows)}\n\n"
        f"The bound is half an int8 step of amax, 0.5 / 127 = {bound:.7f}, where the "
        "block's scale is a normal float32 (below that: [What qwZ does](#what-qwz-does))."
    )


def qgz_error(*results: Result) -> str:
    """qgZ: max |g - g'| / amax per gradient block, its mean, the RMS error, and the
    summed gradient's relative L2 error, in int8 and (where recorded) int4, per recorded
    run of scripts/bench/qgz_error.py."""
    rows = []
    for r in results:
        when = f"after {r.data['steps']} steps" if r.data["steps"] else "initial parameters"
        if r.data.get("trained_bits") == 4:
            when += " in int4"
        for bits, f in ((8, r.data), (4, r.data.get("int4"))):
            if f is None:
                continue
            rows.append(
                [
                    when,
                    f"int{bits}",
                    f"{f['blocks']:,} of <= {r.data['block']}",
                    f"{f['max_rel_error']:.7f}",
                    f"{f['mean_rel_error']:.7f}",
                    f"{f['mean_rms_rel_error']:.5f}",
                    f"{100 * f['summed_grad_rel_l2_error']:.2f} %",
                ]
            )
    header = [
        f"gradients ({results[0].data['world']} ranks)",
        "sent as",
        "blocks",
        "max err / amax",
        "mean per-block max",
        "mean RMS / amax",
        "summed gradient, relative L2 error",
    ]
    return f"{measured_by(*results)}\n\n{table(header, rows)}"


# ---- docs/zeropp.md's "Measured on two hosts" (scripts/bench/bench_zeropp.py, zeropp_report.py)


def _targets(res: Result, start: str) -> str:
    return checks_text([c for c in res.data["targets"] if start in c["target"]])


def zeropp_bytes(res: Result) -> str:
    """Per configuration: the ledger by kind beside the paper's bytes and our link
    formula, the link's bytes measured each way, and the bytes target."""
    return "\n\n".join(
        [measured_by(res), bytes_table(res.data["link_rows"]), _targets(res, "link bytes <=")]
    )


def zeropp_times(res: Result) -> str:
    """Step time per configuration and link, and the step-time targets."""
    return "\n\n".join(
        [
            measured_by(res),
            times_table(res.data["link_rows"], res.data["links"]),
            _targets(res, "step time <="),
        ]
    )


def zeropp_loss(res: Result) -> str:
    """Final loss per configuration over the seeds, and the loss targets."""
    s = res.data["settings"]
    seeds = ", ".join(str(x) for x in s["seeds"])
    return "\n\n".join(
        [
            f"{s['steps_loss']} steps, seeds {seeds}, {s['ranks']} ranks on one host. "
            + measured_by(res),
            loss_table(res.data["loss_rows"]),
            checks_text(res.data["targets"]),
        ]
    )


def zeropp_choice(res: Result) -> str:
    """Which option to choose: memory by formula (CHOICES) beside the two-host run's link
    bytes against plain stage 3's, both directions, on the unlimited link."""
    rows = {r["config"]: r for r in res.data["link_rows"] if not r.get("skipped")}
    base = both_ways(rows[PLAIN]["runs"]["unlimited"])
    out = [
        [name, memory, f"{both_ways(rows[config]['runs']['unlimited']) / base:.2f}", values]
        for config, name, memory, values in CHOICES
    ]
    header = ["option", "model states per rank", "link bytes vs stage 3", "values"]
    return f"{measured_by(res)}\n\n{table(header, out)}"


def hybrid_memory(res: Result) -> str:
    """scripts/bench/hybrid_memory.py: per run the real peak, the ledger, untracked and the
    estimate in bytes per parameter, and its targets."""
    d = res.data
    rows = [
        [
            r["config"],
            str(r["ranks"]),
            f"{r['real_peak']:.2f}",
            f"{r['ledger']:.2f}",
            f"{r['untracked']:.2f}",
            f"{r['estimate']:.2f}",
            f"{100 * r['estimate_error']:+.1f} %",
        ]
        for r in d["rows"]
    ]
    header = ["stage 3", "ranks", "real peak", "ledger", "untracked", "estimate", "error"]
    t = d["targets"]
    verdict = lambda ok: "holds" if ok else "fails"  # noqa: E731
    checks = [
        f"- hybrid's ledger / plain {d['group']} ranks' = {t['hybrid_ledger_over_plain_g']:.3f} "
        f"(as at world G, within 1 %: {verdict(t['ledger_as_at_world_g'])})",
        f"- hybrid's untracked - plain {d['group']} ranks' = {t['untracked_gap']:+.3f} bytes per "
        f"parameter (within 0.25: {verdict(t['untracked_within_0p25'])})",
        f"- hybrid's estimate against its real peak: {100 * t['estimate_error']:+.1f} % (within "
        f"15 %: {verdict(t['estimate_within_15pct'])})",
    ]
    caption = (
        f"GPT {d['size']}, bytes per parameter per rank, max over ranks, {d['steps']} steps. "
        + measured_by(res)
    )
    return "\n\n".join([caption, table(header, rows), "\n".join(checks)])


def zeropp_summary(link: Result, loss: Result) -> str:
    """README's lines: the targets of the bench's all three (bytes, step time at each
    comm-bound rate), and each configuration's final loss against stage 3's (signed)."""
    lines = [f"- {c['target']}: {c['value']:.3g}, {'holds' if c['holds'] else 'fails'}"
             for c in link.data["targets"]]  # fmt: skip
    rows = [r for r in loss.data["loss_rows"] if not r.get("skipped")]
    plain = rows[0]["mean"]
    moved = ", ".join(f"{r['config']} {100 * (r['mean'] / plain - 1):+.2f} %" for r in rows[1:])
    held = all(c["holds"] for c in loss.data["targets"])
    lines.append(
        f"- final loss against stage 3's ({loss.data['settings']['steps_loss']} steps, mean over "
        f"seeds; the target: within 2 %, {'holds for every one' if held else 'fails'}): {moved}"
    )
    return measured_by(link, loss) + "\n\n" + "\n".join(lines)


RENDERERS = {
    f.__name__: f
    for f in (
        zeropp_summary,
        zeropp_choice,
        hybrid_memory,
        qwz_padding,
        qwz_error,
        qgz_error,
        zeropp_bytes,
        zeropp_times,
        zeropp_loss,
    )
}
