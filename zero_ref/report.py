"""End-of-run tables: what each rank really held and sent, beside the formulas."""

from __future__ import annotations

from zero_ref.comm_ledger import CommLedger, paper_sent_bytes
from zero_ref.memory import CATEGORIES, fp32_formula_bytes, paper_formula_bytes


def rank_report(engine) -> dict:
    """This rank's ledgers, as plain data (gathered to rank 0 at the end)."""
    return {
        "rank": engine.rank,
        "memory_bytes": engine.memory.bytes_by_category(),
        "peak_bytes": engine.memory.peak_bytes,
        "peak_by_category": dict(engine.memory.peak_by_category),
        "comm_last_step": engine.comm.ledger.last_step(),
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:9.3f}"


def memory_table(reports: list[dict], stage: int, numel: int, world: int, k: int) -> str:
    """Bytes held per rank by category, the fp32 formula, and the paper's K=12 line."""
    formula = fp32_formula_bytes(stage, numel, world, k)
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
    lines.append(f"{'fp32':>4}{cells} {_mib(sum(formula.values()))}   <- formula for this stage")
    paper = paper_formula_bytes(stage, numel, world)
    lines.append(f"paper, mixed precision K=12: {_mib(paper).strip()} MiB of model states per rank")
    return "\n".join(lines)


def comm_table(reports: list[dict], stage: int, numel: int, world: int, k: int) -> str:
    """Bytes each rank sent in the last step, by collective, beside the paper's volume."""
    kinds = sorted({kind for r in reports for kind in r["comm_last_step"]})
    lines = [
        "communication in the last step, bytes sent per rank "
        "(modelled: each call's buffer counts, priced as a ring algorithm moves them)",
        "rank " + "".join(f"{kind:>16}" for kind in kinds) + f"{'total':>16}",
    ]
    for r in reports:
        step = r["comm_last_step"]
        cells = "".join(f"{int(step.get(kind, {}).get('sent_bytes', 0)):>16,}" for kind in kinds)
        lines.append(f"{r['rank']:>4} {cells}{CommLedger.step_sent_bytes(step):>16,}")
    lines.append(_paper_line(stage, numel, world, k))
    return "\n".join(lines)


def _paper_line(stage: int, numel: int, world: int, k: int) -> str:
    """The paper's Sec. 7 volume; it counts one micro-step, so k > 1 says so."""
    paper = paper_sent_bytes(stage, numel, world, 1)
    if k == 1:
        return f"paper (Sec. 7), params + grads: {paper:,} bytes per rank per step"
    expected = paper_sent_bytes(stage, numel, world, k)
    return (
        f"expected with grad-accum {k}: {expected:,} bytes per rank per step "
        f"(the paper's Sec. 7 figure, {paper:,}, is for one micro-step)"
    )
