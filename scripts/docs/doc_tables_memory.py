"""The renderers of scripts/docs/doc_tables.py for the memory, precision and offload tables
(README.md, docs/memory.md, docs/precision.md, docs/offload.md); the shared formatting
is in doc_tables_render.py.
"""

from __future__ import annotations

import math

from scripts.docs.doc_tables_render import MB, MIB, Result, measured_by, span, table

# ---- memory: README.md, docs/memory.md


def memory(res: Result) -> str:
    """One table per GPT size in the result, every column bench_memory.py reports."""
    d = res.data
    budget = f"{d['budget_gib']:g} GiB/rank"
    header = ["stage", "real init", "real train", "real finish", "ledger", "untracked"]
    header += ["fp32 formula", "paper (K=12)", "estimate", "error", f"fits {budget} (extrapolated)"]
    ckpt = ", with activation checkpointing" if d["checkpoint_activations"] else ""
    parts = [
        f"{d['ranks']} ranks, context {d['context']}, micro-batch 1, {d['steps']} steps"
        f"{', `--export`' if d['export'] else ''}; bytes per parameter per rank, the largest over "
        "ranks. " + measured_by(res)
    ]
    for size, rows in d["sizes"].items():
        cells = [
            [
                str(r["stage"]),
                *(f"{r['real'][p]:.2f}" for p in ("init", "train", "finish")),
                *(
                    f"{r[k]:.2f}"
                    for k in ("ledger", "untracked", "fp32_formula", "paper", "estimate")
                ),
                f"{100 * r['estimate_error']:+.1f}%",
                f"{r['fits_budget_params'] / 1e9:.2f}B",
            ]
            for r in rows
        ]
        parts += [
            f"GPT {size} ({rows[0]['numel_padded']:,} parameters){ckpt}",
            table(header, cells),
        ]
    return "\n\n".join(parts)


def _stages(res: Result) -> dict[int, dict]:
    (rows,) = res.data["sizes"].values()
    return {r["stage"]: r for r in rows}


def memory_readme(res: Result) -> str:
    d = res.data
    (size,) = d["sizes"]
    by = _stages(res)
    header = [
        "stage",
        "real peak",
        "ledger",
        "untracked",
        "fp32 formula",
        "paper (K=12)",
        "estimate",
    ]
    keys = ("real_peak", "ledger", "untracked", "fp32_formula", "paper", "estimate")
    rows = [[str(s), *(f"{r[k]:.2f}" for k in keys)] for s, r in by.items()]
    numel, s3 = by[0]["numel_padded"], by[3]
    return "\n\n".join(
        [
            f"GPT {size} ({numel:,} parameters), {d['ranks']} ranks, context {d['context']}, "
            f"micro-batch 1, activation checkpointing. " + measured_by(res),
            table(header, rows),
            f"So stage 3 fits {by[0]['real_peak'] / s3['real_peak']:.2f} times the model stage 0 "
            f"fits. Beyond its model states stage 3 holds {s3['ledger'] - s3['fp32_formula']:.2f} "
            f"bytes per parameter of buffers and {s3['untracked']:.2f} that the ledger does not "
            "track.",
        ]
    )


def memory_stage3(res: Result) -> str:
    by = _stages(res)
    s3 = by[3]
    buffers = s3["ledger"] - s3["fp32_formula"]
    rest_mib = s3["untracked"] * s3["numel_padded"] / MIB
    return (
        f"Stage 3 holds {s3['real_peak']:.2f} bytes per parameter per rank (target: at most "
        f"5), and fits {by[0]['real_peak'] / s3['real_peak']:.2f} times the model stage 0 "
        f"fits at this size and cut into units (target: at least 3.5; the ratio's formula is "
        f"below). Of the {s3['real_peak']:.2f}, "
        f"{s3['fp32_formula']:.2f} are the model states, {buffers:.2f} the gathered unit and "
        f"the gradient scratch, and {s3['untracked']:.2f} activations and overhead "
        f"({rest_mib:.0f} MiB per rank)."
    )


def memory_untracked(res: Result) -> str:
    """The untracked bytes of the largest size, per parameter and in MiB per rank."""
    d = res.data
    size = list(d["sizes"])[-1]
    rows = d["sizes"][size]
    per_param = [r["untracked"] for r in rows]
    mib = [r["untracked"] * r["numel_padded"] / MIB for r in rows]
    return (
        f"At {size} it is {span(per_param)} bytes per parameter at every stage, "
        f"{span(mib, '{:.0f}')} MiB per rank"
    )


