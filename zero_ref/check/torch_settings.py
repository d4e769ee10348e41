"""What a torch optimizer and GradScaler are set to, read as zero_ref.check's records.

The oracle follows the run's own settings step by step: the param groups are read at
every optimizer.step (a schedule changes lr between steps, groups differ in weight
decay), so only the *kind* of optimizer and its fixed options are decided once.
Options the oracle does not model are refused by name rather than checked wrongly.
"""

from __future__ import annotations

import torch

from zero_ref.check.record import OPTIMIZERS, GroupSettings, ScalerSpec

# Adam's and SGD's options whose math the oracle does not have: refused, never ignored.
_UNMODELLED = {"amsgrad": False, "maximize": False}


def optimizer_kind(optimizer: torch.optim.Optimizer, declared: str | None) -> str:
    """'adamw', 'adam' or 'sgd': from torch's class, or declared for the user's own.

    torch.optim.AdamW is Adam with decoupled_weight_decay=True (torch >= 2.7), so the
    flag decides, not the class name. A user's optimizer (their sharded AdamW, say)
    must declare which math it means to do: that is what it is checked against.
    """
    if declared is not None:
        if declared not in OPTIMIZERS:
            raise ValueError(
                f"optimizer_kind={declared!r} is not one zero_ref.check models; "
                f"allowed: {', '.join(OPTIMIZERS)}"
            )
        kind = declared
    elif isinstance(optimizer, torch.optim.AdamW):
        kind = "adamw"
    elif isinstance(optimizer, torch.optim.Adam):
        decoupled = optimizer.defaults.get("decoupled_weight_decay", False)
        kind = "adamw" if decoupled else "adam"
    elif isinstance(optimizer, torch.optim.SGD):
        kind = "sgd"
    else:
        raise ValueError(
            f"zero_ref.check does not know what {type(optimizer).__name__} computes: "
            "pass optimizer_kind='adamw', 'adam' or 'sgd' (the math it means to do)"
        )
    for group in optimizer.param_groups:
        for option, modelled in _UNMODELLED.items():
            if group.get(option, modelled) != modelled:
                raise ValueError(
                    f"{option}={group[option]!r} in a param group: the oracle models "
                    f"{kind} with {option}={modelled} only"
                )
    return kind


def read_groups(
    optimizer: torch.optim.Optimizer, names_by_id: dict[int, str]
) -> tuple[GroupSettings, ...]:
    """Each param group's settings now, its parameters by name (in the run's order)."""
    groups = []
    for group in optimizer.param_groups:
        names = []
        for p in group["params"]:
            if id(p) not in names_by_id:
                raise ValueError(
                    "the optimizer holds a parameter the watched model does not have "
                    f"(shape {tuple(p.shape)}): watch the model the optimizer was built on"
                )
            names.append(names_by_id[id(p)])
        betas = group.get("betas", (0.9, 0.999))
        groups.append(
            GroupSettings(
                names=tuple(names),
                lr=float(group["lr"]),  # a tensor lr (capturable schedules) read as a number
                weight_decay=float(group.get("weight_decay", 0.0)),
                betas=(float(betas[0]), float(betas[1])),
                eps=float(group.get("eps", 1e-8)),
                momentum=float(group.get("momentum", 0.0)),
                dampening=float(group.get("dampening", 0.0)),
                nesterov=bool(group.get("nesterov", False)),
                initial_lr=_number_or_none(group.get("initial_lr")),  # set by LR schedulers
            )
        )
    return tuple(groups)


def _number_or_none(value: object) -> float | None:
    return None if value is None else float(value)


def scaler_spec(scaler: torch.amp.GradScaler | None) -> ScalerSpec | None:
    """The GradScaler's rule between steps (its growth and backoff), or None."""
    if scaler is None or not scaler.is_enabled():
        return None
    return ScalerSpec(
        growth_factor=float(scaler.get_growth_factor()),
        backoff_factor=float(scaler.get_backoff_factor()),
        growth_interval=int(scaler.get_growth_interval()),
    )
