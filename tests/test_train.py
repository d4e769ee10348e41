"""End to end: `mpirun -n W python -m zero_ref.train` trains, logs, exports and
reports, and bad input ends with one clear message before training starts.

No test limits a run's total time tightly: how fast it goes depends on what else
loads the machine (the 200-step run takes 17 s idle, 148 s loaded). A run fails
for making no progress (tests/mpi_pool.py: no output line for minutes), so the
long runs print a line every step."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.mpi_pool import REPO, Finished, mpirun_command, run_watched
from zero_ref.io.tensor_io import load_named

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife.\n" * 20
)


def train_mlp(world: int, *flags: str) -> Finished:
    return train(world, "--model", "mlp", *flags)


def train(world: int, *flags: str) -> Finished:
    return run_watched(mpirun_command(world, "-m", "zero_ref.train", *flags))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(TEXT)
    return str(path)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_trains_logs_and_exports(stage, corpus, tmp_path):
    log, out = tmp_path / "run.jsonl", tmp_path / "final.safetensors"
    p = train_mlp(
        2,
        "--stage",
        str(stage),
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--data",
        corpus,
        "--log-every",
        "1",
        "--log-jsonl",
        str(log),
        "--export",
        str(out),
        "--sample-chars",
        "20",
        "--d-hidden",
        "16",
        "--bucket-numel",
        "100",
    )
    assert p.returncode == 0, p.stderr
    assert f"stage {stage}, 2 ranks" in p.stdout and "sample:" in p.stdout
    assert "formula for this stage" in p.stdout and "paper (Sec. 7)" in p.stdout
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records[:-1]] == [1, 2, 3, 4, 5, 6]
    assert all({"loss", "grad_norm", "sent_bytes"} <= set(r) for r in records[:-1])
    assert records[-1]["final"] and [r["rank"] for r in records[-1]["ranks"]] == [0, 1]
    params = load_named(out)
    assert set(params) == {
        "embed.table",
        "hidden.weight",
        "hidden.bias",
        "output.weight",
        "output.bias",
    }


def test_deterministic_runs_match_across_world_sizes_given_same_init(corpus, tmp_path):
    """--init fixes the start; with one micro-batch per rank the data differ per world
    size, so compare stage 0 and stage 3 at the same world size bitwise instead."""
    init = tmp_path / "init.npz"
    first = train_mlp(
        1,
        "--steps",
        "1",
        "--data",
        corpus,
        "--batch-size",
        "4",
        "--export",
        str(tmp_path / "a.safetensors"),
        "--d-hidden",
        "16",
        "--sample-chars",
        "0",
    )
    assert first.returncode == 0, first.stderr
    np.savez(init, **load_named(tmp_path / "a.safetensors"))
    outs = []
    for stage in (0, 3):
        out = tmp_path / f"s{stage}.safetensors"
        p = train_mlp(
            3,
            "--stage",
            str(stage),
            "--deterministic",
            "--init",
            str(init),
            "--steps",
            "3",
            "--batch-size",
            "6",
            "--data",
            corpus,
            "--export",
            str(out),
            "--d-hidden",
            "16",
            "--sample-chars",
            "0",
        )
        assert p.returncode == 0, p.stderr
        outs.append(load_named(out))
    for name in outs[0]:
        assert np.array_equal(outs[0][name].view(np.uint32), outs[1][name].view(np.uint32))


def test_default_model_loss_falls_at_four_ranks():
    # a line every step: progress the watcher sees, however loaded the machine
    p = train_mlp(4, "--steps", "200", "--log-every", "1", "--sample-chars", "0")
    assert p.returncode == 0, p.stderr
    losses = [
        float(line.split("loss")[1].split()[0])
        for line in p.stdout.splitlines()
        if line.startswith("step")
    ]
    assert losses[0] > 4.0 and losses[-1] < 2.8, losses


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-size", "9"], "batch size 9 (--batch-size / train_batch_size) does not split"),
        (["--steps", "0"], "--steps 0 is not allowed"),
        (["--lr", "-1"], "lr=-1.0 is not allowed"),
        (["--init", "missing.npz"], "missing.npz: no such file"),
        (["--data", "/nonexistent/file.txt"], "does not exist"),
    ],
)
def test_bad_input_gives_one_clear_message(flags, message):
    p = train(2, "--steps", "2", *flags)
    assert p.returncode != 0
    assert p.stderr.count(message) == 1, p.stderr
    assert "Traceback" not in p.stderr


TINY_GPT_MODEL = [
    "--model",
    "gpt",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--d-model",
    "8",
    "--context",
    "6",
    "--sample-chars",
    "10",
    "--log-every",
    "1",
]
TINY_GPT = [*TINY_GPT_MODEL, "--batch-size", "8"]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gpt_check_oracle_is_zero_in_deterministic_mode(stage, world, corpus, tmp_path):
    log = tmp_path / "gpt.jsonl"
    p = train(
        world,
        *TINY_GPT,
        "--stage",
        str(stage),
        "--steps",
        "3",
        "--deterministic",
        "--check-oracle",
        "--data",
        corpus,
        "--log-jsonl",
        str(log),
        "--grad-accum",
        "2",
        "--bucket-numel",
        "64",
    )
    assert p.returncode == 0, p.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()][:-1]
    assert [r["oracle_max_abs_diff"] for r in records] == [0.0, 0.0, 0.0]
    assert p.stdout.count("oracle max|diff| 0") == 3
    assert all(r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and "lr" in r for r in records)


def test_config_file_and_plot(corpus, tmp_path):
    logs = []
    for stage in (0, 3):
        log = tmp_path / f"stage{stage}.jsonl"
        p = train(
            2,
            *TINY_GPT_MODEL,
            "--config",
            str(REPO / "docs" / "configs" / f"stage{stage}.json"),
            "--steps",
            "2",
            "--data",
            corpus,
            "--log-jsonl",
            str(log),
            "--quiet",
        )
        assert p.returncode == 0, p.stderr
        assert json.loads(log.read_text().splitlines()[-1])["stage"] == stage
        logs.append(str(log))
    out = tmp_path / "img" / "run"
    plot = run_watched(
        [sys.executable, str(REPO / "scripts" / "docs" / "plot_run.py"), *logs, "--out", str(out)]
    )
    assert plot.returncode == 0, plot.stderr
    for kind in ("loss", "memory", "comm"):
        assert (tmp_path / "img" / f"run_{kind}.png").stat().st_size > 1000


def test_print_params_lists_names_and_total():
    p = train(
        1,
        "--model",
        "gpt",
        "--print-params",
        "--n-layer",
        "1",
        "--d-model",
        "8",
        "--n-head",
        "2",
    )
    assert p.returncode == 0, p.stderr
    assert "block0.attn.qkv.weight" in p.stdout and "(8, 24)" in p.stdout
    assert p.stdout.strip().splitlines()[-1].startswith("total")


def test_help_is_printed_once():
    p = train(2, "--help")
    assert p.returncode == 0
    assert p.stdout.count("usage:") == 1 and "--deterministic" in p.stdout


def test_a_figure_with_bars_above_its_axes_is_refused():
    """The old memory figure shared one y-axis whose limit came from stage 3's panel,
    cutting off stages 0-2: scripts/docs/plot_run.py's check finds exactly that."""
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = importlib.util.spec_from_file_location(
        "plot_run", REPO / "scripts" / "docs" / "plot_run.py"
    )
    plot_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_run)
    fig, axes = plt.subplots(1, 2, sharey=True)
    axes[0].bar([0, 1], [1.79, 1.79])
    axes[0].set_title("stage 0")
    axes[1].bar([0, 1], [0.73, 0.73])
    axes[1].set_ylim(0, 0.8)  # the last panel's limit wins for both
    assert any("stage 0" in p for p in plot_run.outside_axes(fig))
    axes[1].set_ylim(0, 2.0)
    axes[1].axhline(1.5)
    assert plot_run.outside_axes(fig) == []
    plt.close(fig)
