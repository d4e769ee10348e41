"""The renderers of scripts/docs/doc_tables.py for docs/stages.md's overlap section: the
buffers --overlap-comm adds (scripts/bench/overlap_memory.py) and the two-host benchmark
(scripts/bench/bench_overlap.py, its table from overlap_report.py); the shared formatting is
in doc_tables_render.py."""

from __future__ import annotations

from scripts.bench.overlap_report import markdown
from scripts.docs.doc_tables_render import Result, measured_by, span, table

DEEP = "overlap, prefetch 4 widest units"


def overlap_memory(res: Result) -> str:
    """Per stage: the buffers blocking, with --overlap-comm, what that adds (bytes and
    per parameter), and at stage 3 with the deeper prefetch."""
    rows = []
    for r in res.data["rows"]:
        added = r["overlap"] - r["blocking"]
        deep = r.get(DEEP)
        rows.append(
            [
                str(r["stage"]),
                f"{r['blocking']:,} B",
                f"{r['overlap']:,} B",
                f"{added:,} B",
                f"{added / r['params']:.2f} B",
                "-" if deep is None else f"{deep:,} B",
                "-" if deep is None else f"{(deep - r['blocking']) / r['params']:.2f} B",
            ]
        )
    header = [
        "stage",
        "buffers, blocking",
        "with `--overlap-comm`",
        "added",
        "added per parameter",
        "`--prefetch-numel` of 4 widest units",
        "added per parameter",
    ]
    world = res.data["world"]
    return f"{measured_by(res)} {world} ranks.\n\n{table(header, rows)}"


def overlap_bench(*results: Result) -> str:
    """scripts/bench/bench_overlap.py's rows (ms per step, blocking and overlapped), and which
    of issue 23's targets held, per recorded result."""
    parts = [measured_by(*results)]
    for res in results:
        parts.append(markdown(res.data["rows"]))
        checks = [
            f"- {c['target']}: {c['value']:.2f}, {'holds' if c['holds'] else 'fails'}"
            for c in res.data["targets"]
        ]
        if checks:
            parts.append("\n".join(checks))
    return "\n\n".join(parts)


def overlap_probes(res: Result) -> str:
    """The link bytes (the busier direction) and time of one call of each kind, per rank
    placement, at each limited rate (scripts/bench/link_probe.py's probes in the result)."""
    rows = []
    for link in res.data["links"]:
        if link["rate_mbit"] is None:
            continue
        for placement, probe in link["probes"].items():
            cells = [f"{link['rate_mbit']:g} Mbit/s", placement]
            for kind in ("allreduce", "allgather", "reduce_scatter"):
                k = probe["kinds"][kind]
                nbytes = max(k["link_rx_bytes"], k["link_tx_bytes"])
                cells.append(f"{nbytes / 1e6:.3f} MB, {1e3 * k['seconds']:.1f} ms")
            rows.append(cells)
    numel = res.data["links"][0]["probes"]["block"]["numel"]
    header = ["link", "ranks", "all-reduce", "all-gather", "reduce-scatter"]
    return f"{measured_by(res)} One call of {numel:,} float32 values each.\n\n{table(header, rows)}"


def overlap_budget(res: Result) -> str:
    """scripts/bench/overlap_budget.py's rows: an overlapped step shared out into phases (ms),
    beside max(compute, communication), the dependency bound and the 1.15x target."""
    rows = []
    for r in res.data["rows"]:
        p, t = r["phases"], r["kind_link_s"]
        waits = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in p["waits"].items() if v >= 5e-4)
        rows.append(
            [
                str(r["stage"]),
                f"{r['rate_mbit']:g} Mbit/s",
                f"{p['step'] * 1e3:.1f}",
                f"{r['compute_phases']['step'] * 1e3:.1f}",
                f"{r['comm_s'] * 1e3:.1f}",
                f"{t.get('allgather', 0) * 1e3:.0f} / {t.get('reduce_scatter', 0) * 1e3:.0f}",
                f"{r['dependency_bound_s'] * 1e3:.1f}",
                f"{r['target_s'] * 1e3:.1f}",
                f"{p['forward'] * 1e3:.0f} / {p['backward'] * 1e3:.0f} / "
                f"{p['optimizer'] * 1e3:.0f}",
                f"{p['wait'] * 1e3:.0f}" + (f" ({waits})" if waits else ""),
                f"{(p['blocking'] + p['other']) * 1e3:.0f}",
                f"{r['compute_inflation_s'] * 1e3:+.0f}",
                f"{r['bound_over_max']:.2f}",
                f"{r['overlapped_over_max']:.2f}",
            ]
        )
    header = [
        "stage",
        "link",
        "overlapped",
        "compute",
        "comm (bytes)",
        "link: gathers / reductions",
    ]
    header += ["bound", "1.15 x max", "fwd / bwd / opt", "waits", "rest", "compute inflation"]
    header += ["bound / max", "overlapped / max"]
    s = res.data["settings"]
    setup = (
        f"ms per step, the median over ranks of steps {s['skip_first'] + 1}-{s['steps']}, "
        f"`{s['model_flags']}`{' ' + s['extra'] if s['extra'] else ''}, {s['hosts']} hosts x "
        f"{s['ranks'] // s['hosts']} ranks, ranks in blocks."
    )
    return f"{measured_by(res)} {setup}\n\n{table(header, rows)}"


