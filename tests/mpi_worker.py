"""A pool worker: run under mpirun, it executes parity cases sent by pytest.

Rank 0 reads one JSON case per line from stdin, broadcasts it, every rank runs
it with the engine, and rank 0 compares each step's parameters and reported
loss with the single-rank oracle, printing "STEP <n>" after each step (so the
pool can tell a slow case from a hung one) and one line "RESULT <json>" at the
end. Any exception aborts the whole job (MPI Abort), so pytest sees it instead
of a hang.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from minimal_case import run_minimal_case  # beside this script, which runs by path
from mpi4py import MPI

from zero_ref.app.resume import restore
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.space import check_save_space
from zero_ref.checkpoint.writer import save_checkpoint
from zero_ref.comm.choose import comm_for
from zero_ref.config import (
    AdamWConfig,
    HybridConfig,
    LossScaleConfig,
    MixedPrecisionConfig,
    OffloadConfig,
    OverlapConfig,
    ZeroConfig,
    ZeroPPConfig,
)
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.memory import formula_bytes
from zero_ref.layout.flat import tensor_views
from zero_ref.layout.grad_blocks import plan_wire
from zero_ref.models.unit import init_params
from zero_ref.oracle.single_rank import GradientBlocks, Oracle
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel


def build_model(case: dict):
    """The case's model, and a function giving inputs/targets for one step."""
    if case["model"] == "replay":
        model = ReplayModel([(n, [(t, tuple(s)) for t, s in ts]) for n, ts in case["units"]])

        def batches(step: int, k: int, w: int):
            return model.contexts(case["seed"], step, k, w), np.zeros((k, w))

        return model, batches
    from zero_ref.app.data import encode_corpus, micro_batches, sequence_batches
    from zero_ref.models.gpt import GPT, GPTConfig
    from zero_ref.models.mlp import CharMLP, MLPConfig

    vocab, tokens = encode_corpus(case["text"])
    if case["model"] == "gpt":
        model = GPT(GPTConfig(vocab.size, context=5, n_layer=2, n_head=2, d_model=case["hidden"]))

        def batches(step: int, k: int, w: int):
            return sequence_batches(tokens, 5, case["micro_batch"], w, k, step, case["seed"])

        return model, batches
    model = CharMLP(MLPConfig(vocab.size, context=3, d_embed=4, d_hidden=case["hidden"]))

    def batches(step: int, k: int, w: int):
        return micro_batches(tokens, 3, case["micro_batch"], w, k, step, case["seed"])

    return model, batches


def full_equals_everywhere(comm: MPI.Comm, full: dict[str, np.ndarray]) -> bool:
    """Do all ranks hold the same consolidated parameters (bitwise)?"""
    flat = np.concatenate([v.reshape(-1) for v in full.values()] or [np.zeros(0, np.float32)])
    first = flat.copy()
    comm.Bcast(first, root=0)
    same = np.array([int(np.array_equal(flat.view(np.uint32), first.view(np.uint32)))])
    comm.Allreduce(MPI.IN_PLACE, same, op=MPI.MIN)
    return bool(same[0])


