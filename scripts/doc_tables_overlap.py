"""The renderers of scripts/doc_tables.py for docs/stages.md's overlap section: the
buffers --overlap-comm adds (scripts/overlap_memory.py); the shared formatting is in
doc_tables_render.py."""

from __future__ import annotations

from doc_tables_render import Result, measured_by, table

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


RENDERERS = {f.__name__: f for f in (overlap_memory,)}
