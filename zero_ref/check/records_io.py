"""A run's records on disk: what a watcher writes and `python -m zero_ref.check` reads.

One folder per run, written while it trains (docs/check_reference.md, "The format"):

    spec.json                       {"format": FORMAT, "spec": RunSpec's fields}
    initial.safetensors             the parameters before step 1, by name
    step_000001/rank_0.safetensors  rank 0's micro-step gradients, "j{j}/{name}"
    step_000001/rank_0.json         {"loss_grad": [c_j, ...], "weights": [w_j, ...] | null}
    step_000001/step.json           groups, scale, skipped, reported_norm, extra (rank 0)
    step_000001/applied.safetensors the gradient each parameter held at optimizer.step
    step_000001/params.safetensors  the parameters after the step

Every tensor is full-size (a sharded framework gathers it first) and float32. Each file
is written atomically (zero_ref/io/atomic.py), and rank 0 writes step.json last, so a
step folder without it is a step the run did not finish. Reading checks that everything
fits and raises RecordError naming what does not.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save

from zero_ref.check.record import GroupSettings, RecordError, RunSpec, ScalerSpec, StepRecord
from zero_ref.io.atomic import atomic_write_bytes

FORMAT = "zero_ref.check/1"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_KEY = re.compile(r"^j(\d+)/(.+)$")

Folder = str | os.PathLike[str]


def step_dir(folder: Folder, step: int) -> Path:
    return Path(folder) / f"step_{step:06d}"


def write_spec(folder: Folder, spec: RunSpec, initial_params: dict[str, np.ndarray]) -> None:
    """Rank 0, before step 1: the run's spec and its initial parameters."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    _save(Path(folder) / "initial.safetensors", initial_params)
    _write_json(Path(folder) / "spec.json", {"format": FORMAT, "spec": asdict(spec)})


def write_rank_step(
    folder: Folder,
    step: int,
    rank: int,
    micro_grads: list[dict[str, np.ndarray]],
    loss_grad: list[float],
    weights: list[float] | None = None,
) -> None:
    """Every rank, after its last micro-step: its gradients of each micro-step j before
    any reduction, the factor its backward applied to each loss, and (for normalization
    "weighted") each micro-loss's weight."""
    if len(loss_grad) != len(micro_grads) or (
        weights is not None and len(weights) != len(micro_grads)
    ):
        raise ValueError(
            f"step {step}, rank {rank}: one loss_grad (and weight) per micro-step, "
            f"got {len(micro_grads)} micro-steps, {len(loss_grad)} loss_grad"
        )
    d = step_dir(folder, step)
    d.mkdir(parents=True, exist_ok=True)
    _save(
        d / f"rank_{rank}.safetensors",
        {f"j{j}/{name}": g for j, grads in enumerate(micro_grads) for name, g in grads.items()},
    )
    meta = {
        "loss_grad": [float(c) for c in loss_grad],
        "weights": None if weights is None else [float(w) for w in weights],
    }
    _write_json(d / f"rank_{rank}.json", meta)


def write_step(
    folder: Folder,
    step: int,
    groups: tuple[GroupSettings, ...] | list[GroupSettings],
    applied_grads: dict[str, np.ndarray],
    params_after: dict[str, np.ndarray],
    *,
    scale: float | None = None,
    skipped: bool = False,
    reported_norm: float | None = None,
    extra: dict | None = None,
) -> None:
    """Rank 0, after optimizer.step (and after every rank's write_rank_step)."""
    d = step_dir(folder, step)
    d.mkdir(parents=True, exist_ok=True)
    _save(d / "applied.safetensors", applied_grads)
    _save(d / "params.safetensors", params_after)
    meta = {
        "groups": [asdict(g) for g in groups],
        "scale": scale,
        "skipped": bool(skipped),
        "reported_norm": None if reported_norm is None else float(reported_norm),
        "extra": extra or {},
    }
    _write_json(d / "step.json", meta)


def read_run(folder: Folder) -> tuple[RunSpec, dict[str, np.ndarray], Iterator[StepRecord]]:
    """The spec, the initial parameters and the steps, in order (read one at a time).

    Raises RecordError for a folder that does not fit: no spec, an unknown format, steps
    missing between the first and the last, a rank's files missing, an unreadable file."""
    root = Path(folder)
    if not root.is_dir():
        raise RecordError(f"{root}: no such folder of records")
    spec = _read_spec(root / "spec.json")
    initial = _load(root / "initial.safetensors")
    steps = _step_numbers(root)
    for step in steps:
        for r in range(spec.world):
            for suffix in (".safetensors", ".json"):
                if not (step_dir(root, step) / f"rank_{r}{suffix}").is_file():
                    raise RecordError(
                        f"{step_dir(root, step)}: rank {r}'s rank_{r}{suffix} is "
                        f"missing (the run has {spec.world} ranks)"
                    )
    return spec, initial, (_read_step(root, spec, s) for s in steps)