def run_case(case: dict, world: MPI.Comm) -> dict | None:
    """A parity case. With "resume_from" the engine starts from that checkpoint and the
    oracle first replays the saved run's "history" ([{world, steps, lrs}], at those
    world sizes); with "save_to" the engine saves a checkpoint after its steps. Both
    go through zero_ref.checkpoint, as the trainer does."""
    opt = AdamWConfig(lr=case["lr"], weight_decay=case["weight_decay"])
    cfg = ZeroConfig(
        stage=case["stage"],
        bucket_numel=case["bucket_numel"],
        grad_accum=case["grad_accum"],
        clip=case["clip"],
        deterministic=case["deterministic"],
        optimizer=opt,
        checkpoint_activations=case.get("checkpoint_activations", False),
        nonfinite=case.get("nonfinite", "raise"),
        device=case.get("device", "cpu"),
        mixed_precision=MixedPrecisionConfig(
            dtype=case.get("precision", "fp32"),
            grad_accum_dtype=case.get("grad_accum_dtype"),
            communication_data_type=case.get("communication_data_type"),
            loss_scale=LossScaleConfig(**case.get("loss_scale", {})),
        ),
        offload=offload_settings(case),
        overlap=OverlapConfig(**(case.get("overlap") or {})),  # comm, progress, prefetch...
        zeropp=ZeroPPConfig(
            **(qwz_settings(case) | qgz_settings(case)),  # one quantize_block if both
            hpz_partition_size=case.get("hpz") or 1,  # hpZ: a partition size, or "host"
        ),
        hybrid=HybridConfig(shard_size=case.get("hybrid")),  # a shard group size, or None
    )
    model, batches = build_model(case)
    init = init_params(model, case["seed"])
    comm = comm_for(world, cfg)
    k, w, steps = cfg.grad_accum, comm.size, []
    shard = comm.size if cfg.hybrid.shard_size == "host" else None  # one host: G = W
    oracle = Oracle.for_config(init, cfg, model, shard) if comm.rank == 0 else None
    first = 0
    if case.get("resume_from"):
        checkpoint = Checkpoint(case["resume_from"])
        engine = make_engine(model, checkpoint.source("param"), cfg, comm)
        first = restore(engine, checkpoint)
        checkpoint.close()
        if oracle is not None:
            replay_history(oracle, model, batches, case["history"], k)
    else:
        engine = make_engine(model, init, cfg, comm)
    lrs = case.get("lrs") or [None] * case["steps"]  # a schedule's lr per step; None: cfg's
    for step in range(case["steps"]):
        inputs, targets = batches(first + step, k, w)
        lr = lrs[step]
        result = engine.train_step(inputs[:, comm.rank], targets[:, comm.rank], lr=lr)
        full = full_parameters(engine)
        same = full_equals_everywhere(world, full)
        if oracle is not None:
            oracle_scale = oracle.loss_scale() or 1.0  # the scale this step's backward uses
            oracle_loss = oracle.model_step(model, inputs, targets, lr)
            steps.append(compare(full, oracle.parameters(), same, result, oracle, oracle_loss))
            steps[-1]["oracle_loss_scale"] = oracle_scale
            print(f"STEP {step + 1}", flush=True)
    state = consolidated_optimizer_state(engine)
    save_need = None  # the bytes zero_ref/checkpoint/space.py says the save takes
    if case.get("save_to"):
        Path(case["save_to"]).mkdir(parents=True, exist_ok=True)
        save_need = check_save_space(engine, case["save_to"], first + case["steps"], {"case": case})
        save_checkpoint(engine, case["save_to"], first + case["steps"], {"case": case})
    groups = world.gather(group_members(engine, world), root=0)
    held = engine.memory.bytes_by_category()
    on_disk = engine.memory.disk_bytes_by_category()
    on_device = engine.memory.device_bytes_by_category()
    engine.close()
    everyone = world.gather(held, root=0)
    everyone_disk = world.gather(on_disk, root=0)
    everyone_device = world.gather(on_device, root=0)
    if comm.rank != 0:
        return None
    sizes = engine.precision.bytes
    formula = formula_bytes(cfg.stage, engine.layout.full_numel, engine.shard_world, k, sizes)
    return {
        "steps": steps,
        "optimizer_state_bitwise": optimizer_state_matches(state, oracle),
        "step_count": [engine.step_count, oracle.step_count],
        "memory": everyone,
        "disk_memory": everyone_disk,
        "device_memory": everyone_device,
        "formula": formula,
        "peak_params": engine.memory.peak_by_category["params"],
        "case_id": case.get("case_id"),  # which case this answers (tests/mpi_pool.py)
        "save_need": save_need,
        "ledger": comm.ledger.history,
        "full_numel": engine.layout.full_numel,
        "element_bytes": dataclasses.asdict(sizes),
        "numel": engine.layout.numel,
        "shard_world": engine.shard_world,  # hybrid sharding: G (else the world size)
        "hybrid_sent_bytes": engine.hybrid_sent_bytes(),  # its all-reduce across groups
        "groups": groups,  # per rank: the world ranks of each group Comm the engine built
        **plan(engine),
    }


def qwz_settings(case: dict) -> dict:
    """ZeroPPConfig's qwZ fields for a case with "qwz": {quantize_block} (stage 3)."""
    qwz = case.get("qwz")
    return {} if not qwz else {"quantized_weights": True, "quantize_block": qwz["quantize_block"]}


