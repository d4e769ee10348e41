"""--trace end to end: the Chrome/Perfetto trace-event file `python -m zero_ref.train
--trace FILE` writes holds, per rank, the units, the collectives with the ledger's
bytes, the optimizer step named after the run's step, the offloaded update's swap
reads and writes with the bytes the swap files moved, and every checkpoint file
written, checked and read (zero_ref/io/trace.py)."""

from __future__ import annotations

import json

from tests.mpi_pool import mpirun_command, run_watched
from tests.tiny_gpt import TINY_GPT


def train(world: int, *flags: str) -> None:
    p = run_watched(mpirun_command(world, "-m", "zero_ref.train", *flags))
    assert p.returncode == 0, p.stderr[-3000:]


def rank_events(path, rank: int) -> list[dict]:
    """One rank's timed events (ph X), in the order they began."""
    events = json.loads(path.read_text())["traceEvents"]
    mine = [e for e in events if e.get("pid") == rank and e.get("ph") == "X"]
    return sorted(mine, key=lambda e: e["ts"])


def steps_of(mine: list[dict]) -> list[list[dict]]:
    """The events of each step: from the end of the previous optimizer step to the end of
    this one (what scripts/docs/plot_trace.py draws as a step)."""
    ends = [e["ts"] + e["dur"] for e in mine if e["cat"] == "optimizer"]
    return [
        [e for e in mine if lo <= e["ts"] < hi]
        for lo, hi in zip([0.0, *ends[:-1]], ends, strict=True)
    ]


def final_record(log) -> dict:
    return json.loads(log.read_text().splitlines()[-1])


def test_trace_holds_every_ranks_units_collectives_and_update(tiny_corpus, tmp_path):
    """One file from rank 0 with, per rank, each unit's forward and backward, each
    collective with its bytes, the optimizer step (named after the run's step) and the
    ledger's bytes per step; the collectives' bytes are the ledger's."""
    trace, log = tmp_path / "run.json", tmp_path / "run.jsonl"
    train(
        2, *TINY_GPT, "--stage", "3", "--steps", "2", "--data", tiny_corpus,
        "--trace", str(trace), "--log-jsonl", str(log),
    )  # fmt: skip
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        mine = [e for e in events if e.get("pid") == rank]
        names = {e["name"] for e in mine if e.get("ph") == "X"}
        assert {"forward embed", "backward embed", "allgather", "reduce_scatter"} <= names
        updates = [e for e in mine if e.get("cat") == "optimizer"]
        assert [e["name"] for e in updates] == ["optimizer step 1", "optimizer step 2"]
        assert [e["args"] for e in updates] == [
            {"skipped": False, "adamw_step": 1},
            {"skipped": False, "adamw_step": 2},
        ]
        ledger = [e for e in mine if e["ph"] == "C" and e["name"] == "ledger bytes"]
        assert len(ledger) == 2  # the ledger's bytes after each step
    sent = final_record(log)["ranks"][0]["comm_last_step"]["allgather"]["sent_bytes"]
    gathers = [e for e in steps_of(rank_events(trace, 0))[1] if e["name"] == "allgather"]
    assert sum(e["args"]["sent_bytes"] for e in gathers) == sent


def test_trace_of_an_overlapped_run_draws_each_collective_in_flight_under_compute(
    tiny_corpus, tmp_path
):
    """--overlap-comm: each non-blocking collective is one event from its issue to its
    completion (lane "in flight") with the ledger's bytes, and one for the rank's wait
    (lane "collectives"); at stage 3 a prefetched unit's gather is in flight while the
    unit before it computes, so some flight spans a forward or backward."""
    trace, log = tmp_path / "run.json", tmp_path / "run.jsonl"
    train(
        2, *TINY_GPT, "--stage", "3", "--steps", "2", "--data", tiny_corpus, "--overlap-comm",
        "--trace", str(trace), "--log-jsonl", str(log),
    )  # fmt: skip
    mine = rank_events(trace, 0)
    flights = [e for e in mine if e["cat"] == "in flight"]
    waits = [e for e in mine if e["cat"] == "collectives" and e["name"].startswith("wait ")]
    assert {e["name"] for e in flights} == {"allgather", "reduce_scatter"}
    assert len(waits) == len(flights)
    compute = [e for e in mine if e["cat"] == "compute"]
    spans = [
        (f, c)
        for f in flights
        for c in compute
        if f["ts"] <= c["ts"] and c["ts"] + c["dur"] <= f["ts"] + f["dur"]
    ]
    assert spans, "no collective was in flight across a unit's compute"
    sent = final_record(log)["ranks"][0]["comm_last_step"]["allgather"]["sent_bytes"]
    last = [e for e in steps_of(mine)[1] if e["name"] == "allgather" and e["cat"] == "in flight"]
    assert sum(e["args"]["sent_bytes"] for e in last) == sent