def _step_numbers(root: Path) -> list[int]:
    steps = sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    if not steps:
        raise RecordError(f"{root}: no step_NNNNNN folders")
    if steps[0] != 1:
        raise RecordError(
            f"{root}: the first step is {steps[0]}; records start at step 1 "
            "(the oracle starts from the initial parameters and no optimizer state)"
        )
    missing = sorted(set(range(1, steps[-1] + 1)) - set(steps))
    if missing:
        raise RecordError(f"{root}: steps {missing[:10]} missing between 1 and {steps[-1]}")
    return steps


def _read_spec(path: Path) -> RunSpec:
    meta = _read_json(path)
    if meta.get("format") != FORMAT:
        raise RecordError(f"{path}: format {meta.get('format')!r}; this reader reads {FORMAT!r}")
    fields = dict(meta.get("spec") or {})
    try:
        fields["names"] = tuple(fields["names"])
        fields["shapes"] = {k: tuple(v) for k, v in fields["shapes"].items()}
        if fields.get("scaler") is not None:
            fields["scaler"] = ScalerSpec(**fields["scaler"])
        if fields.get("lr_schedule") is not None:
            fields["lr_schedule"] = tuple(fields["lr_schedule"])
        return RunSpec(**fields)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RecordError(f"{path}: not a RunSpec ({type(e).__name__}: {e})") from e


def _read_step(root: Path, spec: RunSpec, step: int) -> StepRecord:
    d = step_dir(root, step)
    meta = _read_json(d / "step.json")
    ranks = [_read_rank(d, r) for r in range(spec.world)]
    counts = {len(c) for _, c, _ in ranks}
    if len(counts) != 1:
        raise RecordError(
            f"{d}: the ranks recorded different numbers of micro-steps {sorted(counts)}"
        )
    a = counts.pop()
    try:
        groups = tuple(
            GroupSettings(**{**g, "names": tuple(g["names"]), "betas": tuple(g["betas"])})
            for g in meta["groups"]
        )
        weights = (
            None
            if ranks[0][2] is None
            else [[ranks[r][2][j] for r in range(spec.world)] for j in range(a)]
        )
        return StepRecord(
            step=step,
            micro_grads=[[ranks[r][0][j] for r in range(spec.world)] for j in range(a)],
            loss_grad=[[ranks[r][1][j] for r in range(spec.world)] for j in range(a)],
            groups=groups,
            applied_grads=_load(d / "applied.safetensors"),
            params_after=_load(d / "params.safetensors"),
            weights=weights,
            scale=meta.get("scale"),
            skipped=bool(meta.get("skipped", False)),
            reported_norm=meta.get("reported_norm"),
            extra=meta.get("extra") or {},
        )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, RecordError):
            raise
        raise RecordError(f"{d}/step.json: {type(e).__name__}: {e}") from e


def _read_rank(d: Path, rank: int) -> tuple[list[dict[str, np.ndarray]], list[float], list | None]:
    meta = _read_json(d / f"rank_{rank}.json")
    loss_grad, weights = meta.get("loss_grad"), meta.get("weights")
    if not isinstance(loss_grad, list) or not loss_grad:
        raise RecordError(f"{d}/rank_{rank}.json: loss_grad must be a list, one per micro-step")
    if weights is not None and len(weights) != len(loss_grad):
        raise RecordError(
            f"{d}/rank_{rank}.json: {len(weights)} weights, {len(loss_grad)} micro-steps"
        )
    micro: list[dict[str, np.ndarray]] = [{} for _ in loss_grad]
    for key, g in _load(d / f"rank_{rank}.safetensors").items():
        m = _KEY.match(key)
        if m is None or int(m.group(1)) >= len(loss_grad):
            raise RecordError(
                f"{d}/rank_{rank}.safetensors: tensor {key!r} is not j<micro-step>/<name> "
                f"with a micro-step below {len(loss_grad)}"
            )
        micro[int(m.group(1))][m.group(2)] = g
    return micro, [float(c) for c in loss_grad], weights


def _save(path: Path, named: dict[str, np.ndarray]) -> None:
    for name, t in named.items():
        if not isinstance(t, np.ndarray) or t.dtype != np.float32:
            kind = t.dtype if isinstance(t, np.ndarray) else type(t).__name__
            raise ValueError(f"{path.name}: {name} is {kind}; records hold float32 NumPy arrays")
    atomic_write_bytes(path, save({k: np.ascontiguousarray(v) for k, v in named.items()}))


def _load(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise RecordError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise RecordError(f"{path}: not a readable safetensors file ({e})") from e


def _write_json(path: Path, meta: dict) -> None:
    atomic_write_bytes(path, json.dumps(meta, indent=1).encode())


def _read_json(path: Path) -> dict:
    if not path.is_file():
        hint = (
            " (rank 0 writes it last: the run did not finish this step)"
            if path.name == "step.json"
            else ""
        )
        raise RecordError(f"{path}: missing{hint}")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(meta, dict):
        raise RecordError(f"{path}: expected a JSON object")
    return meta
