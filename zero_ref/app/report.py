"""End-of-run tables: what each rank really held and sent, beside the formulas."""

from __future__ import annotations

from zero_ref.app.process_memory import PhasePeaks
from zero_ref.comm.ledger import COPY_KINDS, CommLedger
from zero_ref.formulas.memory import CATEGORIES, FP32, formula_bytes, paper_formula_bytes
from zero_ref.formulas.traffic import (
    HierarchicalGathers,
    QuantizedGathers,
    expected_sent_bytes,
    hpz_sent_bytes,
    paper_sent_bytes,
)
from zero_ref.layout.grad_blocks import GradientWire
from zero_ref.numerics.dtypes import ElementBytes


def rank_report(engine, phases: PhasePeaks | None = None) -> dict:
    """This rank's ledgers and real resident peaks, as plain data (gathered to rank 0)."""
    return {
        "rank": engine.rank,
        **engine.memory_report(),  # memory, disk and device bytes; the peaks
        "rss_baseline_bytes": phases.baseline if phases else None,
        "rss_peak_bytes": dict(phases.peaks) if phases else {},
        "comm_last_step": engine.comm.ledger.last_step(),
    }


def rss_table(reports: list[dict]) -> str:
    """The ledger's peak beside the process's real peak above its baseline, per phase."""
    phases = list(reports[0]["rss_peak_bytes"]) if reports and reports[0]["rss_peak_bytes"] else []
    if not phases:
        return "real resident memory: not available on this system (/proc/self/status)"
    head = "rank " + f"{'ledger peak':>12}" + "".join(f"{'real ' + p:>12}" for p in phases)
    lines = [
        "ledger vs process, MiB (real: peak resident set above the baseline after imports, "
        "per phase; untracked = real peak - ledger peak: activations, MPI, Python)",
        head + f"{'untracked':>12}",
    ]
    for r in reports:
        real = r["rss_peak_bytes"]
        cells = "".join(f"{real[p] / 2**20:12.3f}" for p in phases)
        untracked = max(real.values()) - r["peak_bytes"]
        lines.append(
            f"{r['rank']:>4} {r['peak_bytes'] / 2**20:12.3f}{cells}{untracked / 2**20:12.3f}"
        )
    return "\n".join(lines)


def _mib(n: float) -> str:
    return f"{n / 2**20:9.3f}"


def memory_table(
    reports: list[dict],
    stage: int,
    numel: int,
    world: int,
    k: int,
    sizes: ElementBytes = FP32,
    precision: str = "fp32",
) -> str:
    """Bytes held per rank by category, the formula of this precision, and the paper's
    K=12 line (which the fp16/bf16 formula equals at grad_accum 1)."""
    formula = formula_bytes(stage, numel, world, k, sizes)
    head = "rank " + "".join(f"{c:>10}" for c in CATEGORIES) + f"{'total':>10}{'peak':>10}"
    lines = [
        f"memory per rank, MiB (stage {stage}, Psi = {numel:,} padded params, {world} ranks)",
        head,
    ]
    for r in reports:
        held = r["memory_bytes"]
        cells = "".join(f" {_mib(held[c])}" for c in CATEGORIES)
        lines.append(f"{r['rank']:>4}{cells} {_mib(sum(held.values()))} {_mib(r['peak_bytes'])}")
    cells = "".join(f" {_mib(formula[c])}" if c in formula else f"{'-':>10}" for c in CATEGORIES)
    lines.append(f"{precision:>4}{cells} {_mib(sum(formula.values()))}   <- formula for this stage")
    disk = max((sum(r.get("disk_bytes", {}).values()) for r in reports), default=0)
    if disk:
        lines.append(f"on disk (swap files, not in RAM): {_mib(disk).strip()} MiB per rank")
    for r in reports:
        on_device = r.get("device_bytes", {})
        if any(on_device.values()):
            cells = "".join(f" {_mib(on_device[c])}" for c in CATEGORIES)
            lines.append(f"{r['rank']:>4}{cells} {_mib(sum(on_device.values()))}   <- on the GPU")
    paper = paper_formula_bytes(stage, numel, world)
    lines.append(f"paper, mixed precision K=12: {_mib(paper).strip()} MiB of model states per rank")
    return "\n".join(lines)