def test_trace_of_an_offloaded_run_holds_every_swap_read_and_write(tiny_corpus, tmp_path):
    """--offload-optimizer nvme: in each step, the swap reads and writes on the trace add
    up to what the swap files themselves counted moving (the "swap file bytes" counter,
    after each update), less the gradient shard that backward wrote as its buckets
    landed: the update reads the shard's master, m, v and gradient (the ledger's
    optimizer and grads bytes on disk, 12 + 2 per element) and writes master, m and v
    back. Every sub-group is read, updated and written once."""
    (tmp_path / "nvme").mkdir()
    trace, log = tmp_path / "offload.json", tmp_path / "offload.jsonl"
    train(
        2, *TINY_GPT, "--data", tiny_corpus, "--stage", "3", "--precision", "bf16",
        "--steps", "2", "--offload-optimizer", "nvme", "--offload-param", "nvme",
        "--nvme-path", str(tmp_path / "nvme"), "--sub-group-size", "100",
        "--trace", str(trace), "--log-jsonl", str(log),
    )  # fmt: skip
    final = final_record(log)
    shard_numel = final["numel_padded"] // final["world_size"]
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        on_disk = final["ranks"][rank]["disk_bytes"]["optimizer"]
        assert on_disk == 12 * shard_numel  # float32 master, m and v
        grads = final["ranks"][rank]["disk_bytes"]["grads"]
        assert grads == 2 * shard_numel  # the bf16 gradient shard
        counted = [e["args"] for e in events if e["pid"] == rank and e["name"] == "swap file bytes"]
        before = {"read": 0, "written": 0}
        for step, in_step in enumerate(steps_of(rank_events(trace, rank))):
            moved = {k: counted[step][k] - before[k] for k in before}
            before = counted[step]
            lanes = {"read": "swap reads", "written": "swap writes"}
            for k, lane in lanes.items():
                backward = grads if k == "written" else 0  # the buckets' landing, not the update
                in_lane = sum(e["args"]["bytes"] for e in in_step if e["cat"] == lane)
                assert in_lane == moved[k] - backward
                assert moved[k] == on_disk + grads
            groups = {
                lane: sorted(e["args"]["sub_group"] for e in in_step if e["cat"] == lane)
                for lane in ("swap reads", "adamw sub-groups", "swap writes")
            }
            assert groups["swap reads"] == groups["adamw sub-groups"] == groups["swap writes"]
            assert groups["swap reads"] == list(range(-(-shard_numel // 100)))


def test_trace_of_a_save_and_of_a_resume_holds_the_checkpoint_files(tiny_corpus, tmp_path):
    """--save-dir: each rank's file written with its bytes, rank 0's manifest; --resume
    on 3 ranks at stage 3: the checkpoint it read, each file checked once over the
    ranks, and each element of param, m and v read once over the new ranks."""
    ckpt, saving, resuming = tmp_path / "ckpt", tmp_path / "save.json", tmp_path / "resume.json"
    flags = [*TINY_GPT, "--data", tiny_corpus, "--stage", "3"]
    train(2, *flags, "--steps", "1", "--save-dir", str(ckpt), "--trace", str(saving))
    manifest = json.loads((ckpt / "step_000001" / "manifest.json").read_text())
    for rank, entry in enumerate(manifest["files"]):
        writes = [e for e in rank_events(saving, rank) if e["cat"] == "checkpoint"]
        named = {e["name"]: e["args"].get("bytes") for e in writes}
        assert named[f"write {entry['file']}"] == entry["bytes"]
        if rank == 0:
            size = (ckpt / "step_000001" / "manifest.json").stat().st_size
            assert named["write manifest.json"] == size and "publish step_000001" in named
    train(3, *flags, "--batch-size", "3", "--steps", "2", "--resume", str(ckpt),
          "--trace", str(resuming))  # fmt: skip
    events = json.loads(resuming.read_text())["traceEvents"]
    resumes = [e["args"] for e in events if e["name"] == "resume"]
    assert len(resumes) == 3 and resumes[0]["saved"]["world_size"] == 2
    assert resumes[0]["resumed"] == {"world_size": 3, "stage": 3}
    loads = [e for e in events if e.get("cat") == "checkpoint" and e["ph"] == "X"]
    checked = sorted((e["name"], e["args"]["bytes"]) for e in loads if e["name"][:6] == "verify")
    assert checked == [(f"verify {f['file']}", f["bytes"]) for f in manifest["files"]]
    numel = manifest["layout"]["numel"]
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        read = [e["args"] for e in loads if e["args"].get("kind") == kind]
        assert sum(r["bytes"] for r in read) == 4 * numel == 4 * sum(r["numel"] for r in read)
