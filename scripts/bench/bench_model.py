"""How close one rank's GPT forward + backward comes to the machine's GEMM rate.

One process, no MPI, one BLAS thread by default: 4 ranks on 2 cores get that
much each (set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS to measure another count).
For two models, the default GPT of `python -m zero_ref.train` at its per-rank
micro-batch and a 10M-parameter one, it times `loss_and_grads` (forward through
every unit, the loss, backward through every unit) on a batch of the default
corpus and counts the matmul FLOPs that step does:

    forward  2 * M * N * K per matmul (per layer below); backward twice that,
             one matmul for the input gradient and one for the weight (or, in
             attention, for the other operand)
    achieved_gflops  = matmul FLOPs / median fwd+bwd seconds
    fraction_of_gemm = achieved_gflops / the best float32 GEMM rate measured
                       here, same thread count, square 512 and 1024 matrices
    *_cpu              the same by the timing thread's CPU time (and the
                       GEMM's), which waiting for a busy core does not inflate

Elementwise work (layer norm, GELU, softmax, the loss) is real time but not
counted, so the fraction is how GEMM-bound the step is. The GEMM rate is
measured before and after the models; the faster run counts, so a busy moment
cannot lower it and flatter the model.

Allocation matters as much as arithmetic here: a step allocates its
activations (MBs) and frees them again, and glibc hands freed memory at the top
of the heap back to the kernel, so the next step page-faults it in again. So the
models are timed under two allocator policies, glibc's default (what training
sees today) and `heap_kept` (`mallopt`: keep freed memory, no per-array mmap).
Each timing runs in a fresh child process, so every policy starts from the same
allocator state, and the policies alternate over --rounds so that a busy
neighbour hurts both alike. A figure is the median over all timed steps of all
rounds; the CPU time of the timing thread is reported beside the wall time.

    python scripts/bench/bench_model.py [--rounds 2] [--reps 20] [--reps-10m 4]

Prints a table, then one JSON line last.
"""

# isort: off
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads BLAS; zero_ref's budget defers to it
import zero_ref  # noqa: F401, E402

# isort: on
import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit  # noqa: E402
from zero_ref.app.cli_flags import DEFAULTS, MODEL_DEFAULTS  # noqa: E402
from zero_ref.app.data import default_text, encode_corpus, sequence_batches  # noqa: E402
from zero_ref.models.gpt import GPT, GPTConfig, param_numel  # noqa: E402
from zero_ref.models.unit import init_params, loss_and_grads  # noqa: E402

DEFAULT_WORLD = 4  # the setup: 4 ranks share the global batch
TARGET_DEFAULT_MS = 7.8  # 1.3 x torch's 6 ms for the same model, one thread
TARGET_10M_FRACTION = 0.5
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers


# --- the models ---------------------------------------------------------------


def default_setup(vocab_size: int) -> tuple[GPTConfig, int]:
    """The default `--model gpt` run: its config and the micro-batch one of 4 ranks gets."""
    gpt = {**DEFAULTS, **MODEL_DEFAULTS["gpt"]}
    config = GPTConfig(vocab_size, gpt["context"], gpt["n_layer"], gpt["n_head"], gpt["d_model"])
    return config, gpt["batch_size"] // DEFAULT_WORLD


def ten_million_setup(vocab_size: int) -> tuple[GPTConfig, int]:
    """d_model 384, 6 layers of 6 heads, context 128: 10.8M parameters; 8 sequences."""
    return GPTConfig(vocab_size, context=128, n_layer=6, n_head=6, d_model=384), 8


def matmul_flops(config: GPTConfig, batch: int) -> dict[str, int]:
    """Forward matmul FLOPs per layer, 2 * M * N * K each; the loss and lookups have none."""
    B, T, C, V = batch, config.context, config.d_model, config.vocab_size
    N, hs = B * T, C // config.n_head
    block = {
        "attn.qkv": 2 * N * C * 3 * C,
        "attn.scores q@k^T": 2 * B * config.n_head * T * T * hs,
        "attn.att@v": 2 * B * config.n_head * T * T * hs,
        "attn.proj": 2 * N * C * C,
        "mlp.fc": 2 * N * C * 4 * C,
        "mlp.proj": 2 * N * 4 * C * C,
    }
    per_layer = {f"block.{k}": v * config.n_layer for k, v in block.items()}
    return {**per_layer, "head.lm_head": 2 * N * C * V}


# --- timing -------------------------------------------------------------------

POLICIES = ("glibc", "heap_kept")


