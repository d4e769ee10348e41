"""What scripts/docs/doc_tables.py writes between each pair of markers, one function per name:
the formatting they share, and the renderers of docs/benchmarks.md, determinism.md,
checkpoints.md and reliability.md (doc_tables_memory.py has memory, precision, offload).

Each renderer takes the recorded results its marker names (docs/results/NAME.json,
in the marker's order) and returns Markdown: a block (the caption naming the
command, date and commit, then the table, then what the numbers say) or, for a
marker inside a sentence, a few words.
"""

from __future__ import annotations

from dataclasses import dataclass

MB, MIB = 1e6, 2**20


@dataclass(frozen=True)
class Result:
    name: str  # docs/results/<name>.json
    data: dict
    link: str  # that file, relative to the doc that cites it


# ---- formatting


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def span(values, fmt: str = "{:.2f}", sep: str = "-") -> str:
    """'lo-hi' of the formatted values, or one value when they format alike."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def sci(x: float, digits: int = 1) -> str:
    """5.0e9, not 5.0e+09."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def measured_by(*results: Result) -> str:
    """The caption: which command wrote each result, when, at which commit, under what load."""
    lines = []
    for r in results:
        rec = r.data["recorded"]
        commit = rec["commit"] + (" plus uncommitted changes" if rec["uncommitted_changes"] else "")
        load = r.data.get("load_average")
        load_text = f", load average {load:.1f} at the end" if load is not None else ""
        lines.append(
            f"`{rec['command']}`: {rec['date']}, commit {commit}{load_text}, "
            f"{duration(rec['wall_s'])} in all ([{r.name}.json]({r.link}))"
        )
    return "*Measured by* " + ";<br>\n".join(lines) + "."


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ---- docs/benchmarks.md


def adam(res: Result) -> str:
    d = res.data
    rows = []
    for s in d["sizes"]:
        frac = f"{s['kernel_fraction_of_roofline']:.2f}"
        rows.append(
            [
                sci(s["numel"], 0),
                sci(s["kernel_params_per_s"]),
                sci(s["reference_params_per_s"]),
                f"**{frac}**" if s["numel"] == 50_000_000 else frac,
            ]
        )
    header = ["params", "Numba kernel, params/s", "NumPy twin, params/s"]
    at = {s["numel"]: s for s in d["sizes"]}[50_000_000]
    target = d["fraction_of_roofline_at_5e7"]
    slower = at["kernel_params_per_s"] / at["reference_params_per_s"]
    return "\n\n".join(
        [
            measured_by(res),
            table([*header, "kernel fraction of roofline"], rows),
            f"Roofline: {d['stream_bytes_per_s'] / 1e9:.0f} GB/s ({d['threads']} threads). "
            f"Target: >= 0.9 at 5e7: {'met' if target >= 0.9 else 'not met'} "
            f"({target:.2f}). At 5e7 the NumPy twin runs {slower:.0f}x slower than the kernel.",
        ]
    )


def comm(res: Result) -> str:
    d = res.data
    rows = [
        ["raw", "the same calls straight to mpi4py on preallocated buffers"],
        ["wrapper", "the same calls through `zero_ref.comm.collectives.Comm` (checks, ledger)"],
        [
            "synced (`overhead_ratio`)",
            "the engine's collectives in `train_step`, ranks entering together",
        ],
        ["engine ledger", "the engine's collectives as its ledger records them"],
    ]
    ratios = [
        f"1.00 ({1e3 * d['raw_s']:.1f} ms)",
        f"{d['wrapper_ratio']:.2f}",
        f"**{d['overhead_ratio']:.2f}**",
        f"{d['ledger_ratio_with_arrival_wait']:.2f}",
    ]
    wait = d["synced_barrier_wait_s"] / d["raw_s"]
    met = "met" if d["overhead_ratio"] <= 1.1 else "not met"
    return "\n\n".join(
        [
            f"Stage {d['stage']}, a ReplayModel of {d['params']:,} parameters in {d['units']} "
            f"units, one bucket, {d['world']} ranks, medians over {d['steps']} steps. "
            + measured_by(res),
            table(
                ["series", "what is timed", "ratio to raw"],
                [r + [x] for r, x in zip(rows, ratios, strict=True)],
            ),
            f"Target: `overhead_ratio` <= 1.1: {met}. The ranks' arrival wait "
            f"(the Barriers of the synced series) was {wait:.2f}x the raw transfer time.",
        ]
    )