def qgz_settings(case: dict) -> dict:
    """ZeroPPConfig's qgZ fields for a case with "qgz": {quantize_block, bits, local} (stages
    1-3; bits 8 and local "host", one host's one hop, when not named)."""
    qgz = case.get("qgz")
    if not qgz:
        return {}
    bits = qgz.get("bits", 8)
    return {
        "quantized_gradients": True,
        "quantize_block": qgz["quantize_block"],
        "quantized_gradient_bits": bits,
        "quantized_gradient_local_size": qgz.get("local", "host"),  # qgZ's hops
    }


def phase_gradient_blocks(model, phase: dict) -> GradientBlocks | None:
    """The oracle's qgZ blocks of a saved run's phase (its "qgz", "qwz" and "bucket_numel"):
    that run's quantization of its gradients, not this one's."""
    if not phase.get("qgz"):
        return None
    zeropp = ZeroPPConfig(
        quantized_weights=bool(phase.get("qwz")),  # qwZ's alignment moves qgZ's blocks
        **qgz_settings(phase),
    )
    cfg = ZeroConfig(stage=3, bucket_numel=phase["bucket_numel"], zeropp=zeropp)
    return GradientBlocks.for_model(model, cfg)


def offload_settings(case: dict) -> OffloadConfig:
    """The OffloadConfig of a case with "offload": {sub_group_size, buffer_count, param}:
    the optimizer state in swap files under the temp folder; or "offload": "cpu" (with
    "device": "gpu"): ZeRO-Offload."""
    offload = case.get("offload")
    if not offload:
        return OffloadConfig()
    if offload == "cpu":
        return OffloadConfig(optimizer="cpu")
    return OffloadConfig(optimizer="nvme", nvme_path=tempfile.gettempdir(), **offload)


def replay_history(oracle: Oracle, model, batches, history: list[dict], k: int) -> None:
    """The oracle takes the saved run's steps, each at the world size it ran at (and with
    qwZ's block, when the phase names its "qwz": the saved run's, not this one's)."""
    step, mine, reads = 0, oracle.quantize_block, oracle.backward_reads_forward
    groups = oracle.shard_size
    blocks = oracle.gradient_blocks
    for phase in history:
        size = phase.get("hybrid", groups)  # that run's groups, where named ("host": one)
        oracle.shard_size = phase["world"] if size == "host" else size
        if "qgz" in phase:  # qgZ: that run's gradients went through its int8/int4 blocks
            oracle.gradient_blocks = phase_gradient_blocks(model, phase)
        if "qwz" in phase:
            oracle.quantize_block = phase["qwz"]["quantize_block"] if phase["qwz"] else None
            # hpZ with qwZ: that run's backward read forward's dequantized weights
            oracle.backward_reads_forward = bool(phase["qwz"] and phase.get("hpz") not in (None, 1))
        for lr in phase["lrs"]:
            inputs, targets = batches(step, k, phase["world"])
            oracle.model_step(model, inputs, targets, lr)
            step += 1
        oracle.quantize_block, oracle.backward_reads_forward = mine, reads
        oracle.shard_size = groups
        oracle.gradient_blocks = blocks


def consolidated_optimizer_state(engine) -> dict[str, dict[str, np.ndarray]]:
    """AdamW's m and v, every tensor whole, on rank 0 ({} elsewhere)."""
    state: dict[str, dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}

    def keep(kind, unit, flat):
        for name, tensor in tensor_views(flat, unit).items():
            state[kind][f"{unit.name}.{name}"] = tensor.copy()

    engine.stream_state(["exp_avg", "exp_avg_sq"], keep)
    return state


def optimizer_state_matches(state: dict, oracle: Oracle) -> bool:
    expected = {
        "exp_avg": oracle.unflatten(oracle.exp_avg),
        "exp_avg_sq": oracle.unflatten(oracle.exp_avg_sq),
    }
    return all(
        np.array_equal(state[kind][n].view(np.uint32), expected[kind][n].view(np.uint32))
        for kind in expected
        for n in expected[kind]
    )


