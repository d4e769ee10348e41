"""What scripts/docs/doc_tables.py writes inside sentences of README.md and docs/memory.md:
how long the first command takes (scripts/bench/time_default_run.py), how fp16's and bf16's
step times compare with fp32's (scripts/bench/bench_precision.py), and the memory the estimate
calls overhead and what the resident set does after training (scripts/bench/bench_memory.py),
each a few words rendered from its record."""

from __future__ import annotations

from scripts.docs.doc_tables_render import MIB, Result, duration, span


def _timed(res: Result) -> str:
    cold, warm = res.data["cold"], res.data["warm"]
    return (
        f"{duration(cold['wall_s'])} with an empty Numba cache and {duration(warm['wall_s'])} "
        f"with it warm at load averages {cold['load_after']:.1f} and {warm['load_after']:.1f} "
        f"({res.data['recorded']['date']}, [{res.name}.json]({res.link}))"
    )


def default_run(*results: Result) -> str:
    """'800 steps took 49 s here with an empty Numba cache ... and 25 s with it warm ...'
    from each record, the first the quietest."""
    first, *busier = results
    said = (
        f"800 steps took {_timed(first)} on {first.data['cpu_count']} cores, timed by "
        f"`{first.data['recorded']['command']}` (an empty cache: it compiles and caches every "
        "kernel)"
    )
    return said + "".join(f"; on a busier machine, {_timed(r)}" for r in busier)


def precision_ratios(res: Result) -> str:
    """'fp16 1.06-1.10 and bf16 0.98-1.06 at stages 0-3 (the medians ...: ...)'"""
    speed = [r for r in res.data["speed"] if r["precision"] != "fp32"]
    stages = sorted({r["stage"] for r in speed})

    def ratios(p: str, key: str) -> str:
        return span([r[key] for r in speed if r["precision"] == p])

    return (
        f"fp16 {ratios('fp16', 'time_ratio_least')} and bf16 {ratios('bf16', 'time_ratio_least')} "
        f"at stages {stages[0]}-{stages[-1]} (the medians of the rounds' own ratios: fp16 "
        f"{ratios('fp16', 'time_ratio')}, bf16 {ratios('bf16', 'time_ratio')})"
    )


def _rows(*results: Result) -> list[dict]:
    return [r for res in results for rows in res.data["sizes"].values() for r in rows]


def memory_overhead(*results: Result) -> str:
    """'3.0-4.6 MiB': real peak - ledger - the estimate's activations, per rank."""
    rows = _rows(*results)
    left = [(r["untracked"] - r["estimate_activations"]) * r["numel_padded"] for r in rows]
    return f"{span([b / MIB for b in left], '{:.1f}')} MiB"


def memory_finish(plain: Result, ckpt: Result) -> str:
    """What the finish phase's resident set is against training's, without and with
    activation checkpointing, in bytes per parameter."""
    drop = [r["real"]["train"] - r["real"]["finish"] for r in _rows(plain)]
    kept = [r["real"]["finish"] - r["real"]["train"] for r in _rows(ckpt)]
    return (
        f"without checkpointing the finish phase's peak is {span(drop)} bytes per parameter "
        f"below training's, and with it within {max(abs(k) for k in kept):.3f} of it"
    )


RENDERERS = {f.__name__: f for f in (default_run, precision_ratios, memory_overhead, memory_finish)}
