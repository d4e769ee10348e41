"""A data-parallel training loop in float32 NumPy, torch's conventions, for zero_ref.check's tests.

It writes the StepRecords a watcher would (micro-step gradients before the reduction, the
loss factor the backward applied, the gradient at optimizer.step, the parameters after),
and takes `bugs`, a set of the catalogue's names, to run the loop the way each bug does.
Gradients are random (the checker takes the run's gradients as given, so they need not come
from a model); everything else is computed as a torch loop would, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zero_ref.check.record import GroupSettings, RunSpec, ScalerSpec, StepRecord

F = np.float32


@dataclass
class SimRun:
    """Settings of the simulated loop; `bugs` names the catalogue's bugs to commit."""

    world: int = 2
    accum: int = 3
    optimizer: str = "adamw"
    clip: float | None = 0.5
    lr: float = 1e-2
    weight_decay: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    dampening: float = 0.0
    scaler: bool = False
    growth_interval: int = 3
    overflow_steps: tuple[int, ...] = ()
    no_grad_steps: dict[int, str] = field(default_factory=dict)  # step -> a name with no grad
    schedule: tuple[float, ...] | None = None
    bugs: frozenset[str] = frozenset()
    normalization: str = "mean"  # the user's declared loss; "weighted": by token counts
    reduce_dtype: str = "float32"  # "bfloat16": the all-reduce rounds to bf16 (FSDP2's policy)
    declare_reduce_dtype: str | None = None  # what the spec says (None: reduce_dtype)
    resume_at: int | None = None  # for state_reset_on_resume
    seed: int = 0
    shapes: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"w1": (7, 5), "b1": (7,), "w2": (3, 7), "b2": (3,)}
    )

    def groups(self, lr_factor: float, lr_base: float) -> tuple[GroupSettings, ...]:
        decayed = tuple(k for k in self.shapes if k.startswith("w"))
        plain = tuple(k for k in self.shapes if not k.startswith("w"))
        common = dict(
            momentum=self.momentum if self.optimizer == "sgd" else 0.0,
            nesterov=self.nesterov,
            dampening=self.dampening,
            initial_lr=lr_base,
        )
        lr = lr_base * lr_factor
        return (
            GroupSettings(decayed, lr, self.weight_decay, **common),
            GroupSettings(plain, lr, 0.0, **common),
        )

    def spec(self) -> RunSpec:
        return RunSpec(
            world=self.world,
            optimizer=self.optimizer,
            names=tuple(self.shapes),
            shapes=dict(self.shapes),
            clip_max_norm=self.clip,
            scaler=ScalerSpec(growth_interval=self.growth_interval) if self.scaler else None,
            lr_schedule=self.schedule,
            normalization=self.normalization,
            reduce_dtype=self.declare_reduce_dtype or self.reduce_dtype,
        )


def initial_params(run: SimRun) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(run.seed + 1000)
    return {k: rng.standard_normal(s).astype(F) for k, s in run.shapes.items()}


def simulate(run: SimRun, steps: int):
    """Yield the StepRecords of `steps` optimizer steps of the loop `run` describes."""
    rng = np.random.default_rng(run.seed)
    params = initial_params(run)
    state: dict[str, dict] = {k: {} for k in params}
    leftover = {k: np.zeros(s, F) for k, s in run.shapes.items()}  # .grad after zero_grad
    scale, tracker = F(2.0**10), 0
    a, n = run.accum, run.world
    for step in range(1, steps + 1):
        if run.resume_at == step and "state_reset_on_resume" in run.bugs:
            state = {k: {} for k in params}
        lr_factor = 1.0 if run.schedule is None else run.schedule[_lr_index(run, step) - 1]
        groups = run.groups(lr_factor, run.lr)
        missing = run.no_grad_steps.get(step)
        weights, c = _loss_factors(run, rng)
        if run.scaler:
            c = [[F(x * scale) for x in row] for row in c]
        micro = [[_grads(run, rng, missing, c[j][r], step, j) for r in range(n)] for j in range(a)]
        acc = _reduce(run, micro, leftover)
        found_inf = run.scaler and not all(np.isfinite(g).all() for g in acc.values())
        applied, norm = _unscale_and_clip(run, acc, scale, tracker, found_inf)
        if not found_inf:
            _optimizer_step(run, groups, params, state, applied, step)
        record = StepRecord(
            step=step,
            micro_grads=micro,
            loss_grad=[[float(x) for x in row] for row in c],
            weights=weights,
            groups=groups,
            applied_grads={} if found_inf else applied,
            params_after={k: v.copy() for k, v in params.items()},
            scale=float(scale) if run.scaler else None,
            skipped=bool(found_inf),
            reported_norm=norm,
            extra={"shards": _shards(run)},
        )
        if "grads_not_zeroed" not in run.bugs:
            leftover = {k: np.zeros(s, F) for k, s in run.shapes.items()}
        else:  # .grad as the step left it: unscaled and clipped in place
            leftover = {k: applied.get(k, np.zeros(s, F)).copy() for k, s in run.shapes.items()}
        if run.scaler:
            scale, tracker = _scaler_update(run, scale, tracker, found_inf)
        yield record


