"""What the estimate says to a person: the refusal of a run that cannot fit, naming the
flags that lower it, and the per-stage table of `python -m zero_ref.app.estimate`.

The numbers come from zero_ref/app/rank_estimate.py; this module only words them.
"""

from __future__ import annotations

from zero_ref.app.cli import Parsed, UsageError
from zero_ref.app.process_memory import mem_available_bytes
from zero_ref.app.rank_estimate import RankEstimate, estimate_for
from zero_ref.models.gpt import GPT
from zero_ref.models.unit import Model


def human(nbytes: float) -> str:
    """Bytes in the largest unit that keeps the number >= 1: 1.16 TiB, 5.47 GiB, 812 MiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def check_fits(
    parsed: Parsed, model: Model, world: int, ranks_on_host: int, mem_available: int | None = None
) -> RankEstimate:
    """Refuse, with one UsageError naming the numbers and the flags that lower them, a
    run whose estimated peak per rank exceeds the host's available memory shared by
    its ranks. mem_available: the host's bytes (None: read now; a host that does not
    say is not checked). Returns the estimate of a run that fits."""
    est = estimate_for(parsed, model, world)
    available = mem_available_bytes() if mem_available is None else mem_available
    ranks = max(1, ranks_on_host)
    if available is None or est.total <= available // ranks:
        return est
    run = parsed.run
    message = (
        f"this run needs about {human(est.total)} per rank at stage {est.stage} (model states "
        f"{human(est.model_states)}, activations {human(est.activations)} for "
        f"{_micro_batch_words(run, model)}, overhead {human(est.overhead)}), but each of the "
        f"{ranks} ranks on this host has {human(available / ranks)} (MemAvailable "
        f"{human(available)} / {ranks}). To need less: {'; '.join(_remedies(parsed, model, est))}."
    )
    raise UsageError(message)


def _micro_batch_words(run, model: Model) -> str:
    if isinstance(model, GPT):
        return f"a micro-batch of {run.micro_batch_size} x {run.context} characters"
    return f"a micro-batch of {run.micro_batch_size} windows of {run.context} characters"


def _remedies(parsed: Parsed, model: Model, est: RankEstimate) -> list[str]:
    """The flags that lower the estimate, those of its larger part first."""
    run = parsed.run
    width = "--d-model, --n-layer" if isinstance(model, GPT) else "--d-hidden, --d-embed"
    activations = [
        f"a smaller --micro-batch-size (now {run.micro_batch_size}), or --batch-size "
        f"(now {run.batch_size}) with more --grad-accum",
        f"a shorter --context (now {run.context})",
    ]
    states = [f"a smaller model ({width})", "more ranks, on more hosts"]
    if est.stage < 3:
        stage3 = estimate_for(parsed, model, est.world, stage=3)
        states.insert(0, f"--stage 3 (about {human(stage3.total)} per rank)")
    return activations + states if est.activations >= est.model_states else states + activations


def estimate_table(parsed: Parsed, model: Model, world: int, available: int | None) -> str:
    """Every stage's estimate for these flags, and what fits in `available` bytes a rank."""
    run, zero = parsed.run, parsed.zero
    ests = [estimate_for(parsed, model, world, stage=s) for s in range(4)]
    lines = [
        f"memory per rank for {run.model}: {ests[0].numel:,} parameters ({ests[0].padded_numel:,}"
        f" padded for {world} ranks), micro-batch {run.micro_batch_size}, context {run.context}"
        f", grad-accum {zero.grad_accum}, bucket {zero.bucket_numel:,} elements",
        f"memory available per rank: {'unknown' if available is None else human(available)}",
        f"{'stage':>6}{'params':>10}{'grads':>10}{'optimizer':>10}{'buffers':>10}"
        f"{'activations':>12}{'overhead':>10}{'total':>10}{'B/param':>10}  fits  largest model",
    ]
    for est in ests:
        cells = [est.params, est.grads, est.optimizer, est.buffers, est.activations]
        lines.append(
            f"{est.stage:>5}{'*' if est.stage == zero.stage else ' '}"
            + "".join(f"{human(b):>10}" for b in cells[:4])
            + f"{human(cells[4]):>12}{human(est.overhead):>10}{human(est.total):>10}"
            + f"{est.per_param(est.total):>10.4g}  {_fits(est, available)}"
        )
    lines.append(
        "*: the stage of these flags. largest model: the parameters whose model states "
        "would fit beside these activations (extrapolated at this stage's bytes/param)."
    )
    return "\n".join(lines)


def _fits(est: RankEstimate, available: int | None) -> str:
    if available is None:
        return "   ?"
    largest = (available - est.activations - est.overhead) / est.per_param(est.model_states)
    count = f"{largest / 1e9:.3g}B" if largest >= 1e9 else f"{largest / 1e6:.3g}M"
    return f"{'yes' if est.total <= available else 'no':>4}  {count if largest >= 1e6 else '-'}"