def buckets(small: Result, large: Result) -> str:
    from zero_ref.config import DEFAULT_BUCKET_NUMEL

    a, b = small.data, large.data
    both = list(zip(a["rows"], b["rows"], strict=True))

    def pair(key: str) -> list[str]:
        return [f"{x[key]:,}" if x[key] == y[key] else f"{x[key]:,} / {y[key]:,}" for x, y in both]

    staging, calls = pair("staging_bytes"), pair("reduce_scatter_calls_per_step")
    rows = []
    for (x, y), st, ca in zip(both, staging, calls, strict=True):
        name = f"{x['bucket_numel']:,}"
        if x["bucket_numel"] == DEFAULT_BUCKET_NUMEL:
            name = f"**{name} (the default)**"
        rows.append([name, st, ca, f"{1e3 * x['step_s']:.1f}", f"{1e3 * y['step_s']:.1f}"])
    header = [
        "`--bucket-numel`",
        "staging bytes per rank",
        "reduce-scatters per step",
        f"step ms, default GPT ({a['padded_numel']:,} params)",
        f"step ms, `--d-model {b['d_model']}` ({b['padded_numel']:,})",
    ]
    return "\n\n".join([measured_by(small, large), table(header, rows), bucket_gain(small, large)])


def bucket_gain(small: Result, large: Result) -> str:
    """What the largest bucket saves per step against the default, on both models."""
    from zero_ref.config import DEFAULT_BUCKET_NUMEL

    parts, calls = [], []
    for res in (small, large):
        rows = res.data["rows"]
        default = next(r for r in rows if r["bucket_numel"] == DEFAULT_BUCKET_NUMEL)
        biggest = rows[-1]
        gain = 1 - biggest["step_s"] / default["step_s"]
        calls.append(str(biggest["reduce_scatter_calls_per_step"]))
        parts.append(
            f"{pct(abs(gain))} {'less' if gain >= 0 else 'more'} time per step than the default "
            f"at {res.data['padded_numel']:,} parameters ({1e3 * biggest['step_s']:.1f} against "
            f"{1e3 * default['step_s']:.1f} ms)"
        )
    size = small.data["rows"][-1]["bucket_numel"]
    return (
        f"A bucket of {size:,} elements ({' and '.join(calls)} reduce-scatters per step) takes "
        + " and ".join(parts)
        + "."
    )


def layout(res: Result) -> str:
    d = res.data
    rows = [
        [f"{s['numel']:,}", f"{s['allgather_ratio']:.2f}", f"{s['reduce_scatter_ratio']:.2f}"]
        for s in d["sizes"]
    ]
    header = ["numel", "Allgatherv / Allgather", "Reduce_scatter / Reduce_scatter_block"]
    return "\n\n".join(
        [
            f"{d['world']} ranks, {' '.join(d['mpi_library'].split())}, the slowest rank's "
            "median over "
            f"{d['repeats']} repeats; a ratio above 1 means the padded, equal-shard call was "
            "faster. " + measured_by(res),
            table(header, rows),
        ]
    )


def determinism(res: Result) -> str:
    d = res.data
    rows = [
        [
            str(s["stage"]),
            f"{1e3 * s['fast_s']:.1f}",
            f"{1e3 * s['deterministic_s']:.1f}",
            f"{s['ratio']:.2f}",
            f"{1e3 * s['fast_comm_s']:.1f}",
            f"{1e3 * s['deterministic_comm_s']:.1f}",
            f"{1e3 * s['norm_fast_s']:.2f}",
            f"{1e3 * s['norm_exact_s']:.1f}",
        ]
        for s in d["stages"]
    ]
    header = ["stage", "fast ms/step", "deterministic ms/step", "ratio", "comm fast ms"]
    header += ["comm det. ms", "norm fast ms", "norm exact ms"]
    return "\n\n".join(
        [
            f"A ReplayModel of {d['params']:,} parameters, {d['world']} ranks, median "
            f"`train_step` time over {d['steps']} steps, fast and deterministic alternating. "
            + measured_by(res),
            table(header, rows),
        ]
    )