def group_members(engine, world: MPI.Comm) -> dict[str, list[int]]:
    """The world ranks of each group Comm this rank's engine built, in the group's order:
    hybrid sharding's shard and replica groups, qgZ's two hop groups, hpZ's partition
    group (a collective on each; every rank has the same ones)."""
    comms = {"shard": engine.shard_comm}
    replica = getattr(engine.hybrid, "replica", None)
    if replica is not None:
        comms["replica"] = replica
    hops = getattr(getattr(engine, "grad_quantization", None), "hops", None)  # qgZ's
    if hops is not None:
        comms["qgz_local"], comms["qgz_cross"] = hops.local, hops.cross
    hpz = getattr(getattr(engine, "unit_gather", None), "group", None)  # stage 3's own group
    if hpz is not None:
        comms["hpz"] = hpz
    return {name: comm.mpi.allgather(world.rank) for name, comm in comms.items()}


def gathers_record(gathers):
    """engine.gathers() as plain data (a QuantizedGathers as its dict)."""
    return dataclasses.asdict(gathers) if dataclasses.is_dataclass(gathers) else gathers


def qgz_blocks(engine) -> dict | None:
    """qgZ's GradientWire per micro-step (a destination row's values and blocks, over the
    bucket plan) as its dict, or None."""
    cfg = engine.cfg
    if not cfg.zeropp.quantized_gradients:
        return None
    padded = [u.padded_numel for u in engine.layout.units]
    world, bits = engine.layout.world_size, cfg.zeropp.quantized_gradient_bits
    wire = plan_wire(padded, world, cfg.bucket_numel, cfg.zeropp.quantize_block, bits)
    return dataclasses.asdict(wire)


def plan(engine) -> dict:
    """What the test checks the bucket plan against: each unit's padded numel, the
    engine's buckets (stages 1-3) and its buffers' bytes (staging, scratch)."""
    buckets = getattr(engine, "buckets", None)
    return {
        "unit_padded_numels": [u.padded_numel for u in engine.layout.units],
        "buckets": None
        if buckets is None
        else [[b.first_unit, b.last_unit, b.shard_offset, b.shard_numel] for b in buckets.plan],
        "buffer_bytes": {n: int(a.nbytes) for n, a in engine.memory.held["buffers"].items()},
        "gathers": gathers_record(engine.gathers()),  # stage 3 with prefetch, persistence, qwZ
        "grad_blocks": qgz_blocks(engine),  # qgZ: blocks of a destination row, all buckets
    }


def compare(full, expected, same_on_all_ranks, result, oracle, oracle_loss) -> dict:
    diffs = [float(np.max(np.abs(full[n] - expected[n]), initial=0.0)) for n in expected]
    bitwise = all(
        np.array_equal(full[n].view(np.uint32), expected[n].view(np.uint32)) for n in expected
    )
    return {
        "max_abs_diff": max(diffs, default=0.0),
        "bitwise": bitwise,
        "same_on_all_ranks": same_on_all_ranks,
        "grad_norm": result.grad_norm,
        "oracle_norm": oracle.last_grad_norm,
        "loss_scale": result.loss_scale,
        "skipped": result.skipped,
        "oracle_skipped": oracle.last_skipped,
        "loss": result.loss,
        "oracle_loss": oracle_loss,
        "names_match": sorted(full) == sorted(expected),
    }


def wait_without_spinning(world: MPI.Comm) -> None:
    """Block until rank 0 has the next case, sleeping rather than busy-polling: an
    idle pool must not spin on the cores that the other tests' MPI jobs need."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.005)


def main() -> None:
    world = MPI.COMM_WORLD
    while True:
        line = sys.stdin.readline() if world.rank == 0 else None
        wait_without_spinning(world)
        line = world.bcast(line, root=0)
        if not line:
            return
        try:
            case = json.loads(line)
            if case.get("engine") == "minimal":  # tests/test_minimal.py
                result = run_minimal_case(case, world, build_model)
            else:
                result = run_case(case, world)
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            world.Abort(1)
            # MPICH's Abort can return before mpirun ends the job; going on would print
            # the previous case's RESULT again, and the pool would take it for this case's.
            os._exit(1)
        if world.rank == 0:
            print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
