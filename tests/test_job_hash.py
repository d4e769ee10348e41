"""The job hash's "configuration" part covers every setting (zero_ref/app/agreement.py).

Ranks configured differently must not train together: any field of the run's
configuration (RunConfig) or of the engine's (ZeroConfig, with its AdamWConfig
and LossScaleConfig inside, and the run's LRSchedule) changed on one rank changes
that rank's "configuration" hash, and the agreement check names "configuration".
The fields are enumerated with dataclasses.fields, recursively, so a field added
later is covered without touching this file.

No field is exempt, on purpose: every rank parses the same command line (the
rank only decides who prints help), so no setting differs per rank by design,
and a difference means ranks launched with different flags (an MPMD mpirun, or
another zero_ref's defaults). Even the paths: the outputs are rank 0's to write,
but a rank told another --export or --nvme-path was launched as another job.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from tests.mpi_pool import mpirun, run_watched
from zero_ref.app.agreement import disagreements, job_parts
from zero_ref.app.cli import parse_args
from zero_ref.testing.replay import ReplayModel

MODEL = ReplayModel([("u0", [("w", (3, 4))]), ("u1", [("b", (5,))])])
TOKENS = np.arange(50, dtype=np.int64) % 7
# Stage 3 with a swap folder: the base from which every offload setting can change
# to another valid value too.
BASE_ARGS = ["--stage", "3", "--nvme-path", "/tmp"]
# Values tried for a str or None field, in order, until one is valid for it (after a
# path to an existing file: --init's file is read to hash it).
WORDS = (
    "fp16", "bf16", "fp32", "nvme", "cpu", "gpu", "yes", "skip", "cosine", "constant", "thread",
    "flat", "x",
)  # fmt: skip


# Settings valid only beside another one (qgZ's bits and hops need qgZ on): a lone change of
# them has no valid value, so test_settings_valid_only_beside_another_are_hashed checks
# them from a base where the other one is on.
ONLY_BESIDE = {
    "quantized_gradient_bits": (["--quantized-gradients"], ["--quantized-gradient-bits", "4"]),
    "quantized_gradient_local_size": (
        ["--quantized-gradients"],
        ["--quantized-gradient-local-size", "world"],
    ),
}


def alternatives(value: object, words: tuple[str, ...]) -> list[object]:
    """Other values a field holding `value` might take (the first valid one is used)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, 2 * value]
    if isinstance(value, float):
        return [value * 2 + 0.5, value / 2, value + 1e-3]
    if isinstance(value, tuple):
        return [(alt, *value[1:]) for alt in alternatives(value[0], words)]
    return [w for w in (*words, 1.0, 1) if w != value]


def replaced(config: object, name: str, value: object) -> object | None:
    """A copy of `config` with field `name` set to `value`, or None if not allowed."""
    try:
        return dataclasses.replace(config, **{name: value})
    except ValueError:
        return None


def changed_configs(config: object, words: tuple[str, ...], path: str = ""):
    """(field path, a copy of `config` with that one field changed to another valid
    value) for every field of the dataclass, nested dataclasses field by field;
    (field path, None) where no candidate value is valid."""
    for f in dataclasses.fields(config):
        value, name = getattr(config, f.name), f"{path}{f.name}"
        if f.name in ONLY_BESIDE:
            continue
        if dataclasses.is_dataclass(value):
            for inner, other in changed_configs(value, words, f"{name}."):
                yield inner, None if other is None else replaced(config, f.name, other)
            continue
        candidates = (replaced(config, f.name, v) for v in alternatives(value, words))
        yield name, next((c for c in candidates if c is not None), None)


def parts(run, zero) -> dict[str, str]:
    return job_parts(run, zero, MODEL, "abcdefg", TOKENS, "test-version")


def two_ranks(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    return disagreements([{"host": "h", "parts": mine}, {"host": "h", "parts": theirs}])


def test_every_setting_on_one_rank_changes_the_configuration_part(tmp_path):
    existing = tmp_path / "file"
    existing.write_bytes(b"an --init file")
    words = (str(existing), *WORDS)
    parsed = parse_args(BASE_ARGS)
    run, zero = parsed.run, parsed.zero
    base = parts(run, zero)
    assert parts(parse_args(BASE_ARGS).run, parse_args(BASE_ARGS).zero) == base  # stable
    checked = []
    for which, config in (("run", run), ("zero", zero)):
        for name, other in changed_configs(config, words):
            assert other is not None, f"no valid other value found for {which}.{name}: add one"
            mine = parts(other, zero) if which == "run" else parts(run, other)
            assert mine["configuration"] != base["configuration"], f"{which}.{name} is not hashed"
            lines = two_ranks(base, mine)
            assert any(line.startswith("configuration: rank 0") for line in lines), lines
            checked.append(f"{which}.{name}")
    # The enumeration reached the fields the issue names, inside the nested configs too.
    for name in (
        "zero.stage",
        "zero.mixed_precision.dtype",
        "zero.bucket_numel",
        "zero.optimizer.lr",
    ):
        assert name in checked
    assert (
        "zero.mixed_precision.loss_scale.hysteresis" in checked
        and "run.lr_schedule.kind" in checked
    )


def test_settings_valid_only_beside_another_are_hashed():
    """qgZ's bits on one rank and not the other (both with qgZ on): the configuration
    part differs, as for every other setting."""
    for name, (beside, changed) in ONLY_BESIDE.items():
        base = parse_args([*BASE_ARGS, *beside])
        other = parse_args([*BASE_ARGS, *beside, *changed])
        assert getattr(base.zero.zeropp, name) != getattr(other.zero.zeropp, name)
        mine, theirs = parts(base.run, base.zero), parts(other.run, other.zero)
        assert mine["configuration"] != theirs["configuration"], f"zero.{name} is not hashed"


def test_equal_settings_built_apart_hash_alike():
    """Two ranks parse the flags each for itself: the same flags, the same hash, whatever
    the order they were given in."""
    a = parse_args(["--stage", "1", "--precision", "bf16", "--clip", "1.0"])
    b = parse_args(["--clip", "1.0", "--precision", "bf16", "--stage", "1"])
    assert parts(a.run, a.zero) == parts(b.run, b.zero)
    assert two_ranks(parts(a.run, a.zero), parts(b.run, b.zero)) == []


TRAIN = ["-m", "zero_ref.train", "--model", "mlp", "--steps", "2", "--quiet", "--sample-chars", "0"]


def test_a_rank_with_another_engine_setting_stops_before_training():
    """End to end, an engine setting that would train silently otherwise (AdamW's weight
    decay on one rank): exit 2 naming only "configuration", no step taken."""
    args_1 = [*TRAIN, "--weight-decay", "0.5"]
    cmd = [mpirun(), "-n", "1", sys.executable, *TRAIN, ":", "-n", "1", sys.executable, *args_1]
    job = run_watched(cmd)
    assert job.returncode == 2, job.stderr[-3000:]
    assert "configuration: rank 0 (host " in job.stderr, job.stderr[-3000:]
    for part in ("corpus", "vocabulary", "initial parameters", "zero_ref version"):
        assert f"{part}:" not in job.stderr
    assert "step" not in job.stdout
