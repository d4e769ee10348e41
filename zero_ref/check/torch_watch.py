"""Watch a torch DDP/FSDP run and check every optimizer step against the oracle.

    w = watch(model, optimizer, clip_max_norm=1.0)      # after wrapping, before training
    for step ...:
        for j in range(A):
            loss = w.loss(loss_fn(model(x), y))          # the micro-batch's loss, as declared
            (loss / A).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); optimizer.zero_grad()          # the step is checked here
    w.close()

Per optimizer step this gathers to rank 0 what zero_ref/check/record.py describes
(each rank's unreduced gradient of each micro-step, the factor its backward put on
the declared loss, the param groups, the gradients optimizer.step was given, the
parameters after it) and hands it to the Checker (the single-rank oracle with its
bound, and the diagnosis catalogue when a step leaves it), or writes it to a folder
for `python -m zero_ref.check FOLDER`. Nothing the run computes is changed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from zero_ref.check import torch_settings
from zero_ref.check.record import NORMALIZATIONS, RunSpec, StepRecord
from zero_ref.check.torch_capture import capture_for, to_numpy
from zero_ref.check.torch_settings import read_groups, scaler_spec
from zero_ref.check.torch_step import CheckFailed, finish_step

__all__ = ["CheckFailed", "Watcher", "watch"]

ON_MISMATCH = ("raise", "report")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Watcher:
    """The object `watch` returns: hooks in place, one record per optimizer step."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        normalization: str = "mean",
        clip_max_norm: float | None = None,
        scaler: torch.amp.GradScaler | None = None,
        folder: str | None = None,
        check: bool = True,
        optimizer_kind: str | None = None,
        on_mismatch: str = "raise",
        keep_records: bool = False,
        lr_schedule: Sequence[float] | None = None,
        reduce_dtype: str = "float32",
        param_dtype: str = "float32",
    ) -> None:
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization={normalization!r}; allowed: {', '.join(NORMALIZATIONS)}"
            )
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch={on_mismatch!r}; allowed: {', '.join(ON_MISMATCH)}")
        if not check and folder is None and not keep_records:
            raise ValueError("nothing to do: pass check=True, a folder, or keep_records=True")
        self.rank, self.world = _world()
        self.scaler, self.folder, self.on_mismatch = scaler, folder, on_mismatch
        self.verdicts: list = []  # rank 0: one Verdict per checked step
        self.records: list[StepRecord] = []  # rank 0, with keep_records
        self._keep = keep_records
        self.gathers = check or keep_records  # every rank: whether steps go to rank 0
        self._micro: list[dict[str, np.ndarray]] = []  # this step's micro-steps, this rank
        self._loss_grad: list[float | None] = []
        self._weights: list[float] = []
        self._scale: float | None = None  # the GradScaler's scale at this step's backward
        self._reported_norm: float | None = None
        self._applied: dict[str, np.ndarray] | None = None
        self._groups: tuple = ()
        self.step = 0
        self.capture = capture_for(model, self._record_grad)
        names = tuple(self.capture.params)
        self._names_by_id = {id(p): n for n, p in self.capture.params.items()}
        initial = self.capture.full_params()
        self.spec = RunSpec(
            world=self.world,
            optimizer=torch_settings.optimizer_kind(optimizer, optimizer_kind),
            names=names,
            shapes={n: tuple(initial[n].shape) for n in names},
            normalization=normalization,
            clip_max_norm=clip_max_norm,
            scaler=scaler_spec(scaler),
            framework=self.capture.framework,
            reduce_dtype=reduce_dtype,
            param_dtype=param_dtype,
            lr_schedule=None if lr_schedule is None else tuple(map(float, lr_schedule)),
        )
        read_groups(optimizer, self._names_by_id)  # a parameter the model lacks: refused now
        self.optimizer = optimizer
        self._opt_handles = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
        ]
        self.checker = self._open(initial, check)

    def _open(self, initial: dict[str, np.ndarray], check: bool):
        """Rank 0's Checker (None without check) and the folder's spec."""
        if self.rank != 0:
            return None
        if self.folder is not None:
            from zero_ref.check.records_io import write_spec

            write_spec(self.folder, self.spec, initial)
        if not check:
            return None
        from zero_ref.check.checker import Checker

        return Checker(self.spec, initial)

    # --- what the user's loop calls ---------------------------------------------

    def loss(self, loss: torch.Tensor, weight: float | None = None) -> torch.Tensor:
        """Declare one micro-step's loss (before any `/ A`, `* scale`); returns it.

        Call it once per micro-step, before that micro-step's backward. A hook on the
        tensor reads the factor the backward puts on it (1/A for `(loss / A)`, the
        GradScaler's scale too). `weight` (normalization="weighted"): this micro-batch's
        share before normalising, e.g. its token count; the watcher divides by the step's
        total over all micro-steps and ranks.
        """
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise ValueError(
                "watch.loss() takes the micro-batch's scalar loss tensor, one that "
                "backward runs through (requires_grad)"
            )
        if (weight is None) != (self.spec.normalization != "weighted"):
            raise ValueError(
                "weight= is given with normalization='weighted', and only then "
                f"(this watcher's normalization is {self.spec.normalization!r})"
            )
        self._finish_if_skipped()
        j = len(self._micro)
        self._micro.append({})
        self._loss_grad.append(None)
        self._weights.append(float(weight) if weight is not None else 1.0)
        if self.scaler is not None and self.scaler.is_enabled():
            self._scale = float(self.scaler.get_scale())
        loss.register_hook(partial(self._record_loss_grad, j))
        return loss

    micro_step = loss

    def clip_norm(self, total_norm: torch.Tensor | float) -> torch.Tensor | float:
        """Hand over what clip_grad_norm_ returned, so that the run's norm is checked too."""
        self._reported_norm = float(total_norm)
        return total_norm

    def close(self) -> None:
        """Check a last step the GradScaler skipped, then remove every hook."""
        self._finish_if_skipped()
        if self._micro:
            print(
                f"zero_ref.check: {len(self._micro)} micro-step(s) after step {self.step} "
                "reached no optimizer step and were not checked",
                file=sys.stderr,
            )
        for handle in self._opt_handles:
            handle.remove()
        self.capture.close()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- hooks ----------------------------------------------------------------------

    def _record_grad(self, name: str, grad: torch.Tensor) -> None:
        if not self._micro:
            raise RuntimeError(
                f"zero_ref.check: a backward reached {name!r} before watch.loss() declared "
                "this micro-step's loss: call w.loss(loss) before each backward"
            )
        g, current = to_numpy(grad), self._micro[-1]
        current[name] = current[name] + g if name in current else g  # two backwards: summed

    def _record_loss_grad(self, j: int, grad: torch.Tensor) -> None:
        """Summed like the parameters' gradients: a second backward through the same loss
        (retain_graph) adds to both, so their ratio stays the loss's gradient."""
        before = self._loss_grad[j]
        self._loss_grad[j] = float(grad) + (before or 0.0)

    def _before_step(self, optimizer: object, args: object, kwargs: object) -> None:
        self._applied = self.capture.full_grads()
        self._groups = read_groups(self.optimizer, self._names_by_id)

    def _after_step(self, optimizer: object, args: object, kwargs: object) -> None:
        self._finish(skipped=False)

    def _finish_if_skipped(self) -> None:
        """The GradScaler skipped optimizer.step (no hook ran) when micro-steps are left
        and its scale has changed since their backward: update() backs it off after a
        skip, always (backoff_factor < 1), and leaves it unchanged or grown otherwise
        only after a step was taken."""
        if not self._micro or self.scaler is None or not self.scaler.is_enabled():
            return
        if float(self.scaler.get_scale()) != self._scale:
            self._applied = {}
            self._groups = read_groups(self.optimizer, self._names_by_id)
            self._finish(skipped=True)

    # --- one step's record ------------------------------------------------------------

    def _finish(self, skipped: bool) -> None:
        self.step += 1
        if any(c is None for c in self._loss_grad):
            j = self._loss_grad.index(None)
            raise RuntimeError(
                f"zero_ref.check: step {self.step}, micro-step {j + 1}: the loss given to "
                "watch.loss() got no gradient; backpropagate through the tensor it returned"
            )
        params_after = self.capture.full_params()
        shards = self.capture.shards()
        try:
            finish_step(self, params_after, shards, skipped)
        finally:  # checked (or failed): these micro-steps are done with either way
            self._micro, self._loss_grad, self._weights = [], [], []
            self._reported_norm, self._applied = None, None


def watch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options) -> Watcher:
    """Watch `model` (DDP, FSDP2 `fully_shard`, FSDP1 `use_orig_params=True`, or a
    plain module) trained by `optimizer`: see Watcher for the options."""
    return Watcher(model, optimizer, **options)
