"""What rank 0 shows while training: a tqdm bar (step, loss, tokens/s) and a
loss line every --log-every steps; nothing on other ranks.

--quiet removes the progress only. Warnings (config keys that do nothing, unknown
keys) and results the user asked for (the --check-oracle summary) always print."""

from __future__ import annotations

from zero_ref.app.cli import RunConfig


class Console:
    def __init__(self, run: RunConfig, is_root: bool, first_step: int = 0) -> None:
        self.run, self.is_root, self.bar = run, is_root, None
        if is_root and not run.quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=run.steps,
                initial=first_step,  # a resumed run continues the bar
                desc="train",
                unit="step",
                mininterval=0.5,
                dynamic_ncols=True,
                leave=False,
                disable=None,
            )

    def say(self, line: str) -> None:
        """A progress line on rank 0 (not with --quiet)."""
        if not self.run.quiet:
            self.always(line)

    def always(self, line: str) -> None:
        """A line on rank 0 in every mode: warnings, and results asked for."""
        if not self.is_root:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def update(self, r: dict) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{r['loss']:.3f}", tok_s=f"{r['tokens_per_s']:,.0f}", refresh=False
        )
        step = r["step"]
        if r.get("skipped"):
            scale = r.get("loss_scale", 1.0)
            why = f"fp16 overflow at loss scale {scale:g}" if scale != 1.0 else "NaN/Inf gradient"
            self.say(f"step {step}: {why}, step skipped on every rank")
        if (step - 1) % self.run.log_every == 0 or step == self.run.steps:
            line = (
                f"step {step:5d}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  grad norm "
                f"{r['grad_norm']:.3f}  {r['step_time_s'] * 1e3:.1f} ms/step  "
                f"{r['tokens_per_s']:,.0f} tok/s"
            )
            if r.get("loss_scale", 1.0) != 1.0:
                line += f"  loss scale {r['loss_scale']:g}"
            if "oracle_max_abs_diff" in r:
                line += f"  oracle max|diff| {r['oracle_max_abs_diff']:.3g}"
            self.say(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