def time_steps(config: GPTConfig, batch: int, tokens: np.ndarray, reps: int) -> dict:
    """Wall and thread-CPU seconds of each of reps loss_and_grads calls, after one warm-up."""
    model = GPT(config)
    params = init_params(model, seed=0)
    inputs, targets = sequence_batches(tokens, config.context, batch, 1, 1, step=0, seed=0)
    ids, tgt = inputs[0, 0], targets[0, 0]  # (b, T)
    loss_and_grads(model, params, ids, tgt)  # compiles the Numba kernels, touches the memory
    wall, cpu = [], []
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        loss_and_grads(model, params, ids, tgt)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    return {"wall_s": wall, "cpu_s": cpu, "page_faults": faults}


def child(policy: str, setups: list, tokens: np.ndarray) -> None:
    """One fresh process: set the allocator policy, time every model, print one JSON line."""
    if policy == "heap_kept" and not keep_freed_memory():
        raise SystemExit("bench_model: mallopt failed; is this glibc?")
    print(json.dumps({name: time_steps(cfg, b, tokens, reps) for name, cfg, b, reps in setups}))


def run_rounds(args: argparse.Namespace) -> dict[str, dict[str, dict]]:
    """Children alternating over the policies; pooled step times per policy and model."""
    pooled: dict[str, dict[str, dict]] = {p: {} for p in POLICIES}
    for _ in range(args.rounds):
        for policy in POLICIES:
            cmd = [sys.executable, __file__, "--child", policy, *_size_flags(args)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for name, t in json.loads(out.splitlines()[-1]).items():
                seen = pooled[policy].setdefault(name, {"wall_s": [], "cpu_s": [], "faults": 0})
                seen["wall_s"] += t["wall_s"]
                seen["cpu_s"] += t["cpu_s"]
                seen["faults"] += t["page_faults"]
    return {p: {n: summarize(t) for n, t in models.items()} for p, models in pooled.items()}


def _size_flags(args: argparse.Namespace) -> list[str]:
    return ["--reps", str(args.reps), "--reps-10m", str(args.reps_10m)]


def summarize(t: dict) -> dict:
    return {
        "fwd_bwd_ms": 1e3 * statistics.median(t["wall_s"]),
        "fwd_bwd_ms_min": 1e3 * min(t["wall_s"]),
        "fwd_bwd_cpu_ms": 1e3 * statistics.median(t["cpu_s"]),  # this thread: less hit by load
        "page_faults_per_step": t["faults"] / len(t["wall_s"]),
        "timed_steps": len(t["wall_s"]),
    }


def gemm_gflops(n: int, reps: int) -> dict[str, float]:
    """Best float32 GFLOP/s of an n x n x n matmul into a preallocated output, by each clock."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)
    wall = cpu = float("inf")
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        np.matmul(a, b, out=out)
        cpu = min(cpu, time.thread_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return {"wall": 2 * n**3 / wall / 1e9, "cpu": 2 * n**3 / cpu / 1e9}


def gemm_rates(reps: int) -> dict[str, dict[str, float]]:
    return {str(n): gemm_gflops(n, reps) for n in (512, 1024)}


def best_gemm(runs: list[dict]) -> dict[str, float]:
    """The fastest GEMM seen, per clock, over every run and size."""
    return {clock: max(r[clock] for run in runs for r in run.values()) for clock in ("wall", "cpu")}


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory in the heap (no trimming, no per-array mmap)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    trim = libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    mmap = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest allowed threshold
    return bool(trim and mmap)


# --- report -------------------------------------------------------------------


def blas_info() -> dict:
    """Which BLAS NumPy was built against, and the thread settings in force."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    info = {
        "numpy": np.__version__,
        "blas": blas.get("name"),
        "blas_version": blas.get("version"),
        "blas_config": blas.get("openblas configuration"),
        "env_threads": {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    }
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return info
    info["threadpools"] = [
        {k: p.get(k) for k in ("internal_api", "num_threads", "version")} for p in threadpool_info()
    ]
    return info


def with_rates(timing: dict, flops: int, gemm: dict[str, float]) -> dict:
    """timing, plus achieved GFLOP/s (matmul FLOPs / median time) and its share of GEMM.

    By wall time, as asked; and by the timing thread's CPU time against the
    GEMM's, a clock that a neighbour taking the core away for a while does not
    run on.
    """
    achieved = flops / timing["fwd_bwd_ms"] / 1e6
    achieved_cpu = flops / timing["fwd_bwd_cpu_ms"] / 1e6
    return {
        **timing,
        "achieved_gflops": achieved,
        "fraction_of_gemm": achieved / gemm["wall"],
        "achieved_gflops_cpu": achieved_cpu,
        "fraction_of_gemm_cpu": achieved_cpu / gemm["cpu"],
    }


def model_row(setup: tuple, timing: dict, kept: dict, gemm: dict[str, float]) -> dict:
    name, config, batch, _ = setup
    flops = matmul_flops(config, batch)
    total = 3 * sum(flops.values())  # backward: two matmuls the size of each forward one
    return {
        "name": name,
        "config": {**config.__dict__, "micro_batch": batch},
        "params": param_numel(config),
        "tokens_per_fwd_bwd": batch * config.context,
        "matmul_flops_forward_by_layer": flops,
        "matmul_flops": total,
        **with_rates(timing, total, gemm),
        "gemm_gflops": gemm["wall"],
        "gemm_gflops_cpu": gemm["cpu"],
        "heap_kept": with_rates(kept, total, gemm),
    }


def print_table(rows: list[dict], gemm: dict[str, float], info: dict) -> None:
    print(f"BLAS: {info['blas']} {info['blas_version']}  threads: {info['env_threads']}")
    print(
        f"float32 GEMM, best of 512 and 1024: {gemm['wall']:.1f} GFLOP/s by wall time,"
        f" {gemm['cpu']:.1f} by thread CPU time"
    )
    print(f"{'':>40} {'wall time':^17} {'thread CPU time':^17}")
    print(
        f"{'model':>8} {'policy':>10} {'params':>11} {'GFLOP':>8} {'ms':>8} {'of GEMM':>8}"
        f" {'ms':>8} {'of GEMM':>8} {'faults':>8}"
    )
    for r in rows:
        for policy, t in (("glibc", r), ("heap_kept", r["heap_kept"])):
            print(
                f"{r['name']:>8} {policy:>10} {r['params']:>11,d} {r['matmul_flops'] / 1e9:>8.3f}"
                f" {t['fwd_bwd_ms']:>8.2f} {t['fraction_of_gemm']:>8.3f}"
                f" {t['fwd_bwd_cpu_ms']:>8.2f} {t['fraction_of_gemm_cpu']:>8.3f}"
                f" {t['page_faults_per_step']:>8.0f}"
            )


def check_targets(default: dict, big: dict) -> dict:
    """Each target, met or not, by wall and by CPU time, under both allocator policies."""
    targets: dict = {
        "default_fwd_bwd_ms_max": TARGET_DEFAULT_MS,
        "10M_fraction_of_gemm_min": TARGET_10M_FRACTION,
    }
    for suffix, d, b in (
        ("", default, big),
        ("_heap_kept", default["heap_kept"], big["heap_kept"]),
    ):
        targets[f"default_met{suffix}"] = d["fwd_bwd_ms"] <= TARGET_DEFAULT_MS
        targets[f"default_met_cpu{suffix}"] = d["fwd_bwd_cpu_ms"] <= TARGET_DEFAULT_MS
        targets[f"10M_met{suffix}"] = b["fraction_of_gemm"] >= TARGET_10M_FRACTION
        targets[f"10M_met_cpu{suffix}"] = b["fraction_of_gemm_cpu"] >= TARGET_10M_FRACTION
    return targets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="child processes per policy")
    p.add_argument("--reps", type=int, default=20, help="timed steps of the default model")
    p.add_argument("--reps-10m", type=int, default=4, help="timed steps of the 10M model")
    p.add_argument("--gemm-reps", type=int, default=20)
    p.add_argument("--child", choices=POLICIES, help=argparse.SUPPRESS)
    add_record_flag(p, "bench_model")
    args = p.parse_args()

    vocab, tokens = encode_corpus(default_text())
    setups = [("default", *default_setup(vocab.size), args.reps)]
    setups.append(("10M", *ten_million_setup(vocab.size), args.reps_10m))
    if args.child:
        return child(args.child, setups, tokens)

    gemm_runs = [gemm_rates(args.gemm_reps)]
    timings = run_rounds(args)
    gemm_runs.append(gemm_rates(args.gemm_reps))
    gemm = best_gemm(gemm_runs)
    rows = [
        model_row(setup, timings["glibc"][setup[0]], timings["heap_kept"][setup[0]], gemm)
        for setup in setups
    ]
    info = blas_info()
    print_table(rows, gemm, info)
    targets = check_targets(*rows)
    print(f"targets: {targets}")
    result = {
        "bench": "model",
        **info,
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "gemm_gflops": gemm["wall"],
        "gemm_gflops_cpu": gemm["cpu"],
        "gemm_runs_gflops": gemm_runs,
        "models": rows,
        "targets": targets,
        "load_average": os.getloadavg()[0],
    }
    emit(result, args.record)


if __name__ == "__main__":
    main()