def _lr_index(run: SimRun, step: int) -> int:
    if "lr_one_step_early" in run.bugs:
        return min(step + 1, len(run.schedule))
    if "lr_one_step_late" in run.bugs:
        return max(step - 1, 1)
    return step


def _loss_factors(run: SimRun, rng) -> tuple[list | None, list[list]]:
    """The weights the user declares and the factor c[j][r] their backward applies.

    mean: (loss / A).backward(), DDP averages over ranks. sum: loss.backward(), and the
    reduction sums (no division anywhere). weighted: each micro-batch's mean loss times
    tokens[j][r] * N / total tokens (the N undoes DDP's mean), the global token mean;
    the bug token_mean_per_micro_batch divides by A instead, as if tokens were equal."""
    a, n = run.accum, run.world
    if run.normalization == "sum":
        return None, [[F(1.0)] * n for _ in range(a)]
    if run.normalization == "mean" or "token_mean_per_micro_batch" in run.bugs:
        tokens = rng.integers(1, 50, size=(a, n)) if run.normalization == "weighted" else None
        weights = None if tokens is None else (tokens / tokens.sum()).tolist()
        return weights, [[F(1.0 / a)] * n for _ in range(a)]
    tokens = rng.integers(1, 50, size=(a, n))
    weights = tokens / tokens.sum()
    return weights.tolist(), [[F(w * n) for w in row] for row in weights]


def _grads(run, rng, missing, c, step, j) -> dict[str, np.ndarray]:
    """One rank's backward of c * L: the gradient of L times c, in float32."""
    out = {}
    for k, s in run.shapes.items():
        if k == missing:
            continue
        g = (rng.standard_normal(s) * (1 + 0.1 * step)).astype(F)
        if step in run.overflow_steps and k == "w1":
            g[0, 0] = np.inf
        out[k] = (g * c).astype(F)
    return out


