"""The renderers of docs/zeropp.md's measured tables (scripts/doc_tables.py calls them):
qwZ's padding and its quantization error per block, from scripts/quantize_error.py's
recorded results, and qgZ's error per gradient block, from scripts/qgz_error.py's."""

from __future__ import annotations

from doc_tables_render import Result, measured_by, table


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
        f"aligned to W x {a['block']}",
        "extra",
        f"aligned to W x {b['block']}",
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
        f"The bound is half an int8 step of amax, 0.5 / 127 = {bound:.7f}."
    )


def qgz_error(*results: Result) -> str:
    """qgZ: max |g - g'| / amax per gradient block, its mean, the RMS error, and the
    summed gradient's relative L2 error, in int8 and (where recorded) int4, per recorded
    run of scripts/qgz_error.py."""
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


RENDERERS = {f.__name__: f for f in (qwz_padding, qwz_error, qgz_error)}