# ---- precision: README.md, docs/precision.md


def precision_speed(res: Result) -> str:
    d, s = res.data, res.data["settings"]
    least = all("time_ratio_least" in r for r in d["speed"])  # recorded since --repeats had it
    rows = [
        [
            r["precision"],
            str(r["stage"]),
            f"{r['step_time_s']:.3f}",
            f"{r['sent_bytes']:,.0f}",
            *(
                f"{r[k]:.2f}"
                for k in ("ledger_per_param", "formula_per_param", "paper_k12_per_param")
            ),
            f"{r['real_peak_per_param']:.2f}",
            f"{r['comm_ratio']:.3f}",
            f"{r['time_ratio']:.2f}",
            *([f"{r['time_ratio_least']:.2f}"] if least else []),
        ]
        for r in d["speed"]
    ]
    header = ["precision", "stage", "step s", "bytes sent / step", "ledger", "formula"]
    header += ["paper K=12", "real", "sent / fp32", "time / fp32"]
    header += ["least / fp32"] if least else []
    ckpt = " with `--checkpoint-activations`" if s["checkpoint_activations"] else ""
    rounds = s.get("repeats", 1)
    over = (
        f", then the median over {rounds} rounds, in each of which a stage's three precisions "
        "ran back to back (time / fp32: the median of the rounds' own ratios; least / fp32: "
        "the run's least step time over rounds over fp32's least; real: the least over rounds)"
        if rounds > 1
        else ""
    )
    return "\n\n".join(
        [
            f"A GPT of {d['speed'][0]['numel_padded'] / 1e6:.2f}M padded parameters (d_model "
            f"{s['d_model']}, {s['n_layer']} layers, context {s['context']}, global batch "
            f"{s['batch_size']}{ckpt}), {s['ranks']} ranks, {s['steps']} steps, medians over steps "
            f"3-{s['steps']}{over}. " + measured_by(res),
            table(header, rows),
            precision_findings(d["speed"]),
        ]
    )


def precision_findings(speed: list[dict]) -> str:
    by = {(r["precision"], r["stage"]): r for r in speed}
    half = [r for r in speed if r["precision"] != "fp32"]

    def times(p: str, key: str = "time_ratio") -> str:
        return span([r[key] for r in speed if r["precision"] == p])

    drops = ", ".join(
        f"stage {s}: {by['fp32', s]['real_peak_per_param']:.2f} -> "
        f"{span([by[p, s]['real_peak_per_param'] for p in ('fp16', 'bf16')])}"
        for s in (1, 2)
    )
    extra = span(
        [by[p, 0]["ledger_per_param"] - by[p, 0]["formula_per_param"] for p in ("fp16", "bf16")]
    )
    return (
        f"16-bit sent {span([r['comm_ratio'] for r in half], '{:.3f}')} of fp32's bytes. "
        f"Real peak, fp32 -> 16-bit, {drops}. At stage 0 the 16-bit ledger is {extra} B above the "
        f"formula. Step time against fp32: fp16 {times('fp16')}, bf16 {times('bf16')}"
        + (
            f"; least over rounds: fp16 {times('fp16', 'time_ratio_least')}, "
            f"bf16 {times('bf16', 'time_ratio_least')}."
            if all("time_ratio_least" in r for r in speed)
            else "."
        )
    )


def precision_loss(res: Result) -> str:
    d, s = res.data, res.data["settings"]
    rows = [
        [
            r["precision"],
            f"{r['final_loss']:.3f}",
            f"{r['last_mean_loss']:.3f}",
            str(r["skipped_steps"]),
            f"{r['loss_scale']:g}",
            f"{r['median_step_time_s']:.3f}",
        ]
        for r in d["loss"]
    ]
    first = d["loss"][0]
    header = ["precision", "final loss", f"mean of the last {first['last_n']} steps"]
    header += ["skipped steps", "final loss scale", "step s"]
    return "\n\n".join(
        [
            "The default run (`python -m zero_ref.train`: the default GPT, "
            f"{first['steps']} steps, stage {first['stage']}, {s['ranks']} ranks) with "
            "`--precision` added; the corpus's unigram entropy is "
            f"{s['unigram_entropy']:.3f} nats per character. " + measured_by(res),
            table(header, rows),
            fp16_scaling(d["loss"]),
        ]
    )


