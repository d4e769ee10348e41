"""What scripts/docs/doc_tables.py writes in docs/check.md: what watching a torch DDP run
with zero_ref.check costs (scripts/bench/bench_check_torch.py's record)."""

from __future__ import annotations

from scripts.docs.doc_tables_render import Result, measured_by, table


def check_cost(res: Result) -> str:
    """The step time of the three ways, their ratios to unwatched, the records' size."""
    d = res.data

    def ms(key: str) -> str:
        return f"{1e3 * d[key]:.0f} ms"

    rows = [
        ["unwatched", ms("unwatched_step_s"), "1"],
        [
            "watched and checked on rank 0 at every step",
            ms("check_step_s"),
            f"{d['check_over_unwatched']:.2f}x",
        ],
        [
            "watched, records to a folder only",
            ms("folder_step_s"),
            f"{d['folder_over_unwatched']:.2f}x",
        ],
    ]
    return (
        f"{measured_by(res)}\n\n{table(['way', 'step', 'over unwatched'], rows)}\n\n"
        f"{d['world']} ranks, {d['micro_steps']} micro-steps, the median of "
        f"{d['steps_timed']} steps each. The folder held "
        f"{d['folder_bytes_per_step'] / 1e6:.1f} MB per step."
    )


RENDERERS = {"check_cost": check_cost}
