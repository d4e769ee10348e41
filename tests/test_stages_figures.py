"""docs/stages.md's figures of precision, offload, checkpoints and the GPU path, redrawn
from small runs of the commands the page gives: each figure must have nothing outside
its axes (scripts/docs/plot_run.py's outside_axes), and the bytes it shows must be the
run's own (its --log-jsonl ledger, its swap files, its checkpoint's layout)."""

from __future__ import annotations

import json

import pytest

from tests.mpi_pool import mpi_env, mpirun_command, run_watched
from tests.tiny_gpt import TINY_GPT


@pytest.fixture
def scripts():
    """The plotting scripts as modules (each imports scripts.docs.plot_run)."""
    from scripts.docs import plot_checkpoint, plot_run, plot_trace

    return plot_run, plot_trace, plot_checkpoint


def job(world: int, *args: str, env: dict[str, str] | None = None) -> str:
    """mpirun of `args` on `world` ranks from the repository; its stdout."""
    p = run_watched(mpirun_command(world, *args), env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def drawn(scripts, specs: list[str], out, order: bool = False) -> dict:
    """figure() of plot_trace, checked for bars outside their axes and saved."""
    plot_run, plot_trace, _ = scripts
    fig, summary = plot_trace.figure(specs, order)
    assert plot_run.outside_axes(fig) == []
    plot_run.save(fig, out)
    assert out.stat().st_size > 0
    return summary


def test_precision_figure_shows_a_skipped_fp16_step(scripts, tiny_corpus, tmp_path):
    """fp16 at 2^40: every step overflows and is skipped. The figure says so from the
    log beside the trace, and its skipped step has the NaN/Inf search and no
    all-gather (nothing was updated); the bytes it shows are the ledger's."""
    trace = tmp_path / "trace_fp16.json"
    job(
        2, "-m", "zero_ref.train", *TINY_GPT, "--data", tiny_corpus, "--stage", "2",
        "--precision", "fp16", "--initial-scale-power", "40", "--steps", "2",
        "--trace", str(trace), "--log-jsonl", str(tmp_path / "trace_fp16.jsonl"),
    )  # fmt: skip
    summary = drawn(scripts, [f"{trace}:1", str(trace)], tmp_path / "precision.png")
    _, plot_trace, _ = scripts
    fig, _ = plot_trace.figure([f"{trace}:1"])
    assert "skipped, loss scale 1,099,511,627,776" in fig.axes[0].get_title()
    sent = summary["trace_fp16:last"]["sent"]
    assert "nonfinite" in sent and "allgather" not in sent
    events = json.loads(trace.read_text())["traceEvents"]
    updates = [e for e in events if e.get("pid") == 0 and e.get("cat") == "optimizer"]
    assert [(e["name"], e["args"]["skipped"]) for e in updates] == [
        ("optimizer step 1", True),
        ("optimizer step 2", True),
    ]  # named after the step tried, though the optimizer's count stays at 0
    final = json.loads((tmp_path / "trace_fp16.jsonl").read_text().splitlines()[-1])
    ledger = final["ranks"][0]["comm_last_step"]
    assert sent == {kind: v["sent_bytes"] for kind, v in ledger.items()}


def test_offload_figure_shows_every_swap_read_and_write(scripts, tiny_corpus, tmp_path):
    """The trainer's --trace of an offloaded run: the swap lanes of the last step hold
    exactly the bytes the swap files moved in a step (their own count, on the trace),
    which are master, m, v (12 bytes each) and the bf16 gradient read (2): the ledger's
    optimizer and grads bytes on disk, with no parameters, gradients or optimizer
    state in RAM; the files' count also holds the gradient backward wrote."""
    (tmp_path / "nvme").mkdir()
    trace, log = tmp_path / "trace_offload.json", tmp_path / "trace_offload.jsonl"
    job(
        2, "-m", "zero_ref.train", *TINY_GPT, "--data", tiny_corpus, "--stage", "3",
        "--precision", "bf16", "--steps", "2", "--offload-optimizer", "nvme",
        "--offload-param", "nvme", "--nvme-path", str(tmp_path / "nvme"),
        "--sub-group-size", "100", "--trace", str(trace), "--log-jsonl", str(log),
    )  # fmt: skip
    summary = drawn(scripts, [str(trace), f"{trace}:optimizer"], tmp_path / "offload.png")
    swap = summary["trace_offload:last"]["swap"]
    events = json.loads(trace.read_text())["traceEvents"]
    counted = [e["args"] for e in events if e.get("pid") == 0 and e["name"] == "swap file bytes"]
    held = json.loads(log.read_text().splitlines()[-1])["ranks"][0]
    grads = held["disk_bytes"]["grads"]  # written by backward as the buckets landed
    assert swap == {
        "swap reads": counted[-1]["read"] - counted[-2]["read"],
        "swap writes": counted[-1]["written"] - counted[-2]["written"] - grads,
    }
    assert swap["swap reads"] == held["disk_bytes"]["optimizer"] + grads
    assert held["memory_bytes"]["optimizer"] == held["memory_bytes"]["params"] == 0
    assert held["memory_bytes"]["grads"] == 0
    assert summary["trace_offload:last:optimizer"]["swap"] == swap


def test_checkpoint_figure_shows_each_new_rank_reading_its_slices(scripts, tiny_corpus, tmp_path):
    """Saved by 2 ranks, resumed by 3 at stage 3 (--resume --trace): each unit's real
    elements are read exactly once per kind over the new ranks, from the old rank
    whose slice holds them."""
    ckpt, reads = tmp_path / "ckpt", tmp_path / "resume_stage3.json"
    flags = [*TINY_GPT, "--data", tiny_corpus, "--stage", "3"]
    job(2, "-m", "zero_ref.train", *flags, "--steps", "1", "--save-dir", str(ckpt))
    resume = ["--resume", str(ckpt), "--batch-size", "3", "--steps", "2", "--trace", str(reads)]
    job(3, "-m", "zero_ref.train", *flags, *resume)
    plot_run, _, plot_checkpoint = scripts
    fig = plot_checkpoint.figure([reads])
    assert plot_run.outside_axes(fig) == []
    plot_run.save(fig, tmp_path / "checkpoint.png")
    record = plot_checkpoint.resume_record(reads)
    assert len(record["reads"]) == 3 and record["saved"]["world_size"] == 2
    for unit in record["saved"]["units"]:
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            got = sorted(
                (r["start"], r["numel"], r["from_rank"])
                for rank in record["reads"]
                for r in rank
                if r["unit"] == unit["name"] and r["kind"] == kind
            )
            covered = [i for start, n, _ in got for i in range(start, start + n)]
            assert covered == list(range(unit["numel"]))
            assert all(rank == start // unit["shard_numel"] for start, _, rank in got)


def test_gpu_figure_keeps_copies_apart_from_network_bytes(scripts, tiny_corpus, tmp_path):
    """--device gpu --offload-optimizer cpu in numba-cuda's simulator: the copies lane
    holds the staging copies and ZeRO-Offload's 2 Psi / N bytes each way, as the
    ledger counts them; the collectives' bytes are the network's alone."""
    trace, log = tmp_path / "trace_gpu_offload.json", tmp_path / "trace_gpu_offload.jsonl"
    env = dict(mpi_env(), NUMBA_ENABLE_CUDASIM="1")  # the simulator, even beside a GPU
    job(
        2, "-m", "zero_ref.train", *TINY_GPT, "--data", tiny_corpus, "--stage", "2",
        "--precision", "bf16", "--device", "gpu", "--offload-optimizer", "cpu",
        "--steps", "2", "--trace", str(trace), "--log-jsonl", str(log), env=env,
    )  # fmt: skip
    summary = drawn(scripts, [str(trace)], tmp_path / "gpu.png", order=True)[
        "trace_gpu_offload:last"
    ]
    final = json.loads(log.read_text().splitlines()[-1])
    ledger = final["ranks"][0]["comm_last_step"]
    copied = {k: v["copied_bytes"] for k, v in ledger.items() if "copied_bytes" in v}
    assert summary["copied"] == copied
    assert summary["sent"] == {k: v["sent_bytes"] for k, v in ledger.items() if k not in copied}
    two_psi_over_n = 2 * final["numel_padded"] // final["world_size"]
    assert copied["offload_grads_to_host"] == copied["offload_params_to_device"] == two_psi_over_n
