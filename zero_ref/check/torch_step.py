"""One watched optimizer step, from each rank's captures to rank 0's verdict.

Every rank writes its own micro-steps (folder mode: nothing crosses the wire), or sends
them to rank 0 (check mode), which builds the StepRecord, checks it and tells every
rank the outcome, so that a step out of the bound (or a record that does not fit) ends
every rank with the same error instead of leaving the others in the next collective.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from zero_ref.check.record import StepRecord


class CheckFailed(RuntimeError):
    """A step left the oracle's bound (or its record does not fit); raised on every
    rank, rank 0's Verdict attached (None on the other ranks and for a bad record)."""

    def __init__(self, message: str, verdict: object = None) -> None:
        super().__init__(message)
        self.verdict = verdict


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _gather(mine: object, world: int) -> list:
    """Every rank's object on rank 0 (others get an empty list)."""
    if world == 1:
        return [mine]
    everyone = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    return everyone or []


def _broadcast(message: object) -> object:
    if not _distributed():
        return message
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def normalised_weights(raw: list[float], normalization: str) -> list[float] | None:
    """This rank's weights[j] over the step's total on every rank (one all-reduce), so
    that sum_jr weights[j][r] = 1: the global token mean, for instance."""
    if normalization != "weighted":
        return None
    total = torch.tensor([float(sum(raw))], dtype=torch.float64)
    if _distributed():
        dist.all_reduce(total)
    if not total.item() > 0:
        raise ValueError(f"the step's weights sum to {total.item()}; they must sum to > 0")
    return [w / total.item() for w in raw]


def _record(w, everyone: list, params_after: dict, shards: dict, skipped: bool) -> StepRecord:
    """Rank 0: the StepRecord of this step, micro-steps indexed [j][r]."""
    counts = [len(micro) for micro, _, _ in everyone]
    if len(set(counts)) != 1:
        raise ValueError(
            f"step {w.step}: the ranks declared {counts} micro-steps (rank by rank); "
            "every rank must call watch.loss() once per micro-step, the same number of times"
        )
    steps = range(counts[0])
    weights = None
    if everyone[0][2] is not None:
        weights = [[e[2][j] for e in everyone] for j in steps]
    return StepRecord(
        step=w.step,
        micro_grads=[[e[0][j] for e in everyone] for j in steps],
        loss_grad=[[e[1][j] for e in everyone] for j in steps],
        groups=w._groups,
        applied_grads=w._applied or {},
        params_after=params_after,
        weights=weights,
        scale=w._scale,
        skipped=skipped,
        reported_norm=w._reported_norm,
        extra={"shards": shards} if shards else {},
    )


def _write(w, weights: list[float] | None, params_after: dict, shards: dict, skipped: bool):
    from zero_ref.check.records_io import write_rank_step, write_step

    write_rank_step(w.folder, w.step, w.rank, w._micro, w._loss_grad, weights)
    if w.rank == 0:
        write_step(
            w.folder,
            w.step,
            w._groups,
            w._applied or {},
            params_after,
            scale=w._scale,
            skipped=skipped,
            reported_norm=w._reported_norm,
            extra={"shards": shards} if shards else None,
        )


def _check(w, everyone: list, params_after: dict, shards: dict, skipped: bool) -> tuple:
    """Rank 0: (status, message, verdict), status "ok", "flagged" (out of the bound) or
    "bad" (a record that does not fit: always an error, whatever on_mismatch says)."""
    try:
        record = _record(w, everyone, params_after, shards, skipped)
        if w._keep:
            w.records.append(record)
        if w.checker is None:
            return "ok", "", None
        verdict = w.checker.check(record)
    except ValueError as err:  # RecordError is one
        return "bad", f"zero_ref.check: step {w.step}: {err}", None
    w.verdicts.append(verdict)
    return ("ok" if verdict.ok else "flagged"), str(verdict), verdict


def finish_step(w, params_after: dict[str, np.ndarray], shards: dict, skipped: bool) -> None:
    """Record, check and report watcher `w`'s step (every rank calls it, in step)."""
    weights = normalised_weights(w._weights, w.spec.normalization)
    if w.folder is not None:
        _write(w, weights, params_after, shards, skipped)
    if not w.gathers:
        return
    everyone = _gather((w._micro, w._loss_grad, weights), w.world)
    status, message, verdict = "ok", "", None
    if w.rank == 0:
        status, message, verdict = _check(w, everyone, params_after, shards, skipped)
    status, message = _broadcast((status, message))
    if status == "ok":
        return
    if status == "bad" or w.on_mismatch == "raise":
        raise CheckFailed(message, verdict)
    if w.rank == 0 and sum(not v.ok for v in w.verdicts) == 1:
        print(message, file=sys.stderr, flush=True)  # "report": the first flagged step
