"""The tables of docs/stages.md, computed from zero_ref/engine/memory.py's formulas.

    python scripts/docs/stages_tables.py            # prints the markdown docs/stages.md holds

The fourth table splits the mixed-precision bytes by where they live when the
optimizer state is offloaded: to NVMe (--offload-optimizer nvme, which at stages 2-3
takes the gradient shard to disk too: memory.grads_on_disk), with, at stage 3, the
parameters too (--offload-param nvme); and to host RAM with --device gpu
--offload-optimizer cpu (ZeRO-Offload: the gradients stay on the device).

tests/test_docs.py checks that docs/stages.md contains exactly what this prints, so
the tables cannot drift from the formulas the engine's ledger is tested against.
"""

from __future__ import annotations

from zero_ref.engine.memory import FP32, formula_bytes, grads_on_disk, paper_formula_bytes
from zero_ref.numerics.dtypes import element_bytes

STAGES = {0: "baseline (DP)", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
GB = 1e9


def bytes_table() -> str:
    """Bytes per parameter one rank holds, per stage, fp32 and mixed precision, from
    formula_bytes at a Psi large enough that rounding to the world size vanishes."""
    psi, n = 64 * 10**6, 64
    mixed = element_bytes("bf16", "bf16", "bf16")
    lines = [
        "| stage | what each rank holds | fp32: bytes / param (N = 64) "
        "| fp16/bf16: bytes / param (N = 64) |",
        "|---|---|---|---|",
    ]
    holds = {
        0: "params, grads, optimizer state: all of them",
        1: "params, grads; 1/N of the optimizer state",
        2: "params; 1/N of grads and optimizer state",
        3: "1/N of everything",
    }
    for stage, name in STAGES.items():
        cells = []
        for sizes in (FP32, mixed):
            parts = formula_bytes(stage, psi, n, 1, sizes)
            cells.append(
                f"{sum(parts.values()) / psi:.3f} "
                f"({parts['params'] / psi:g} + {parts['grads'] / psi:g} + "
                f"{parts['optimizer'] / psi:g})"
            )
        lines.append(f"| {stage} {name} | {holds[stage]} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def figure1_table() -> str:
    """The paper's Figure 1: 7.5B parameters, 64 ranks, K = 12."""
    psi, n = 7.5e9, 64
    lines = ["| stage | formula | GB per rank |", "|---|---|---|"]
    formulas = {
        0: "(2 + 2 + K) Psi",
        1: "2 Psi + 2 Psi + K Psi / N",
        2: "2 Psi + (2 + K) Psi / N",
        3: "(2 + 2 + K) Psi / N",
    }
    for stage, name in STAGES.items():
        gb = paper_formula_bytes(stage, int(psi), n) / GB
        lines.append(f"| {stage} {name} | {formulas[stage]} | {gb:.1f} |")
    return "\n".join(lines)


def projection_table() -> str:
    """Model states per rank (GB, K = 12) of a 7.5B-parameter model as ranks grow."""
    psi, ranks = int(7.5e9), (1, 4, 16, 64, 256, 1024)
    lines = [
        "| stage | " + " | ".join(f"N = {n}" for n in ranks) + " |",
        "|---|" + "---|" * len(ranks),
    ]
    for stage, name in STAGES.items():
        cells = " | ".join(f"{paper_formula_bytes(stage, psi, n) / GB:.2f}" for n in ranks)
        lines.append(f"| {stage} {name} | {cells} |")
    return "\n".join(lines)


def offload_table() -> str:
    """Where one rank's bytes per parameter live when the optimizer state (and at stage
    3 the parameters) are offloaded: formula_bytes's categories, bf16, N = 64. On NVMe
    the gradient shard goes to disk with the optimizer at stages 2-3 (grads_on_disk;
    stage 1's full gradient buffer stays in RAM); ZeRO-Offload to host RAM leaves the
    gradients on the device."""
    psi, n = 64 * 10**6, 64
    mixed = element_bytes("bf16", "bf16", "bf16")
    lines = [
        "| stage | nothing offloaded | optimizer on NVMe: RAM + disk "
        "| stage 3, parameters too: RAM + disk "
        "| `--device gpu --offload-optimizer cpu`: device + host RAM |",
        "|---|---|---|---|---|",
    ]
    for stage, name in STAGES.items():
        parts = {k: v / psi for k, v in formula_bytes(stage, psi, n, 1, mixed).items()}
        cells = [f"{sum(parts.values()):.3f}", "- (stages 1-3)", "-", "- (stages 1-3)"]
        if stage >= 1:
            grads_disk = parts["grads"] if grads_on_disk(stage, "nvme") else 0.0
            ram = parts["params"] + parts["grads"] - grads_disk
            cells[1] = f"{ram:g} + {parts['optimizer'] + grads_disk:g}"
            cells[3] = f"{parts['params'] + parts['grads']:g} + {parts['optimizer']:g}"
        if stage == 3:
            ram = parts["grads"] - grads_disk
            cells[2] = f"{ram:g} + {parts['params'] + parts['optimizer'] + grads_disk:g}"
        lines.append(f"| {stage} {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables() -> str:
    return "\n\n".join([bytes_table(), figure1_table(), projection_table(), offload_table()])


if __name__ == "__main__":
    print(tables())
