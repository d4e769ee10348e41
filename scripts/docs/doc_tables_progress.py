"""The renderer of scripts/docs/doc_tables.py for docs/overlap_progress.md: the progress
policies' overlap (scripts/bench/bench_progress.py); the shared formatting is in
doc_tables_render.py.
"""

from __future__ import annotations

from scripts.docs.doc_tables_render import MIB, Result, measured_by, table

MODE_ORDER = ("none", "test", "test-layer", "thread", "thread-sleep", "thread-1ms", "mpich")


def progress(res: Result) -> str:
    """Per setting, collective and size: the collective alone (plain launch, and under
    MPICH's progress thread), the compute alone and the overlapped total with no
    progress, in ms; then each policy's overlap against the plain compute."""
    settings, left_out = {}, []
    for name, setting in res.data["settings"].items():
        if "blas_threads" in setting or setting["hosts"] is None or setting["ranks"] > 2:
            settings[name] = setting
        else:  # 1 rank per host, recorded before the bench pinned BLAS to 1 thread (f8ae4a3)
            left_out.append(name)
    present = {r["mode"] for s in settings.values() for r in s["rows"]}
    modes = [m for m in MODE_ORDER if m in present]
    header = ["setting", "collective", "MiB", "comm", "comm (mpich)", "compute", "total (none)"]
    rows = []
    for name, setting in settings.items():
        by = {(r["kind"], r["size_bytes"], r["mode"]): r for r in setting["rows"]}
        for kind, size in dict.fromkeys((r["kind"], r["size_bytes"]) for r in setting["rows"]):
            none, mpich = by[(kind, size, "none")], by[(kind, size, "mpich")]
            cells = [name, kind, f"{size / MIB:.0f}"]
            cells += [f"{x * 1e3:.1f}" for x in (none["comm_s"], mpich["comm_s"])]
            cells += [f"{x * 1e3:.1f}" for x in (none["compute_s"], none["total_s"])]
            rows.append(cells + [f"{by[(kind, size, m)]['overlap_vs_plain']:.2f}" for m in modes])
    loads = ", ".join(
        f"{name} {min(s['load_average']):.1f}-{max(s['load_average']):.1f}"
        for name, s in settings.items()
    )
    caption = (
        f"{measured_by(res)} Load average while each setting ran: {loads}. "
        "Times in ms (medians of the slowest rank); then the overlap of each policy, "
        "(comm + compute - total) / min(comm, compute), against the plain compute."
    )
    if left_out:
        caption += (
            f" Left out: {', '.join(left_out)}, whose one rank per host ran with 2 BLAS threads "
            "(zero_ref's budget for a rank alone on its host, on cores the other host shares)."
        )
    return "\n\n".join([caption, table(header + modes, rows)])


RENDERERS = {"progress": progress}