def fp16_scaling(loss: list[dict]) -> str:
    """How fp16's loss scale moved, from its skipped steps and its final scale."""
    fp16 = next(r for r in loss if r["precision"] == "fp16")
    skipped, scale = fp16["skipped_steps"], fp16["loss_scale"]
    power = round(math.log2(scale))
    said = f"fp16 skipped {skipped} steps and ended at a loss scale of 2^{power}"
    if skipped >= 1 and 16 - power == skipped - 1:
        return (
            f"{said}: 2^16 is too large for this model's gradients; the hysteresis of 2 absorbed "
            f"the first overflow and {skipped - 1} halvings brought the scale to 2^{power}, where "
            f"it stayed ({fp16['steps'] - skipped} clean steps are fewer than the 1000 of a growth "
            "window)."
        )
    return said + "."


def precision_readme(res: Result) -> str:
    by = {(r["precision"], r["stage"]): r for r in res.data["speed"]}
    rows = []
    for stage in sorted({s for _, s in by}):
        f32, half = by["fp32", stage], [by[p, stage] for p in ("fp16", "bf16")]
        rows.append(
            [
                str(stage),
                f"{f32['ledger_per_param']:.2f} / {f32['real_peak_per_param']:.2f}",
                f"{span([h['ledger_per_param'] for h in half])} "
                f"({span([h['paper_k12_per_param'] for h in half])}) / "
                f"{span([h['real_peak_per_param'] for h in half])}",
                span([h["comm_ratio"] for h in half], "{:.3f}"),
            ]
        )
    header = ["stage", "fp32 ledger / real"]
    header += [
        "fp16 and bf16 ledger (model states = paper K=12) / real",
        "bytes sent, 16-bit / fp32",
    ]
    numel = res.data["speed"][0]["numel_padded"]
    return "\n\n".join(
        [
            f"A {numel / 1e6:.2f}M-parameter GPT, {res.data['settings']['ranks']} ranks, bytes per "
            "parameter per rank. " + measured_by(res),
            table(header, rows),
        ]
    )


def precision_losses(res: Result) -> str:
    """'1.566, 1.568, 1.564 (fp32, fp16, bf16) after 800 steps; unigram entropy 3.250'"""
    loss = res.data["loss"]
    values = ", ".join(f"{r['final_loss']:.3f}" for r in loss)
    names = ", ".join(r["precision"] for r in loss)
    entropy = res.data["settings"]["unigram_entropy"]
    return f"{values} ({names}) after {loss[0]['steps']} steps; unigram entropy {entropy:.3f}"


def half_reduce(four: Result, two: Result) -> str:
    names = {
        "fp32_mpi_sum": "fp32 `Reduce_scatter_block`",
        "fp16_mpi_sum": "fp16 `Reduce_scatter_block` (MPICH's sum)",
        "fp16_alltoall_f32": "fp16 words, Alltoall + float32 sum in rank order",
        "bf16_alltoall_f32": "bf16 words, Alltoall + float32 sum in rank order",
    }

    def wrong(m: dict) -> str:
        frac = m["frac_not_correctly_rounded"]
        return "0" if frac == 0 else f"{100 * frac:.1f} %"

    def rounded(m: dict) -> str:
        if m["frac_not_correctly_rounded"] == 0:
            return "every element of its result is correctly rounded"
        return f"{wrong(m)} of the elements of its result are not correctly rounded"

    d = four.data
    rows = [
        [names[k], f"{1e3 * m['median_s']:.0f} ms", f"{m['sent_bytes'] / MB:.1f} MB", wrong(m)]
        for k, m in d["methods"].items()
    ]
    header = [
        f"{d['world']} ranks, median",
        "time",
        "bytes sent per rank",
        "elements not correctly rounded",
    ]
    orders = d["methods"]["fp16_mpi_sum"]["other_rank_orders"].values()
    at2 = two.data["methods"]
    return "\n\n".join(
        [
            f"{d['numel']:,} elements per rank, {' '.join(d['mpi_library'].split())}, medians "
            f"over {d['repeats']} "
            "calls. " + measured_by(four, two),
            table(header, rows),
            "With the ranks in another order MPICH's fp16 sum changes "
            f"{span([100 * o['frac_differs'] for o in orders], '{:.0f}')} % of the elements of "
            f"its result. At {two.data['world']} ranks (one fp16 addition, so no order) "
            f"{rounded(at2['fp16_mpi_sum'])}, and it takes "
            f"{1e3 * at2['fp16_mpi_sum']['median_s']:.0f} ms against the fp16 Alltoall path's "
            f"{1e3 * at2['fp16_alltoall_f32']['median_s']:.0f} ms.",
        ]
    )