def _reduce(run, micro, leftover) -> dict[str, np.ndarray]:
    """Accumulate micro-steps into .grad, then DDP's all-reduce mean (rank order here)."""
    a, n = run.accum, run.world
    per_rank = []
    for r in range(n):
        g = {k: leftover[k].copy() for k in run.shapes}
        for j in range(a):
            if "micro_batch_dropped" in run.bugs and j == 1:
                continue
            for k, x in micro[j][r].items():
                if "accumulation_not_divided" in run.bugs:
                    x = x * F(a)
                g[k] = x.copy() if "micro_steps_overwritten" in run.bugs else g[k] + x
                if "micro_batch_counted_twice" in run.bugs and j == 0:
                    g[k] = g[k] + x
        if "accumulation_divided_twice" in run.bugs:
            g = {k: v / F(a) for k, v in g.items()}
        if "clip_before_reduction" in run.bugs:
            coef = F(min(1.0, run.clip / (_norm(g) + 1e-6)))
            g = {k: v * coef for k, v in g.items()}
        per_rank.append(g)
    produced = {k for ranks in micro for grads in ranks for k in grads} | set(
        leftover_names(leftover)
    )
    wire = _bf16 if run.reduce_dtype == "bfloat16" else (lambda x: x)
    total = {}
    for k in produced:  # rank order, every partial sum rounded to the wire's dtype
        total[k] = wire(per_rank[0][k])
        for r in range(1, n):
            total[k] = wire(total[k] + wire(per_rank[r][k]))
    if "world_not_divided" in run.bugs or run.normalization == "sum":
        return total
    div = F(n * n) if "world_divided_twice" in run.bugs else F(n)
    return {k: wire((v / div).astype(F)) for k, v in total.items()}


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32, round to nearest even (finite values)."""
    bits = np.ascontiguousarray(x, F).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(F).reshape(np.shape(x))


def leftover_names(leftover: dict[str, np.ndarray]) -> list[str]:
    """The names whose .grad a skipped zero_grad left non-zero."""
    return [k for k, v in leftover.items() if np.any(v)]


def _norm(g: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(v.astype(F) ** 2, dtype=F) for v in g.values())))


def _unscale_and_clip(run, acc, scale, tracker, found_inf):
    g = dict(acc)
    if "clip_before_unscale" in run.bugs and not found_inf:  # clip_grad_norm_ on scaled grads
        norm = _norm(g)
        coef = F(min(1.0, run.clip / (norm + 1e-6)))
        g = {k: (v * coef).astype(F) for k, v in g.items()}
        inv = F(1.0) / F(scale)
        return {k: (v * inv).astype(F) for k, v in g.items()}, norm
    if run.scaler:
        used = scale
        if "unscale_with_updated_scale" in run.bugs:
            used, _ = _scaler_update(run, scale, tracker, found_inf)
        inv = F(1.0) / F(used)
        g = {k: (v * inv).astype(F) for k, v in g.items()}
    if run.clip is None or found_inf or "clip_before_reduction" in run.bugs:
        return g, None
    if "clip_local_norm" in run.bugs:
        return _clip_by_shard(run, g), None
    norm = _norm(g)
    coef = F(min(1.0, run.clip / (norm + 1e-6)))
    return {k: (v * coef).astype(F) for k, v in g.items()}, norm


def _shards(run) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for k, s in run.shapes.items():
        numel = int(np.prod(s))
        per = -(-numel // run.world)
        out[k] = [(min(r * per, numel), min((r + 1) * per, numel)) for r in range(run.world)]
    return out


def _clip_by_shard(run, g):
    shards = _shards(run)
    flat = {k: v.ravel().copy() for k, v in g.items()}
    for r in range(run.world):
        own = {k: flat[k][slice(*shards[k][r])] for k in flat}
        coef = F(min(1.0, run.clip / (_norm(own) + 1e-6)))
        for k in flat:
            flat[k][slice(*shards[k][r])] *= coef
    return {k: flat[k].reshape(g[k].shape) for k in flat}


def _optimizer_step(run, groups, params, state, applied, step):
    for group in groups:
        wd = group.weight_decay
        if "decay_on_excluded" in run.bugs:
            wd = run.weight_decay
        if "decay_missing" in run.bugs:
            wd = 0.0
        for k in group.names:
            if k not in applied:
                if "step_counted_without_grad" in run.bugs and "step" in state[k]:
                    state[k]["step"] += 1
                continue
            _param_step(run, group, wd, params, state[k], k, applied[k], step)


def _param_step(run, group, wd, params, st, k, g, step):
    p, lr = params[k], F(group.lr)
    if run.optimizer == "sgd":
        d = g + F(wd) * p if wd else g
        if group.momentum:
            if "buf" not in st:
                st["buf"] = d.copy()
            else:
                st["buf"] = st["buf"] * F(group.momentum) + F(1 - group.dampening) * d
            d = d + F(group.momentum) * st["buf"] if group.nesterov else st["buf"]
        params[k] = (p - lr * d).astype(F)
        return
    b1, b2 = group.betas
    decoupled = run.optimizer == "adamw"
    if "l2_instead_of_decoupled" in run.bugs:
        decoupled = False
    if "decoupled_instead_of_l2" in run.bugs:
        decoupled = True
    st.setdefault("m", np.zeros_like(p))
    st.setdefault("v", np.zeros_like(p))
    st["step"] = st.get("step", 0) + 1
    t = st["step"] + (1 if "bias_correction_step_off_by_one" in run.bugs else 0)
    if wd and decoupled:
        p = (p * F(1 - group.lr * wd)).astype(F)
    elif wd:
        g = (g + F(wd) * p).astype(F)
    st["m"] = (st["m"] + F(1 - b1) * (g - st["m"])).astype(F)
    st["v"] = (st["v"] * F(b2) + F(1 - b2) * g * g).astype(F)
    step_size = group.lr / (1 - b1**t)
    denom = (np.sqrt(st["v"]) / F((1 - b2**t) ** 0.5) + F(group.eps)).astype(F)
    params[k] = (p - F(step_size) * st["m"] / denom).astype(F)


def _scaler_update(run, scale, tracker, found_inf):
    if found_inf:
        return F(scale * F(0.5)), 0
    if tracker + 1 == run.growth_interval:
        return F(scale * F(2.0)), 0
    return scale, tracker + 1
