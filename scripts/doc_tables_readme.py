"""What scripts/doc_tables.py writes inside README's sentences: how long the first
command takes (scripts/time_default_run.py) and how fp16's and bf16's step times compare
with fp32's (scripts/bench_precision.py), each a few words rendered from its record."""

from __future__ import annotations

from doc_tables_render import Result, duration, span


def default_run(res: Result) -> str:
    """'800 steps took 95 s here with an empty Numba cache ... and 41 s with it warm ...'"""
    d, rec = res.data, res.data["recorded"]
    cold, warm = d["cold"], d["warm"]
    return (
        f"800 steps took {duration(cold['wall_s'])} here with an empty Numba cache (it compiles "
        f"and caches every kernel) and {duration(warm['wall_s'])} with that cache warm, on "
        f"{d['cpu_count']} cores at load averages {cold['load_after']:.1f} and "
        f"{warm['load_after']:.1f} (`{rec['command']}`, {rec['date']}, "
        f"[{res.name}.json]({res.link}))"
    )


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


RENDERERS = {f.__name__: f for f in (default_run, precision_ratios)}
