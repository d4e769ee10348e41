"""Where a torch run's gradients and parameters are read, one class per framework.

Each rank's gradient of each micro-step must be caught *before* the framework reduces
it (docs/oracle.md, "Feeding it from PyTorch DDP or FSDP"): a tensor hook on the
tensor the backward really differentiates, which autograd calls with this backward's
gradient alone, before it is added to `.grad` and before any all-reduce or
reduce-scatter. Which tensor that is depends on the framework:

- DDP, or a model the user reduces by hand: the parameters themselves;
- FSDP2 (`fully_shard`): the *unsharded* parameters a unit's forward pre-hook swaps
  in (our pre-hook runs after FSDP's, so it sees them);
- FSDP1 (`use_orig_params=True`): the views into the unsharded FlatParameter that
  FSDP sets as module attributes for forward (a pre-hook on the wrapped module).

A capture also gathers the full (unsharded) gradients at optimizer.step and the full
parameters (collectives: every rank calls them), and says how the framework shards
each parameter (`shards`), for the "clip on the local norm" diagnosis. Hooks only read:
the run trains exactly as unwatched. torch is imported here and in torch_watch only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

Record = Callable[[str, torch.Tensor], None]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A float32 host copy (the record's dtype): bf16/fp16 gradients widen exactly.

    Copied by torch before NumPy sees it: a NumPy view of FSDP's own storage would pin
    it (FSDP frees an unsharded buffer by resizing its storage to 0)."""
    return t.detach().to(device="cpu", dtype=torch.float32, copy=True).numpy()


class ReplicatedCapture:
    """DDP, or a plain module the user all-reduces: every rank holds every parameter."""

    framework = "ddp"

    def __init__(self, model: torch.nn.Module, record: Record) -> None:
        self.module = getattr(model, "module", model)  # DDP wraps; names without "module."
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self.framework = "replicated"
        self.params = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        self._handles = [
            p.register_hook(partial(_hook, record, name)) for name, p in self.params.items()
        ]

    def full_params(self) -> dict[str, np.ndarray]:
        return {n: to_numpy(p) for n, p in self.params.items()}

    def full_grads(self) -> dict[str, np.ndarray]:
        """The gradient each parameter holds now (after DDP's all-reduce): rank 0's copy."""
        return {n: to_numpy(p.grad) for n, p in self.params.items() if p.grad is not None}

    def shards(self) -> dict[str, list[tuple[int, int]]]:
        return {}  # nothing is sharded

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _hook(record: Record, name: str, grad: torch.Tensor) -> None:
    record(name, grad)  # returns None: the gradient is left as it is


