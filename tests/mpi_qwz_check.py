"""What stage 3's qwZ forward gather hands compute, at any world size; run by
tests/test_quantize.py as

    mpirun -n W python tests/mpi_qwz_check.py PRECISION BLOCK

Every rank builds a stage-3 engine with quantized weights from the same initial
parameters, acquires each unit's forward (quantized) gather and its backward (full)
gather, and rank 0 prints one JSON line: the sha256 of every unit's forward values,
whether they equal the oracle's forward_parameters (no world size in it) bitwise,
whether backward's are the full-precision parameters, and the buffers' bytes held
against the estimate's (qwZ's send and receive rows and scratch among them). The test compares the
hashes across world sizes: blocks aligned to shards make them equal.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI

from zero_ref.app.rank_estimate import state_bytes
from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.replay import ReplayModel

UNITS = [("u0", [("w", (37, 5))]), ("u1", [("w", (9,)), ("b", (4, 4))]), ("u2", [("w", (300,))])]


def main() -> None:
    precision, block = sys.argv[1], int(sys.argv[2])
    cfg = ZeroConfig(
        stage=3,
        deterministic=True,
        mixed_precision=MixedPrecisionConfig(dtype=precision),
        zeropp=ZeroPPConfig(quantized_weights=True, quantize_block=block),
    )
    model = ReplayModel(UNITS)
    init = init_params(model, 3)
    for k in init:  # values that differ in scale across a unit: blocks matter
        init[k] = init[k] * np.float32(1 + np.arange(init[k].size).reshape(init[k].shape) % 7)
    comm = comm_for(MPI.COMM_WORLD, cfg)
    engine = make_engine(model, init, cfg, comm)
    oracle = Oracle.for_config(init, cfg)
    forward, full = oracle.forward_parameters(model), oracle.model_parameters()
    report = {"world": comm.size, "hashes": [], "oracle_forward": True, "backward_full": True}
    report["differs_from_full"] = False
    sizes, held = engine.precision.bytes, engine.memory.bytes_by_category()
    report["buffers"] = [
        held["buffers"],
        state_bytes(engine.layout, 3, cfg.bucket_numel, 1, sizes, cfg)["buffers"],
    ]
    for i, unit in enumerate(model.units):
        got = {k: v.copy() for k, v in engine.unit_params(i, forward=True).items()}
        engine.release_unit_params(i, forward=True)
        back = {k: v.copy() for k, v in engine.unit_params(i).items()}
        engine.release_unit_params(i)
        names = [s.name for s in unit.param_specs()]
        blob = b"".join(np.ascontiguousarray(got[n], np.float32).tobytes() for n in names)
        report["hashes"].append(hashlib.sha256(blob).hexdigest())
        for n in names:
            name = f"{unit.name}.{n}"
            report["oracle_forward"] &= bool(np.array_equal(got[n], forward[name]))
            report["backward_full"] &= bool(np.array_equal(back[n], full[name]))
            report["differs_from_full"] |= not np.array_equal(got[n], full[name])
    engine.close()
    if comm.rank == 0:
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
