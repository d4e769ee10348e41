"""Checkpoint save, load, resharded load and consolidation, each beside the disk's own speed.

    python scripts/bench/bench_checkpoint.py  # ~50M-param GPT, 4 ranks, stage 3
    python scripts/bench/bench_checkpoint.py --d-model 128 --n-layer 2 --ranks 2 --stage 2

In one temporary folder (under --workdir, removed at the end unless --keep):

  1. the disk: write a file the size of one rank file, fsync (write GB/s), drop it
     from the page cache (posix_fadvise DONTNEED) and read it back (read GB/s);
  2. save: `mpirun -n RANKS python -m zero_ref.train --save-dir` for one step (of a
     two-step schedule, --stop-at-step 1) with --export of the same parameters;
     save GB/s = bytes / save_s of the run's --log-jsonl record;
  3. load: the rank files dropped from the page cache, --resume for the second step
     at the same world size, then again at --reshard-ranks (stage 1 by default, a
     micro batch that keeps the global batch): bytes / load_s, where load_s covers
     the CRC-32 checks, building the engine from the checkpoint and AdamW's state;
  4. consolidate: the cache dropped again, `python -m zero_ref.app.consolidate --json`:
     its GB/s, its peak memory above its baseline against the target (the largest
     tensor + the read window), and whether its file equals the run's --export bit
     for bit.

A table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.cli import parse_args
from zero_ref.app.estimate import model_for
from zero_ref.checkpoint.manifest import STATE_KINDS, read_manifest, resolve_tag
from zero_ref.checkpoint.to_safetensors import WINDOW_NUMEL
from zero_ref.io.metrics_log import read_jsonl
from zero_ref.io.tensor_io import load_named
from zero_ref.layout.flat import model_layout

CHUNK_BYTES = 16 << 20  # the disk test writes and reads this much at a time
F32 = 4


# ---- the disk on its own


def drop_from_cache(paths) -> None:
    """Ask the kernel to forget the files' pages, so the next read comes from the disk
    (pages must be clean: every file here was fsynced when it was written)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_write(path: Path, nbytes: int, chunk: np.ndarray) -> float:
    """Seconds to write nbytes (chunk after chunk) and fsync them."""
    view = memoryview(chunk).cast("B")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, view[: min(left, view.nbytes)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def timed_read(path: Path, chunk: np.ndarray) -> float:
    """Seconds to read the whole file into chunk, piece by piece (as the reader does)."""
    view = memoryview(chunk).cast("B")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.readv(fd, [view]):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def disk_speed(folder: Path, nbytes: int, repeats: int) -> tuple[float, float]:
    """(write GB/s, read GB/s), medians of `repeats` rounds on a file of nbytes."""
    chunk = np.random.default_rng(0).integers(0, 256, CHUNK_BYTES, dtype=np.uint8)
    path = folder / "disk_test.bin"
    writes, reads = [], []
    for _ in range(repeats):
        writes.append(nbytes / timed_write(path, nbytes, chunk) / 1e9)
        drop_from_cache([path])
        reads.append(nbytes / timed_read(path, chunk) / 1e9)
        path.unlink()
    return statistics.median(writes), statistics.median(reads)


# ---- the runs


def model_flags(a: argparse.Namespace) -> list[str]:
    return [
        *("--d-model", str(a.d_model), "--n-layer", str(a.n_layer), "--context", str(a.context)),
        *("--quiet", "--sample-chars", "0", "--steps", "2"),
    ]


def rank_file_bytes(a: argparse.Namespace) -> int:
    """Data bytes of one rank file of the save (without its small header)."""
    flags = [*model_flags(a), "--micro-batch-size", str(a.micro_batch_size)]
    parsed = parse_args(flags, a.ranks)
    return len(STATE_KINDS) * F32 * model_layout(model_for(parsed, a.ranks), a.ranks).shard_numel


def launch(cmd: list[str], a: argparse.Namespace) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done


def train(a: argparse.Namespace, name: str, ranks: int, stage: int, micro: int, extra: list):
    """One `mpirun -n ranks python -m zero_ref.train`; returns its --log-jsonl records."""
    beside = Path(sys.executable).with_name("mpirun")  # where the mpich wheel puts it
    log = a.tmp / f"{name}.jsonl"
    cmd = [
        str(beside) if beside.exists() else "mpirun",
        *("-n", str(ranks), sys.executable, "-m", "zero_ref.train", *model_flags(a)),
        *("--stage", str(stage), "--micro-batch-size", str(micro)),
        *("--log-jsonl", str(log), *extra),
    ]
    launch(cmd, a)
    return read_jsonl(log)


def record_with(records: list[dict], key: str) -> dict:
    return next(r for r in records if key in r)


def resume(a: argparse.Namespace, tag: Path, ranks: int, stage: int, micro: int) -> dict:
    """The "resumed_from" record of one more step from `tag`, read from a cold cache."""
    drop_from_cache(tag.glob("rank_*.safetensors"))
    records = train(a, f"resume_{ranks}x{stage}", ranks, stage, micro, ["--resume", str(tag)])
    return record_with(records, "resumed_from")


def consolidate(a: argparse.Namespace, tag: Path, out: Path) -> dict:
    """`python -m zero_ref.app.consolidate --json` from a cold cache; its JSON line, with the
    wall time of the whole command (its CRC-32 checks and imports too) beside it."""
    drop_from_cache(tag.glob("rank_*.safetensors"))
    cmd = [sys.executable, "-m", "zero_ref.app.consolidate", str(tag), str(out), "--json"]
    t0 = time.perf_counter()
    done = launch(cmd, a)
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {**record, "wall_s": time.perf_counter() - t0}


def largest_tensor_bytes(tag: Path) -> int:
    """The largest tensor of the manifest's layout, in bytes."""
    units = read_manifest(tag)["layout"]["units"]
    shapes = [t["shape"] for u in units for t in u["tensors"]]
    return F32 * max(int(np.prod(s, dtype=np.int64)) for s in shapes)


def same_tensors(path_a: Path, path_b: Path) -> bool:
    """Same names, shapes, dtypes and bits."""
    a, b = load_named(path_a), load_named(path_b)
    return a.keys() == b.keys() and all(
        x.dtype == b[k].dtype and x.shape == b[k].shape and x.tobytes() == b[k].tobytes()
        for k, x in a.items()
    )


# ---- the report


def measure(a: argparse.Namespace) -> dict:
    nbytes = rank_file_bytes(a)
    write_gbps, read_gbps = disk_speed(a.tmp, nbytes, a.repeats)
    print(f"  disk done ({nbytes / 1e6:.0f} MB file)", file=sys.stderr, flush=True)
    ckpt, export = a.tmp / "ckpt", a.tmp / "export.safetensors"
    extra = ["--stop-at-step", "1", "--save-dir", str(ckpt), "--export", str(export)]
    saved = record_with(train(a, "save", a.ranks, a.stage, a.micro_batch_size, extra), "checkpoint")
    tag = resolve_tag(ckpt)
    print(f"  save done ({tag.name})", file=sys.stderr, flush=True)
    loaded = resume(a, tag, a.ranks, a.stage, a.micro_batch_size)
    reshard_micro = a.micro_batch_size * a.ranks // a.reshard_ranks  # the same global batch
    resharded = resume(a, tag, a.reshard_ranks, a.reshard_stage, reshard_micro)
    print("  loads done", file=sys.stderr, flush=True)
    out = a.tmp / "consolidated.safetensors"
    merged = consolidate(a, tag, out)
    peak_above = merged["peak_rss_bytes"] - merged["baseline_rss_bytes"]
    largest, window = largest_tensor_bytes(tag), F32 * WINDOW_NUMEL
    numel = read_manifest(tag)["layout"]["numel"]
    return {
        "params": numel,
        "d_model": a.d_model,
        "n_layer": a.n_layer,
        "context": a.context,
        "ranks": a.ranks,
        "stage": a.stage,
        "reshard_ranks": a.reshard_ranks,
        "reshard_stage": a.reshard_stage,
        "rank_file_bytes": nbytes,
        "checkpoint_bytes": saved["bytes"],
        "disk_write_gbps": write_gbps,
        "disk_read_gbps": read_gbps,
        "save_s": saved["save_s"],
        "save_gbps": saved["bytes"] / saved["save_s"] / 1e9,
        "load_s": loaded["load_s"],
        "verify_s": loaded["verify_s"],
        "load_gbps": loaded["bytes"] / loaded["load_s"] / 1e9,
        "reshard_load_s": resharded["load_s"],
        "reshard_verify_s": resharded["verify_s"],
        "reshard_load_gbps": resharded["bytes"] / resharded["load_s"] / 1e9,
        "consolidate_bytes": merged["bytes"],
        "consolidate_s": merged["seconds"],
        "consolidate_gbps": merged["gb_per_s"],
        "consolidate_wall_s": merged["wall_s"],
        "consolidate_peak_above_baseline_bytes": peak_above,
        "largest_tensor_bytes": largest,
        "window_bytes": window,
        "peak_below_target": peak_above < largest + window,
        "consolidated_equals_export": same_tensors(out, export),
    }


def table(r: dict) -> str:
    gb = 1e9
    rows = [
        ("disk write (1 file, fsync)", r["rank_file_bytes"], None, r["disk_write_gbps"]),
        ("disk read (cold cache)", r["rank_file_bytes"], None, r["disk_read_gbps"]),
        (f"save ({r['ranks']} ranks, stage {r['stage']})", r["checkpoint_bytes"], r["save_s"],
         r["save_gbps"]),
        (f"load ({r['ranks']} ranks, stage {r['stage']})", r["checkpoint_bytes"], r["load_s"],
         r["load_gbps"]),
        ("  of it CRC-32 checks", r["checkpoint_bytes"], r["verify_s"],
         r["checkpoint_bytes"] / r["verify_s"] / gb),
        (f"load ({r['reshard_ranks']} ranks, stage {r['reshard_stage']})",
         r["checkpoint_bytes"], r["reshard_load_s"], r["reshard_load_gbps"]),
        ("consolidate (params only)", r["consolidate_bytes"], r["consolidate_s"],
         r["consolidate_gbps"]),
        ("  whole command (with checks)", r["consolidate_bytes"], r["consolidate_wall_s"],
         r["consolidate_bytes"] / r["consolidate_wall_s"] / gb),
    ]  # fmt: skip
    lines = [
        f"GPT {r['d_model']}x{r['n_layer']} ({r['params'] / 1e6:.1f}M params), context "
        f"{r['context']}: checkpoint {r['checkpoint_bytes'] / 1e6:,.0f} MB",
        f"{'':32}{'MB':>9}{'s':>8}{'GB/s':>8}",
    ]
    for name, nbytes, seconds, rate in rows:
        seconds = nbytes / rate / gb if seconds is None else seconds  # the disk test's medians
        lines.append(f"{name:32}{nbytes / 1e6:>9,.0f}{seconds:>8.2f}{rate:>8.2f}")
    mib, peak = 2**20, r["consolidate_peak_above_baseline_bytes"]
    lines.append(
        f"consolidate peak memory above baseline {peak / mib:.1f} MiB; target < largest "
        f"tensor {r['largest_tensor_bytes'] / mib:.1f} MiB + window "
        f"{r['window_bytes'] / mib:.0f} MiB: {'met' if r['peak_below_target'] else 'MISSED'}"
    )
    lines.append(
        f"consolidated file equals --export bit for bit: {r['consolidated_equals_export']}"
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=1, help="per rank, at --ranks")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--reshard-ranks", type=int, default=2, help="world size of the second load")
    p.add_argument("--reshard-stage", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="rounds of the disk test (median)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--keep", action="store_true", help="leave the temporary folder in place")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per command")
    add_record_flag(p, "bench_checkpoint")
    a = p.parse_args()
    if (a.micro_batch_size * a.ranks) % a.reshard_ranks:
        p.error(f"--reshard-ranks {a.reshard_ranks} does not divide the global batch")
    a.tmp = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=a.workdir))
    try:
        result = measure(a)
    finally:
        if a.keep:
            print(f"kept {a.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(a.tmp, ignore_errors=True)
    result["load_average"] = load_average()
    print(table(result))
    emit(result, a.record)


if __name__ == "__main__":
    main()