class _LatestHooks:
    """One live hook per parameter name: re-hooking a name removes its previous hook
    (FSDP gathers into the same tensors at every forward, where hooks would pile up;
    a forward run again, as activation checkpointing does, would hook again: not
    tried)."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self.handles: dict[str, torch.utils.hooks.RemovableHandle] = {}

    def hook(self, name: str, tensor: torch.Tensor) -> None:
        old = self.handles.pop(name, None)
        if old is not None:
            old.remove()
        self.handles[name] = tensor.register_hook(partial(_hook, self.record, name))

    def close(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        self.handles.clear()


def _names_with_grad(params: dict[str, torch.Tensor]) -> list[str]:
    """The names whose gradient is set on any rank (gathering is a collective: every
    rank must gather the same names, in the same order)."""
    mine = [n for n, p in params.items() if p.grad is not None]
    everyone: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    union = set().union(*map(set, everyone))
    return [n for n in params if n in union]


class Fsdp2Capture:
    """FSDP2: each `fully_shard`ed module is a unit whose pre-forward unshards it."""

    framework = "fsdp2"

    def __init__(self, model: torch.nn.Module, record: Record) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._hooks = _LatestHooks(record)
        self._unit_handles = [
            module.register_forward_pre_hook(partial(self._hook_unit, prefix))
            for prefix, module in model.named_modules()
            if isinstance(module, FSDPModule)
        ]

    def _hook_unit(self, prefix: str, module: torch.nn.Module, args: object) -> None:
        from torch.distributed.tensor import DTensor

        for name, p in module.named_parameters():
            if p.requires_grad and not isinstance(p, DTensor):  # DTensors: not yet gathered
                self._hooks.hook(f"{prefix}.{name}" if prefix else name, p)

    def full_params(self) -> dict[str, np.ndarray]:
        return {n: to_numpy(p.full_tensor()) for n, p in self.params.items()}

    def full_grads(self) -> dict[str, np.ndarray]:
        names = _names_with_grad(self.params)
        return {n: to_numpy(self.params[n].grad.full_tensor()) for n in names}

    def shards(self) -> dict[str, list[tuple[int, int]]]:
        """FSDP2 shards dim 0 as torch.chunk does: ceil(rows / N) rows per rank."""
        world = dist.get_world_size()
        layout = {}
        for name, p in self.params.items():
            shape = tuple(p.shape)
            rows, per_row = (shape[0], int(np.prod(shape[1:]))) if shape else (1, 1)
            chunk = -(-rows // world)
            layout[name] = [
                (min(r * chunk, rows) * per_row, min((r + 1) * chunk, rows) * per_row)
                for r in range(world)
            ]
        return layout

    def close(self) -> None:
        for handle in self._unit_handles:
            handle.remove()
        self._hooks.close()


class Fsdp1Capture:
    """FSDP1 with use_orig_params=True: the wrapped module's forward sees the views."""

    framework = "fsdp1"

    def __init__(self, model: torch.nn.Module, record: Record) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp._common_utils import clean_tensor_name

        self.model, self._clean = model, clean_tensor_name
        self.params = {  # named as outside FSDP: no "_fsdp_wrapped_module." in them
            clean_tensor_name(n): p for n, p in model.named_parameters() if p.requires_grad
        }
        self.units = [m for m in FSDP.fsdp_modules(model) if m._handle is not None]
        for unit in self.units:
            if not unit._handle._use_orig_params:
                raise ValueError(
                    "zero_ref.check watches FSDP1 only with use_orig_params=True (the "
                    "parameters keep their names and their gradients can be hooked); "
                    "got use_orig_params=False"
                )
        self._module_names = {id(m): n for n, m in model.named_modules()}
        self._hooks = _LatestHooks(record)
        self._unit_handles = [
            unit._fsdp_wrapped_module.register_forward_pre_hook(partial(self._hook_unit, unit))
            for unit in self.units
        ]

    def _hook_unit(self, unit: torch.nn.Module, module: torch.nn.Module, args: object) -> None:
        for param_name, owner, _ in unit._handle.flat_param._param_infos:
            view = getattr(owner, param_name)
            if view.requires_grad:
                self._hooks.hook(self._name(owner, param_name), view)

    def _name(self, owner: torch.nn.Module, param_name: str) -> str:
        """The parameter's name as model.named_parameters() spells it outside FSDP."""
        prefix = self._module_names[id(owner)]
        return self._clean(f"{prefix}.{param_name}" if prefix else param_name)

    def full_params(self) -> dict[str, np.ndarray]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(self.model, writeback=False):
            named = ((self._clean(n), p) for n, p in self.model.named_parameters())
            return {n: to_numpy(p) for n, p in named if n in self.params}

    def full_grads(self) -> dict[str, np.ndarray]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(self.model, writeback=False, with_grads=True):
            named = ((self._clean(n), p) for n, p in self.model.named_parameters())
            held = ((n, p) for n, p in named if n in self.params and p.grad is not None)
            return {n: to_numpy(p.grad) for n, p in held}

    def shards(self) -> dict[str, list[tuple[int, int]]]:
        """Each rank's [start, stop) of each parameter's flat elements (its FlatParameter
        shard cuts parameters anywhere, the way zero_ref's flat layout does)."""
        mine: dict[str, tuple[int, int]] = {}
        for unit in self.units:
            flat = unit._handle.flat_param
            for (param_name, owner, _), info in zip(
                flat._param_infos, flat._shard_param_infos, strict=True
            ):
                name = self._name(owner, param_name)
                if info.in_shard:  # the end index is inclusive
                    mine[name] = (info.intra_param_start_idx, info.intra_param_end_idx + 1)
        everyone: list[dict] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(everyone, mine)
        return {n: [tuple(e.get(n, (0, 0))) for e in everyone] for n in self.params}

    def close(self) -> None:
        for handle in self._unit_handles:
            handle.remove()
        self._hooks.close()


def capture_for(model: torch.nn.Module, record: Record):
    """The capture for the framework that wraps `model`, chosen once."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP) or any(isinstance(m, FSDP) for m in model.modules()):
        return Fsdp1Capture(model, record)
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return Fsdp2Capture(model, record)
    return ReplicatedCapture(model, record)