HIER_CASES = {  # hier_check.py's case -> (stage, schedule, placement, collectives)
    "s0_block": ("0", "blocking", "block", "flat (MPICH's all-reduce is node-aware)"),
    "s3_block_flat": ("3", "blocking", "block", "flat"),
    "s3_block_hier": ("3", "blocking", "block", "hierarchical"),
    "s3_block_auto": ("3", "blocking", "block", "auto"),
    "s3o_block_flat": ("3", "overlapped", "block", "flat"),
    "s3o_block_hier": ("3", "overlapped", "block", "hierarchical"),
    "s3_cyclic_flat": ("3", "blocking", "cyclic", "flat"),
}


def hier_check(res: Result) -> str:
    """Flat against two-level collectives on the namespace hosts (scripts/bench/hier_check.py)."""
    d = res.data
    s0 = d["step_s"]["s0_block"]
    rows = [
        [*HIER_CASES[name], f"{d['link_bytes_per_step'][name] / 1e6:.3f}",
         f"{d['step_s'][name] * 1e3:.1f}", f"{d['step_s'][name] / s0:.2f}"]
        for name in HIER_CASES
    ]  # fmt: skip
    one, runs = d["one_host_step_s"], d["one_host_runs_s"]
    caption = (
        f"{measured_by(res)} The default GPT on 2 hosts x 2 ranks at {d['rate_mbit']:g} Mbit/s, "
        f"each figure the median of {d['repeats']} rounds of every case side by side. Stage 3's "
        f"link bytes with the two-level collectives: {d['s3_hier_bytes_over_cyclic']:.3f} x "
        f"cyclic placement's (flat in blocks: {d['s3_flat_bytes_over_cyclic']:.2f} x). "
        f"Stage 3 / stage 0: overlapped {d['overlap_s3_over_s0']['hierarchical']:.2f} "
        f"(flat {d['overlap_s3_over_s0']['flat']:.2f}), blocking "
        f"{d['blocking_s3_over_s0']['hierarchical']:.2f} (flat "
        f"{d['blocking_s3_over_s0']['flat']:.2f}). On one host (4 ranks, stage 3 overlapped), "
        f"`auto` (flat there) {one['auto'] * 1e3:.1f} ms against `flat` {one['flat'] * 1e3:.1f} ms "
        f"a step: {d['one_host_auto_over_flat']:.2f} x, the same code (flat) within the spread "
        f"of its runs ({span([x * 1e3 for x in runs['auto']], '{:.1f}')} ms and "
        f"{span([x * 1e3 for x in runs['flat']], '{:.1f}')} ms)."
    )
    header = ["stage", "schedule", "placement", "collectives", "link MB / step", "step ms",
              "/ stage 0"]  # fmt: skip
    return "\n\n".join([caption, table(header, rows)])


def hier_bytes(res: Result) -> str:
    """One collective's bytes on the link, flat against two-level (scripts/bench/hier_bytes.py)."""
    d = res.data
    rows = [
        [r["placement"], r["collective"].replace("_", "-"), r["collectives"],
         f"{r['rx_per_call'] / 1e6:.3f}", f"{r['rx_over_least']:.2f}",
         f"{r['tx_per_call'] / 1e6:.3f}", f"{r['tx_over_least']:.2f}"]
        for r in d["rows"]
    ]  # fmt: skip
    caption = (
        f"{measured_by(res)} One float32 block of {d['block_bytes'] / 2**20:g} MiB a rank, "
        f"{d['calls']} calls a job between barriers, deterministic mode; MB per call at "
        "the first host's end of the veth (TCP/IP and UCX headers included), and over the "
        "least: that host taking each of the other host's blocks once (all-gather), or one "
        "partial per destination it holds (reduce-scatter), and sending what the other "
        "host needs once."
    )
    header = ["placement", "collective", "collectives", "MB in", "/ least", "MB out",
              "/ least"]  # fmt: skip
    return "\n\n".join([caption, table(header, rows)])


RENDERERS = {
    f.__name__: f
    for f in (overlap_memory, overlap_bench, overlap_probes, overlap_budget, hier_check,
              hier_bytes)
}  # fmt: skip
