"""The catalogue's bugs in the optimizer: its groups, formula, counts, lr and state
(diagnoses.py): weight decay where the groups say otherwise, L2 against decoupled, the
bias corrections' count, the lr schedule's timing, the state lost on resume.
"""

from __future__ import annotations

from dataclasses import replace

from zero_ref.check.oracle_step import OracleState
from zero_ref.check.plan import Plan
from zero_ref.check.record import RunSpec, StepRecord


def decay_on_excluded(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The groups without weight decay (biases, norms) decayed like the others."""
    decays = [g.weight_decay for g in plan.groups]
    if not (0 in decays and max(decays) > 0):
        return []
    wd = max(decays)
    return [
        replace(
            plan, groups=tuple(replace(g, weight_decay=g.weight_decay or wd) for g in plan.groups)
        )
    ]


def decay_missing(spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan) -> list[Plan]:
    """A group's weight decay not applied (each decayed group tried, then all)."""
    decayed = [i for i, g in enumerate(plan.groups) if g.weight_decay > 0]
    sets = [[i] for i in decayed] + ([decayed] if len(decayed) > 1 else [])
    return [_no_decay(plan, s) for s in sets]


def l2_instead_of_decoupled(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """torch.optim.Adam(weight_decay=...) where AdamW was meant: decay added to the gradient."""
    decays = any(g.weight_decay > 0 for g in plan.groups)
    return [replace(plan, optimizer="adam")] if plan.optimizer == "adamw" and decays else []


def decoupled_instead_of_l2(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """AdamW where Adam's L2 decay was meant."""
    decays = any(g.weight_decay > 0 for g in plan.groups)
    return [replace(plan, optimizer="adamw")] if plan.optimizer == "adam" and decays else []


def bias_correction_step_off_by_one(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """Adam's bias corrections with the step count one too high, or one too low."""
    if plan.optimizer == "sgd":
        return []
    variants = [replace(plan, step_offset=1)]
    if all(s.step >= 1 for s in state.params.values()):  # a count of 0 divides by zero
        variants.append(replace(plan, step_offset=-1))
    return variants


def step_counted_without_grad(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """Every parameter's step count advanced at every step, with a gradient or not."""
    behind = any(s.step != state.steps_taken for s in state.params.values())
    return [replace(plan, global_step_count=True)] if plan.optimizer != "sgd" and behind else []


def lr_one_step_early(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The scheduler stepped before the optimizer: step t used the lr meant for t + 1."""
    return _shifted_lr(spec, record, plan, record.step + 1)


def lr_one_step_late(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The scheduler stepped a step late: step t used the lr meant for t - 1."""
    return _shifted_lr(spec, record, plan, record.step - 1)


def state_reset_on_resume(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The optimizer state (moments, buffers, step counts) lost before this step."""
    return [replace(plan, reset_state=True)] if state.steps_taken > 0 else []


def _no_decay(plan: Plan, groups: list[int]) -> Plan:
    return replace(
        plan,
        groups=tuple(
            replace(g, weight_decay=0.0) if i in groups else g for i, g in enumerate(plan.groups)
        ),
    )


def _shifted_lr(spec: RunSpec, record: StepRecord, plan: Plan, step: int) -> list[Plan]:
    schedule = spec.lr_schedule
    if schedule is None or not 1 <= step <= len(schedule):
        return []
    if any(g.initial_lr is None for g in plan.groups):
        return []
    return [
        replace(
            plan,
            groups=tuple(replace(g, lr=g.initial_lr * schedule[step - 1]) for g in plan.groups),
        )
    ]