def comm_table(
    reports: list[dict],
    stage: int,
    unit_numels: list[int],
    world: int,
    k: int,
    sizes: ElementBytes = FP32,
    gathers: list[int] | None = None,
    grad_blocks: GradientWire | None = None,
) -> str:
    """Bytes each rank sent in the last step, by collective, beside the paper's volume
    and zero_ref's own schedule. unit_numels: the padded unit sizes, forward order;
    gathers: stage 3's gathers of each unit per step, where its plan holds more than
    one unit (None: the one-buffer schedule's); grad_blocks: qgZ's GradientWire (None: no qgZ)."""
    kinds = sorted({k for r in reports for k in r["comm_last_step"]} - set(COPY_KINDS))
    w = max([16, *(len(kind) + 2 for kind in kinds)])  # reduce_scatter_int8 is wider
    lines = [
        "communication in the last step, bytes sent per rank "
        "(modelled: each call's buffer counts, priced as a ring algorithm moves them)",
        "rank " + "".join(f"{kind:>{w}}" for kind in kinds) + f"{'total':>{w}}",
    ]
    for r in reports:
        step = r["comm_last_step"]
        cells = "".join(f"{int(step.get(kind, {}).get('sent_bytes', 0)):>{w},}" for kind in kinds)
        lines.append(f"{r['rank']:>4} {cells}{CommLedger.step_sent_bytes(step):>{w},}")
    lines += _volume_lines(stage, unit_numels, world, k, sizes, gathers, grad_blocks)
    for r in reports:
        down, up, grads, params = (
            CommLedger.step_copied_bytes(r["comm_last_step"], kind) for kind in COPY_KINDS
        )
        if down or up:
            lines.append(
                f"rank {r['rank']} host <-> GPU copies (staging, not network): "
                f"{down:,} bytes device to host, {up:,} host to device"
            )
        if grads or params:
            lines.append(
                f"rank {r['rank']} ZeRO-Offload over PCIe: {grads:,} bytes of gradients "
                f"down, {params:,} of parameters up"
            )
    return "\n".join(lines)


def _volume_lines(
    stage: int,
    unit_numels: list[int],
    world: int,
    k: int,
    sizes: ElementBytes,
    gathers: list[int] | None = None,
    grad_blocks: GradientWire | None = None,
) -> list[str]:
    """The paper's Sec. 7 volume (one micro-step, in the parameters' bytes), and what
    zero_ref's schedule sends: k micro-steps, at stage 3 no gather of a unit the buffer
    already holds, gradients in the wire's dtype."""
    paper = paper_sent_bytes(stage, sum(unit_numels), world, 1, sizes.param)
    expected = expected_sent_bytes(
        stage, unit_numels, world, k, sizes, gathers=gathers, grad_blocks=grad_blocks
    )
    lines = [f"paper (Sec. 7), params + grads, one micro-step: {paper:,} bytes per rank"]
    if expected != paper:
        why = []
        if k > 1:
            why.append(f"{k} micro-steps")
        if isinstance(gathers, HierarchicalGathers):
            across, inside = hpz_sent_bytes(unit_numels, world, k, sizes, gathers, grad_blocks)
            if gathers.block is not None:
                why.append(f"qwZ: first gathers in int8 + a float32 scale per {gathers.block}")
            why.append(
                f"hpZ: later gathers inside groups of {gathers.group_size}, {inside:,} of the "
                f"bytes; {across:,} across the world"
            )
        elif isinstance(gathers, QuantizedGathers):
            why.append(f"qwZ: forward gathers in int8 + a float32 scale per {gathers.block}")
        elif stage == 3:
            held = "the units in the buffers" if gathers else "the unit in the buffer"
            why.append(f"no re-gather of {held}")
        if grad_blocks is not None:
            why.append(
                f"qgZ: gradients in int{grad_blocks.bits} + a float32 scale for each of "
                f"{grad_blocks.blocks} blocks"
            )
        elif sizes.comm != sizes.param or (stage == 0 and sizes.grad != sizes.param):
            why.append(f"{sizes.comm}-byte gradients on the wire")
        lines.append(f"this schedule ({', '.join(why)}): {expected:,} bytes per rank per step")
    return lines