# ---- offload: README.md, docs/offload.md


def _elements(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else f"{n:,}"


def offload_step(res: Result) -> str:
    d = res.data
    buf, direct = d["disk_buffered"], d["disk_direct"]
    setup = (
        f"A replay model of {d['padded_numel']:,} parameters at stage {d['stage']} in "
        f"{d['precision']}, {d['ranks']} ranks. Per rank: {d['swap_bytes_per_rank'] / MB:.1f} MB "
        f"of swap files, a pool of {d['pool_bytes_per_rank'] / MB:.1f} MB ({d['buffer_count']} "
        f"sets of {d['pool_rows']} x {_elements(d['sub_group_size'])} elements: master, m, v"
        f"{', the gradient' if d['pool_rows'] == 4 else ''}; each with its 4 KiB of slack), "
        f"{d['read_bytes_per_step_per_rank'] / MB:.1f} MB read and "
        f"{d['written_bytes_per_step_per_rank'] / MB:.1f} MB written per step. The disk, every "
        f"rank at once: write then read back cold through the page cache {buf['total_s']:.3f} s "
        f"and with O_DIRECT {direct['total_s']:.3f} s, as `dd` would; reading one file while "
        f"writing another {direct['read_while_writing_s']:.3f} s; and that with two threads each "
        f"way {direct['read_while_writing_2_threads_each_s']:.3f} s. " + measured_by(res)
    )
    rows = [
        ["optimizer step, offloaded", f"{d['offload_step_s']:.3f}"],
        ["optimizer step, in RAM", f"{d['ram_step_s']:.3f}"],
        ["the disk alone, fastest of the four ways", f"{d['disk_s']:.3f}"],
        ["offloaded / max(disk, RAM)", f"{d['offload_over_max_disk_ram']:.2f}"],
        [
            "offloaded / max(disk written then read, as `dd`, RAM)",
            f"{d['offload_over_max_sequential_disk_ram']:.2f}",
        ],
    ]
    peaks = [b / MB for b in d["peak_rss_above_baseline_offload_phase"]]
    met = "met" if d["target_le_1p2"] else "not met"
    after = (
        f"The target, offloaded / max(disk, RAM) <= 1.2, was {met} in this run. The disk "
        f"alone takes {d['disk_s'] / d['ram_step_s']:.1f} times the in-RAM step. Resident "
        f"peak above the interpreter's baseline in the offloaded phase: {span(peaks, '{:.0f}')} MB "
        f"per rank, where the ledger holds {d['ledger_ram_bytes_offload'] / MB:.1f} MB in RAM (the "
        f"in-RAM run's ledger: {d['ledger_ram_bytes_ram'] / MB:.1f} MB)."
    )
    return "\n\n".join([setup, table(["", "seconds"], rows), after])


def offload_demo(res: Result) -> str:
    d = res.data
    gb, mem = 1e9, d["mem_total_bytes"]
    peaks = d["peak_rss_bytes_per_rank"]
    swap, states = d["swap_bytes_all_ranks"], d["model_state_bytes"]
    rows = [
        ["model", f"GPT, d_model {d['d_model']}, {d['n_layer']} blocks, context "
                  f"{d['context']}: {d['params']:,} parameters"],
        ["model states", f"{states / gb:.1f} GB = {states / mem:.2f} x MemTotal "
                         f"({mem / gb:.1f} GB)"],
        ["swap files, all ranks", f"{swap / gb:.1f} GB ({swap / d['ranks'] / 2**30:.1f} GiB "
                                  "per rank)"],
        [f"peak resident set, summed over the {d['ranks']} ranks",
         f"{d['peak_rss_bytes_sum'] / gb:.2f} GB ({span([p / gb for p in peaks])} GB each): "
         f"{d['peak_rss_bytes_sum'] / mem:.2f} x MemTotal"],
        ["lowest MemAvailable during the run", f"{d['lowest_mem_available_bytes'] / gb:.1f} GB"],
        [f"loss, steps 1-{len(d['losses'])}", ", ".join(f"{x:.3f}" for x in d["losses"])],
        ["seconds per step", ", ".join(f"{s:.0f}" for s in d["step_s"])
                             + f" ({d['wall_s']:.0f} s for the whole run, init included)"],
    ]  # fmt: skip
    return "\n\n".join([measured_by(res), table(["", ""], rows)])


def offload_readme(demo: Result, step: Result) -> str:
    d, s = demo.data, step.data
    gb = 1e9
    losses = ", ".join(f"{x:.2f}" for x in d["losses"])
    return (
        f"{d['params'] / 1e9:.2f}B parameters, model states {d['model_state_bytes'] / gb:.1f} GB "
        f"on a machine with {d['mem_total_bytes'] / gb:.1f} GB of RAM "
        f"({d['model_state_over_mem_total']:.2f}x), "
        f"peak resident set summed over the ranks {d['peak_rss_bytes_sum'] / gb:.2f} GB, loss "
        f"{losses} over {len(d['losses'])} steps of {span(d['step_s'], '{:.0f}')} s. The offloaded "
        f"optimizer step alone (`scripts/bench/bench_offload.py`, {s['padded_numel'] / 1e6:.0f}M "
        f"parameters) took {s['offload_over_max_disk_ram']:.2f} times what the disk needs to move "
        "its bytes with no compute at all"
    )


def offload_slope(before: Result, after: Result) -> str:
    """What a rank's RAM costs per added parameter with everything offloaded, before the
    gradient shard went to disk (main's code) and after (scripts/bench/bench_offload_slope.py)."""
    rows = []
    for label, res in (("gradient shard in RAM", before), ("gradient shard on disk", after)):
        small, big = res.data["runs"]
        commit = res.data.get("zero_ref_commit")  # the code the ranks ran (older runs: none)
        label += f" (zero_ref at {commit})" if commit else " (before this change)"
        rows.append(
            [
                label,
                f"{small['peak_rss_max_bytes'] / MIB:.1f}",
                f"{big['peak_rss_max_bytes'] / MIB:.1f}",
                f"{res.data['slope_max_bytes_per_param']:.3f}",
                f"{res.data['ledger_ram_slope_bytes_per_param']:.3f}",
                f"{small['run_s']:.0f}, {big['run_s']:.0f}",
            ]
        )
    d = after.data
    small, big = d["runs"]
    setup = (
        f"GPT, d_model {d['d_model']}, {small['n_layer']} and {big['n_layer']} blocks "
        f"({small['numel_padded']:,} and {big['numel_padded']:,} padded parameters), stage 3, "
        f"fp32, {d['ranks']} ranks, `--offload-optimizer nvme --offload-param nvme`, activation "
        f"checkpointing, context {d['context']}, micro-batch 1, {d['steps']} steps. "
        + measured_by(before, after)
    )
    header = [
        "",
        f"peak RSS per rank, {small['n_layer']} blocks (MiB)",
        f"{big['n_layer']} blocks (MiB)",
        "bytes per added parameter per rank",
        "of it in the ledger",
        "seconds per run",
    ]
    met = "met" if d["meets_target"] else "not met"
    verdict = f"The target, <= {d['target']} bytes per added parameter per rank, was {met}."
    return "\n\n".join([setup, table(header, rows), verdict])


def rounding_costs(res: Result) -> str:
    """scripts/bench/bench_rounding.py: each conversion's cast and kernel, ns per element."""
    rows, d = res.data["rows"], res.data
    kinds = list(dict.fromkeys(r["input"] for r in rows))
    by = {(r["conversion"], r["input"]): r for r in rows}
    body = []
    for conversion in dict.fromkeys(r["conversion"] for r in rows):
        for who, key in (("cast", "cast_ns"), ("kernel", "kernel_ns")):
            cells = [f"{by[conversion, k][key]:.2f}" for k in kinds]
            body.append([f"{conversion}, {who}", *cells])
    agree = all(r["bits_agree"] for r in rows)
    return "\n\n".join(
        [
            f"{d['settings']['numel']:,} elements, one thread, median of "
            f"{d['settings']['repeats']}, ns per element; kernel and cast agree bit for bit on "
            f"every input: {agree}. " + measured_by(res),
            table(["conversion", *kinds], body),
        ]
    )


RENDERERS = {
    f.__name__: f
    for f in (
        memory, memory_readme, memory_stage3, memory_untracked, precision_speed, precision_loss,
        precision_readme, precision_losses, half_reduce, offload_step, offload_demo, offload_readme,
        offload_slope, rounding_costs,
    )
}  # fmt: skip