def determinism_cost(res: Result) -> str:
    """'1.00-1.04x at stages 1-3, 1.13x at stage 0'"""
    by = {s["stage"]: s["ratio"] for s in res.data["stages"]}
    upper = [by[s] for s in (1, 2, 3)]
    return f"{span(upper, '{:.2f}x')} at stages 1-3, {by[0]:.2f}x at stage 0"


def determinism_percent(res: Result) -> str:
    """'-1-4 %' more time per step at stages 1-3"""
    upper = [s["ratio"] - 1 for s in res.data["stages"] if s["stage"] > 0]
    return span([100 * x for x in upper], "{:.0f}", " to ") + " %"


def train(res: Result) -> str:
    d = res.data
    stages = sorted(d["median_step_s"], key=int)
    rows = [
        [
            s,
            f"{1e3 * d['median_step_s'][s]:.1f} ms",
            f"{d['tokens_per_s'][s]:,.0f}",
            f"{d['sent_bytes_per_step'][s]:,}",
        ]
        for s in stages
    ]
    header = ["stage", "median step", "tokens/s", "bytes sent per rank per step"]
    sent = d["sent_bytes_per_step"]
    numel = d["numel_padded"][stages[0]]
    extra = "".join(f"; {flag}" for flag in d["extra_flags"])
    return "\n\n".join(
        [
            f"The default GPT ({numel:,} parameters{extra}), {d['world_size']} ranks, "
            f"{d['steps']} steps a run, the median step time after {d['warmup']} warm-up "
            f"steps, the four stages interleaved over {d['rounds']} rounds. " + measured_by(res),
            table(header, rows),
            f"Stage 3 / stage 0 step time: **{d['stage3_over_stage0_step_time']:.2f}**. "
            f"Stage 3 sends {sent['3'] / sent['2']:.2f}x the bytes of stage 2.",
        ]
    )


def train_stage2(res: Result) -> str:
    return f"{1e3 * res.data['median_step_s']['2']:.1f} ms a step"


def model(res: Result) -> str:
    d = res.data
    rows = []
    for m in d["models"]:
        for policy, t in (("glibc", m), ("heap kept", m["heap_kept"])):
            rows.append(
                [
                    m["name"],
                    policy,
                    f"{m['matmul_flops'] / 1e9:.3g}",
                    f"{t['fwd_bwd_ms']:.4g}",
                    f"{t['fraction_of_gemm']:.3f}",
                    f"{t['fwd_bwd_cpu_ms']:.4g}",
                    f"{t['fraction_of_gemm_cpu']:.3f}",
                    f"{t['page_faults_per_step']:,.0f}",
                ]
            )
    header = ["model", "policy", "matmul GFLOP", "wall ms", "fraction of GEMM", "CPU ms"]
    header += ["fraction of GEMM by CPU", "page faults / step"]
    steps = ", ".join(f"{m['timed_steps']} ({m['name']})" for m in d["models"])
    size, rate = max(
        ((n, r["wall"]) for run in d["gemm_runs_gflops"] for n, r in run.items()),
        key=lambda x: x[1],
    )
    return "\n\n".join(
        [
            f"NumPy {d['numpy']} on {d['blas']} {d['blas_version']}, {d['rounds']} rounds of fresh "
            f"processes per policy, medians over {steps} timed steps. " + measured_by(res),
            table(header, rows),
            f"GEMM: {rate:.1f} GFLOP/s ({size}^3). " + model_targets(d),
        ]
    )


def model_targets(d: dict) -> str:
    default, big = d["models"]
    t = d["targets"]
    first = (
        "Targets: the default model's forward + backward <= "
        f"{t['default_fwd_bwd_ms_max']} ms: "
        + ("**met**" if t["default_met"] else "**not met here**")
        + f" ({default['fwd_bwd_ms']:.1f} ms, "
        f"{default['heap_kept']['fwd_bwd_ms']:.1f} with the heap kept)"
    )
    second = (
        f"the 10M model at >= {t['10M_fraction_of_gemm_min']} of the GEMM rate: "
        + ("**met**" if t["10M_met"] else "**not met**")
        + f", {big['fraction_of_gemm']:.2f} with glibc's allocator and "
        f"{big['heap_kept']['fraction_of_gemm']:.2f} with the heap kept."
    )
    return f"{first}; {second}"


