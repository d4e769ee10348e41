"""The command line of `python -m zero_ref.train`: flags -> validated configs.

Only this module knows about argparse; the engine sees frozen dataclasses.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from zero_ref.config import AdamWConfig, ZeroConfig


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs besides the engine's ZeroConfig."""

    model: str
    data: str | None
    steps: int
    batch_size: int  # global: micro batch x grad_accum x world size
    seed: int
    log_every: int
    init: str | None
    export: str | None
    log_jsonl: str | None
    context: int
    d_embed: int
    d_hidden: int
    sample_chars: int

    def micro_batch_size(self, world_size: int, grad_accum: int) -> int:
        """batch_size / (grad_accum * world_size), which must divide evenly."""
        per = grad_accum * world_size
        if self.batch_size % per:
            raise ValueError(
                f"--batch-size {self.batch_size} does not split over --grad-accum {grad_accum} x "
                f"{world_size} ranks: it must be a multiple of {per}"
            )
        return self.batch_size // per


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m zero_ref.train",
        description="Train a character-level language model with ZeRO over MPI "
        "(run with: mpirun -n 4 python -m zero_ref.train).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    z = p.add_argument_group("ZeRO engine")
    z.add_argument(
        "--stage",
        type=int,
        default=2,
        choices=[0, 1, 2, 3],
        help="0: data parallel; 1: +optimizer state sharded; 2: +gradients "
        "sharded; 3: +parameters sharded",
    )
    z.add_argument(
        "--bucket-numel",
        type=int,
        default=8192,
        help="elements per gradient reduce-scatter bucket (stages 2-3)",
    )
    z.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-steps whose gradients are summed before each update",
    )
    z.add_argument(
        "--clip", type=float, default=1.0, help="max global gradient norm; 0 turns clipping off"
    )
    z.add_argument(
        "--deterministic",
        action="store_true",
        help="reduce in rank order: parameters bitwise equal to the single-rank "
        "oracle (slower; see docs/determinism.md)",
    )
    o = p.add_argument_group("optimizer (AdamW)")
    o.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    o.add_argument("--weight-decay", type=float, default=0.01, help="decoupled weight decay")
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    r.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="global batch: micro batch x grad-accum x world size",
    )
    r.add_argument("--seed", type=int, default=0, help="seed for initial weights and batches")
    r.add_argument(
        "--data",
        default=None,
        help="UTF-8 text file to train on (default: the Python language reference "
        "shipped with CPython, pydoc_data.topics)",
    )
    r.add_argument("--log-every", type=int, default=100, help="print the loss every N steps")
    r.add_argument(
        "--sample-chars", type=int, default=200, help="characters to generate at the end (0: none)"
    )
    f = p.add_argument_group("files")
    f.add_argument("--init", default=None, help="named initial parameters (.npz or .safetensors)")
    f.add_argument(
        "--export", default=None, help="write consolidated final parameters here (.safetensors)"
    )
    f.add_argument(
        "--log-jsonl",
        default=None,
        help="one JSON object per step (step, loss, ...); the last holds every "
        "rank's memory and communication ledger",
    )
    m = p.add_argument_group("model (character MLP)")
    m.add_argument("--model", default="mlp", choices=["mlp"], help="model to train")
    m.add_argument("--context", type=int, default=8, help="characters of context")
    m.add_argument("--d-embed", type=int, default=16, help="embedding width per character")
    m.add_argument("--d-hidden", type=int, default=256, help="hidden layer width")
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[RunConfig, ZeroConfig]:
    """Flags -> (RunConfig, ZeroConfig); bad values raise ValueError naming the flag."""
    a = build_parser().parse_args(argv)
    _positive(
        a,
        "steps",
        "batch_size",
        "log_every",
        "context",
        "d_embed",
        "d_hidden",
        "bucket_numel",
        "grad_accum",
    )
    _non_negative(a, "seed", "sample_chars", "clip")
    try:
        optimizer = AdamWConfig(lr=a.lr, weight_decay=a.weight_decay)
        zero = ZeroConfig(
            stage=a.stage,
            bucket_numel=a.bucket_numel,
            grad_accum=a.grad_accum,
            clip=a.clip or None,
            deterministic=a.deterministic,
            optimizer=optimizer,
        )
    except ValueError as e:
        raise ValueError(f"bad flag value: {e}") from e
    run = RunConfig(
        model=a.model,
        data=a.data,
        steps=a.steps,
        batch_size=a.batch_size,
        seed=a.seed,
        log_every=a.log_every,
        init=a.init,
        export=a.export,
        log_jsonl=a.log_jsonl,
        context=a.context,
        d_embed=a.d_embed,
        d_hidden=a.d_hidden,
        sample_chars=a.sample_chars,
    )
    return run, zero


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(a: argparse.Namespace, *names: str) -> None:
    for n in names:
        if getattr(a, n) < 1:
            raise ValueError(f"{_flag(n)} {getattr(a, n)} is not allowed: it must be >= 1")


def _non_negative(a: argparse.Namespace, *names: str) -> None:
    for n in names:
        if getattr(a, n) < 0:
            raise ValueError(f"{_flag(n)} {getattr(a, n)} is not allowed: it must be >= 0")
