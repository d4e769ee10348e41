"""After the last step of `python -m zero_ref.train`: the export, the sample, the trace
file, and rank 0's report of what each rank held and sent beside the formulas
(zero_ref/app/report.py), with the --log-jsonl's last record.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zero_ref.app.cli import Parsed
from zero_ref.app.data import unigram_entropy
from zero_ref.app.process_memory import PhasePeaks
from zero_ref.app.report import comm_table, memory_table, rank_report, rss_table
from zero_ref.app.run_setup import Prepared
from zero_ref.app.tasks import Task
from zero_ref.formulas.memory import formula_bytes
from zero_ref.formulas.traffic import (
    HierarchicalGathers,
    QuantizedGathers,
    expected_sent_bytes,
    paper_sent_bytes,
)
from zero_ref.io.metrics_log import JsonlLog
from zero_ref.io.tensor_io import SafetensorsWriter
from zero_ref.io.trace import Trace, write_trace
from zero_ref.layout.flat import tensor_views
from zero_ref.layout.grad_blocks import GradientWire, plan_wire


def finish(
    parsed: Parsed,
    engine,
    job: Prepared,
    log: JsonlLog | None,
    phases: PhasePeaks,
    trace: Trace | None,
    skipped: int,
) -> None:
    """Export, sample, trace, ledgers: the collectives first, then rank 0 alone. Nothing
    here needs the whole model on any rank: both stream it one unit at a time."""
    run = parsed.run
    with engine.comm.ledger.off_the_books():
        if run.export:
            export(engine, run.export)
        sample = sample_text(engine, job.task, run) if run.sample_chars else None
    phases.end("finish")
    if trace is not None:
        write_every_ranks_trace(engine, trace, run.trace)
    reports = engine.comm.mpi.gather(rank_report(engine, phases), root=0)
    if engine.rank != 0:
        return
    if run.export:
        print(f"exported consolidated parameters to {run.export}")
    print(report_tables(parsed, engine, reports))
    if log:
        log.write(final_record(parsed, engine, job.tokens, skipped, reports))
        log.close()
    if sample is not None:
        print("sample:\n" + sample, flush=True)


def write_every_ranks_trace(engine, trace: Trace, path: str) -> None:
    """Every rank's events to rank 0, which writes them to one file (a collective)."""
    everyone = engine.comm.mpi.gather(trace.events, root=0)
    if engine.rank == 0:
        write_trace(path, everyone)
        print(f"trace of {len(everyone)} ranks written to {path} (ui.perfetto.dev)")


def report_tables(parsed: Parsed, engine, reports: list[dict]) -> str:
    """Rank 0's end-of-run tables: memory held against the formulas, the real resident
    memory against the ledger, and the last step's bytes sent against the paper's."""
    zero, layout, sizes = parsed.zero, engine.layout, engine.precision.bytes
    numel, world, k = layout.full_numel, engine.shard_world, zero.grad_accum  # hybrid: G
    unit_numels = [u.padded_numel for u in layout.units]
    return "\n".join(
        [
            memory_table(reports, zero.stage, numel, world, k, sizes, zero.mixed_precision.dtype),
            rss_table(reports),
            comm_table(
                reports,
                zero.stage,
                unit_numels,
                world,
                k,
                sizes,
                engine.gathers(),
                _qgz_blocks(zero, unit_numels, world),
            ),  # fmt: skip
            *_hybrid_lines(engine),
        ]
    )


def _hybrid_lines(engine) -> list[str]:
    """Hybrid sharding: the schedule above is one shard group's; the all-reduce across
    the groups comes on top (ledger kind allreduce_hybrid)."""
    if engine.cfg.hybrid.shard_size is None:
        return []
    return [
        f"hybrid sharding: ZeRO inside groups of {engine.shard_world} ranks (the lines "
        f"above), plus {engine.hybrid_sent_bytes():,} bytes per rank per step across the "
        f"{engine.hybrid.replicas} groups (allreduce_hybrid)"
    ]


def final_record(
    parsed: Parsed, engine, tokens: np.ndarray, skipped: int, reports: list[dict]
) -> dict:
    """The --log-jsonl's last record: the run, the formulas, and every rank's ledgers."""
    run, zero = parsed.run, parsed.zero
    numel, world, k = engine.layout.full_numel, engine.shard_world, zero.grad_accum
    unit_numels = [u.padded_numel for u in engine.layout.units]
    sizes = engine.precision.bytes
    return {
        "final": True,
        "model": run.model,
        "unigram_entropy": unigram_entropy(tokens),  # nats/char: ignoring context
        "stage": zero.stage,
        "world_size": engine.world,
        "shard_world_size": world,  # hybrid sharding's group size (else the world's)
        "numel_padded": numel,
        "precision": zero.mixed_precision.dtype,
        "element_bytes": dataclasses.asdict(sizes),
        "formula_bytes": formula_bytes(zero.stage, numel, world, k, sizes),
        "unit_padded_numels": unit_numels,
        "paper_sent_bytes": paper_sent_bytes(zero.stage, numel, world, 1, sizes.param),
        "expected_sent_bytes": expected_sent_bytes(
            zero.stage,
            unit_numels,
            world,
            k,
            sizes,
            gathers=_qwz_gathers(engine),
            grad_blocks=_qgz_blocks(zero, unit_numels, world),
        )
        + engine.hybrid_sent_bytes(),
        "skipped_steps": skipped,
        "loss_scale": engine.loss_scale(),
        "ranks": reports,
    }


def export(engine, path: str) -> None:
    """Stream the parameters to rank 0, which writes each tensor as it arrives, into a
    temporary file renamed into place at the end (a collective)."""
    writer = None
    if engine.rank == 0:
        writer = SafetensorsWriter(path, engine.layout.named_shapes())

    def write(kind: str, unit, flat) -> None:
        for name, tensor in tensor_views(flat, unit).items():
            writer.write(f"{unit.name}.{name}", tensor)

    try:
        engine.stream_state(["param"], write)
    except BaseException:
        if writer:
            writer.abort()
        raise
    if writer:
        writer.close()


def sample_text(engine, task: Task, run) -> str | None:
    """Text from the trained model, every rank running the forward (stage 3 gathers
    unit by unit); rank 0's logits are broadcast so all ranks draw the same ids."""

    def forward(ids: np.ndarray) -> np.ndarray:
        out = np.ascontiguousarray(engine.forward(ids))
        engine.comm.broadcast(out, kind="sample")
        return out

    text = task.sample(forward, run.sample_chars, run.seed)
    return text if engine.rank == 0 else None


def _qgz_blocks(zero, unit_numels, world: int) -> GradientWire | None:
    """With qgZ: a destination row's values and blocks over the bucket plan, on its wire."""
    pp = zero.zeropp
    if not pp.quantized_gradients:
        return None
    bits = pp.quantized_gradient_bits
    return plan_wire(unit_numels, world, zero.bucket_numel, pp.quantize_block, bits)


def _qwz_gathers(engine):
    """Stage 3 with qwZ or hpZ: its gathers by kind (forward's in int8, the group's from
    hpZ's secondary copy), for the expected bytes."""
    pp = engine.cfg.zeropp
    zeropp = pp.quantized_weights or pp.hpz_partition_size != 1
    gathers = engine.gathers() if zeropp else None
    return gathers if isinstance(gathers, QuantizedGathers | HierarchicalGathers) else None