def checkpoint(res: Result) -> str:
    r = res.data
    gb = 1e9
    ck, rank = r["checkpoint_bytes"], r["rank_file_bytes"]
    at = f"{r['ranks']} ranks, stage {r['stage']}"
    params = r["consolidate_bytes"]
    rows = [  # (what, bytes, seconds, GB/s)
        ("disk: write one rank file's size, fsync", rank, None, r["disk_write_gbps"]),
        ("disk: read it back, cold", rank, None, r["disk_read_gbps"]),
        (f"save ({at}, fsync, manifest, rename)", ck, r["save_s"], r["save_gbps"]),
        (f"load ({at}): CRC-32 of every file, then the engine built from it",
         ck, r["load_s"], r["load_gbps"]),
        ("of it, the CRC-32 checks", ck, r["verify_s"], ck / r["verify_s"] / gb),
        (f"load resharded ({r['reshard_ranks']} ranks, stage {r['reshard_stage']})", ck,
         r["reshard_load_s"], r["reshard_load_gbps"]),
        ("consolidate: the parameters, streamed", params, r["consolidate_s"],
         r["consolidate_gbps"]),
        ("consolidate: the whole command, checks included", params,
         r["consolidate_wall_s"], params / r["consolidate_wall_s"] / gb),
    ]  # fmt: skip
    rows = [(w, n, n / rate / gb if s is None else s, rate) for w, n, s, rate in rows]
    cells = [[what, f"{n / MB:,.0f}", f"{s:.2f}", f"{rate:.2f}"] for what, n, s, rate in rows]
    peak = r["consolidate_peak_above_baseline_bytes"] / MIB
    bound = f"{r['largest_tensor_bytes'] / MIB:.0f} + {r['window_bytes'] / MIB:.0f} MiB"
    equal = "equals" if r["consolidated_equals_export"] else "DIFFERS FROM"
    return "\n\n".join(
        [
            f"GPT d_model {r['d_model']}, {r['n_layer']} layers, context {r['context']}: "
            f"{r['params']:,} parameters, {ck / MB:,.0f} MB of checkpoint. " + measured_by(res),
            table(["", "MB", "s", "GB/s"], cells),
            f"Saving ran at {r['save_gbps'] / r['disk_write_gbps']:.2f} of the disk's write "
            f"speed. Consolidation's peak memory was {peak:.1f} MiB above its interpreter's "
            f"baseline ({'under' if r['peak_below_target'] else 'OVER'} its bound of the largest "
            f"tensor plus one read window, {bound}), and its file {equal} the run's `--export` "
            "bit for bit.",
        ]
    )


# ---- docs/reliability.md


def reliability_table(rows: list[dict]) -> str:
    """One row per fault case of tests/test_failures.py (scripts/bench/reliability_table.py)."""

    def exit_code(row: dict) -> str:
        return "-9 (writer)" if row["exit_code"] is None else str(row["exit_code"])

    def time_to_exit(row: dict) -> str:
        if row.get("timing") == "whole job":
            return f"{row['seconds']:.1f} s (whole job)"
        return f"{row['seconds']:.2f} s after the fault"

    cells = []
    for r in rows:
        fault = f"`{r['fault']}`" if ":rank=" in r["fault"] else r["fault"]
        cells.append(
            [r["case"], fault, r["ended"], str(r.get("ranks", 4)), exit_code(r), time_to_exit(r)]
        )
    header = ["case", "fault injected", "how it ended", "ranks", "exit code", "time to exit"]
    return table(header, cells)


def reliability(res: Result) -> str:
    return "\n\n".join([measured_by(res), reliability_table(res.data["rows"])])


RENDERERS = {
    f.__name__: f
    for f in (
        adam, comm, buckets, layout, determinism, determinism_cost, determinism_percent, train,
        train_stage2, model, checkpoint, reliability,
    )
}  # fmt: skip
