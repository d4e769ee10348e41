"""zero_ref/formulas/step_model.py's step times for clusters we cannot run (docs/step_model.md).

    python scripts/bench/step_model_clusters.py            # the markdown tables
    python scripts/bench/step_model_clusters.py --record   # docs/results/step_model_clusters.json

Pure arithmetic: no run. Every input is in ASSUMPTIONS below, each with its source, and
docs/step_model.md repeats them. Weak scaling: each GPU keeps its TOKENS per step.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit
from zero_ref.formulas.step_model import (
    Cluster,
    Link,
    Workload,
    flights_of,
    host_link_bytes,
    predict,
)
from zero_ref.layout.grad_blocks import plan_wire
from zero_ref.numerics.dtypes import ElementBytes

ASSUMPTIONS = {
    "gpu_peak_flops": 989e12,  # H100 SXM, dense BF16 (NVIDIA H100 datasheet)
    "mfu": 0.40,  # model flops utilization, an assumption (not measured here)
    "tokens_per_gpu": 4 * 4096,  # 4 sequences of 4096 tokens per GPU per step
    "nvlink_bytes_s": 450e9,  # NVLink 4: 900 GB/s per GPU, both directions (datasheet)
    "hbm_bytes_s": 3.35e12,  # H100 SXM HBM3 (datasheet): the optimizer and quantization
    "optimizer_bytes_per_param": 32,  # AdamW: fp32 master, m, v read+written, bf16 p, g
    "quantize_bytes_per_numel": 10,  # read bf16, write int8, read int8 + write bf16
    "nics_per_node": 8,  # one NIC per GPU, as DGX H100 (8 x ConnectX-7)
    "alpha_intra_s": 3e-6,  # per message inside a node: an assumption
    "alpha_inter_s": 10e-6,  # per message across nodes: an assumption
    "reduce_bucket_numel": 500_000_000,  # DeepSpeed's reduce_bucket_size default
    "quantize_block": 2048,
    "overlap_efficiency": 1.0,  # collectives run under all of compute: an assumption
    # the rank's own seconds a collective call: 0, an assumption. The two hosts fit
    # zero_ref's (its Python around each call, docs/step_model.md); a GPU framework's
    # cost per call is not measured here.
    "call_s": 0.0,
}
# (name, parameters, layers): Llama 2's 7B and 70B (Touvron et al. 2023, Table 1 sizes)
MODELS = (("7B", 6.74e9, 32), ("70B", 68.98e9, 80))
NODES, GPUS, LINKS_GBPS = (8, 64, 512), 8, (200, 400)
BF16 = ElementBytes(2, 2, 2)


def workload(
    params: float, layers: int, stage: int, zpp: bool, world: int, tokens: int | None = None
) -> Workload:
    a = ASSUMPTIONS
    tokens = tokens or a["tokens_per_gpu"]
    compute = 6 * params * tokens / (a["gpu_peak_flops"] * a["mfu"])
    unit = int(params // layers)
    block = a["quantize_block"]
    return Workload(
        stage=stage,
        unit_numels=(unit,) * layers,
        forward_s=compute / 3,
        backward_s=compute * 2 / 3,
        optimizer_s=params * a["optimizer_bytes_per_param"] / a["hbm_bytes_s"],
        sizes=BF16,
        overlap=True,
        overlap_efficiency=a["overlap_efficiency"],
        call_s=a["call_s"],
        qwz_block=block if zpp and stage == 3 else None,
        hpz=zpp and stage == 3,
        qgz_blocks=int(params // world // block) if zpp else None,
        reduce_buckets=max(1, round(params / a["reduce_bucket_numel"])),
        quantize_s_per_numel=a["quantize_bytes_per_numel"] / a["hbm_bytes_s"],
    )


def cluster(nodes: int, gbps: float, collectives: str) -> Cluster:
    a = ASSUMPTIONS
    inter = Link(a["alpha_inter_s"], a["nics_per_node"] * gbps * 1e9 / 8)
    return Cluster(
        nodes, GPUS, Link(a["alpha_intra_s"], a["nvlink_bytes_s"]), inter, "block", collectives
    )


def rows() -> list[dict]:
    out = []
    for (name, params, layers), stage, zpp, coll in itertools.product(
        MODELS, (1, 2, 3), (False, True), ("flat", "hierarchical")
    ):
        row = {"model": name, "stage": stage, "zeropp": zpp, "collectives": coll, "cells": []}
        for nodes, gbps in itertools.product(NODES, LINKS_GBPS):
            p = predict(
                workload(params, layers, stage, zpp, nodes * GPUS), cluster(nodes, gbps, coll), 2
            )
            row["cells"].append(
                {
                    "nodes": nodes,
                    "gbps": gbps,
                    "step_s": p.step_s,
                    "compute_s": p.compute_s,
                    "exposed_s": p.exposed_s,
                    "hidden_s": p.hidden_s,
                }
            )
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    heads = [f"{c['nodes']}x8 {c['gbps']}G" for c in table[0]["cells"]]
    lines = ["| model | stage | ZeRO++ | collectives | " + " | ".join(heads) + " |"]
    lines.append("|" + "---|" * (4 + len(heads)))
    for r in table:
        cells = " | ".join(
            f"{c['step_s']:.2f} / {(c['hidden_s'] + c['exposed_s']) / c['compute_s']:.2f}"
            for c in r["cells"]
        )
        zpp = "qwZ+hpZ+qgZ" if r["zeropp"] and r["stage"] == 3 else ("qgZ" if r["zeropp"] else "-")
        lines.append(f"| {r['model']} | {r['stage']} | {zpp} | {r['collectives']} | {cells} |")
    return "\n".join(lines)


def break_even_tokens(name: str, nodes: int, gbps: float, zpp: bool, coll: str) -> int:
    """The fewest tokens per GPU at which overlapped stage 3's step is within 5 % of
    stage 2's (below it stage 3's traffic no longer hides), by bisection over powers."""
    _, params, layers = next(m for m in MODELS if m[0] == name)
    c = cluster(nodes, gbps, coll)

    def ratio(tokens: int) -> float:
        w3 = workload(params, layers, 3, zpp, nodes * GPUS, tokens)
        w2 = workload(params, layers, 2, zpp, nodes * GPUS, tokens)
        return predict(w3, c, 2).step_s / predict(w2, c, 2).step_s

    lo, hi = 1, 1 << 24
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ratio(mid) <= 1.05 else (mid, hi)
    return hi


def break_even() -> list[dict]:
    out = []
    for (name, _, _), nodes, gbps, zpp, coll in itertools.product(
        MODELS, NODES, LINKS_GBPS, (False,), ("flat", "hierarchical")
    ):
        tokens = break_even_tokens(name, nodes, gbps, zpp, coll)
        out.append(
            {
                "model": name,
                "nodes": nodes,
                "gbps": gbps,
                "zeropp": zpp,
                "collectives": coll,
                "tokens_per_gpu": tokens,
            }
        )
    return out


def break_even_markdown(table: list[dict]) -> str:
    lines = ["| model | link | ZeRO++ | collectives | 8 nodes | 64 nodes | 512 nodes |"]
    lines.append("|---|---|---|---|---|---|---|")
    keys = sorted(
        {(r["model"], r["gbps"], r["zeropp"], r["collectives"]) for r in table},
        key=lambda k: (k[0] != "7B", k[1], k[2], k[3]),
    )
    for m, g, z, c in keys:
        cells = [
            r
            for r in table
            if (r["model"], r["gbps"], r["zeropp"], r["collectives"]) == (m, g, z, c)
        ]
        cells.sort(key=lambda r: r["nodes"])
        text = " | ".join(f"{r['tokens_per_gpu']:,}" for r in cells)
        lines.append(f"| {m} | {g} Gb/s | {'yes' if z else '-'} | {c} | {text} |")
    return "\n".join(lines)


# ZeRO++'s cross-node volume per step, in units of M (the model's fp16 bytes), as its
# authors tabulate it: DeepSpeed's blogs/zeropp/japanese/README.md (deepspeedai/DeepSpeed,
# commit 862edef), "Communication Volume": forward all-gather, backward all-gather,
# backward reduce-scatter, total. Its 0.25M for gradients is qgZ at 4 bits (the paper's).
PUBLISHED_VOLUME = {"ZeRO-3": (1.0, 1.0, 1.0, 3.0), "ZeRO++": (0.5, 0.0, 0.25, 0.75)}
VOLUME_KINDS = {  # the model's flights, in the published table's three columns
    "allgather_forward": 0,
    "allgather_backward": 1,
    "allgather_hpz": 1,
    "reduce_scatter": 2,
    "reduce_scatter_qgz": 2,
}


def volume_rows(nodes: int = 64) -> list[dict]:
    """Stage 3's bytes one node puts on its link a step, hierarchical collectives, per
    column of ZeRO++'s table, in units of M (H-1)/H (the least an all-gather of the
    fp16 model can send per node): ZeRO-3, ZeRO++ with qgZ at 8 bits (zero_ref's default)
    and at 4 bits (the paper's), beside the published figures."""
    out = []
    world = nodes * GPUS
    c = cluster(nodes, 200, "hierarchical")
    for name, params, layers in MODELS:
        unit = (int(params // layers),) * layers
        m_least = 2 * sum(unit) * (nodes - 1) / nodes
        for label, zpp, bits in (("ZeRO-3", False, None), ("ZeRO++", True, 8), ("ZeRO++", True, 4)):
            w = workload(params, layers, 3, zpp, world)
            if bits is not None:  # a destination row over the bucket plan, on qgZ's wire
                a = ASSUMPTIONS
                buckets, block = a["reduce_bucket_numel"], a["quantize_block"]
                wire = plan_wire(unit, world, buckets, block, bits)
                w = dataclasses.replace(w, qgz_blocks=wire)
            cols = [0.0, 0.0, 0.0]
            for f in flights_of(w, c):
                cols[VOLUME_KINDS[f.kind]] += host_link_bytes(f, c) / m_least
            out.append(
                {
                    "model": name,
                    "nodes": nodes,
                    "config": label,
                    "qgz_bits": bits,
                    "model_m": [*cols, sum(cols)],
                    "published_m": list(PUBLISHED_VOLUME[label]),
                }
            )
    return out


def volume_markdown(table: list[dict]) -> str:
    lines = ["| model | config | qgZ bits | forward gather | backward gather | reduction | total |"]
    lines.append("|---|---|---|---|---|---|---|")
    for r in table:
        cells = " | ".join(
            f"{m:.3f} ({p:g})" for m, p in zip(r["model_m"], r["published_m"], strict=True)
        )
        lines.append(f"| {r['model']} | {r['config']} | {r['qgz_bits'] or '-'} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_flag(p, "step_model_clusters")
    a = p.parse_args()
    table = rows()
    even = break_even()
    volume = volume_rows()
    print(markdown(table) + "\n\n" + break_even_markdown(even) + "\n\n" + volume_markdown(volume))
    emit(
        {
            "assumptions": ASSUMPTIONS,
            "models": MODELS,
            "rows": table,
            "break_even": even,
            "volume": volume,
        },
        a.record,
    )


if __name__ == "__main__":
    main()
