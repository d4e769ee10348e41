"""What the tests read of an engine, over its public state: every parameter, whole."""

from __future__ import annotations

import numpy as np

from zero_ref.engine.packing import unpack_full


def full_parameters(engine) -> dict[str, np.ndarray]:
    """Every parameter, a full copy on every rank (a collective where a stage shards
    them: each unit all-gathered, the ledger calling it "consolidate"), for tests and
    small models; runs stream the state to rank 0 instead (engine.stream_state). With
    16-bit parameters these are the float32 master weights they are rounded from."""
    engine.settle()  # --overlap-comm: the last update's all-gathers complete first
    whole, shard = engine.state_buffers("param")
    if whole is not None:
        return unpack_full(engine.place.to_host(whole), engine.layout)
    comm = engine.shard_comm  # hybrid sharding: the group holding one copy
    comm.set_context(where="consolidate")
    full = np.empty(engine.layout.full_numel, shard.dtype)
    for unit in engine.layout.units:
        if unit.padded_numel:
            send = shard[unit.shard_slice()]
            comm.allgather(send, full[unit.full_slice()], kind="consolidate")
    engine.release_offloaded()  # the master weights were read through their mapping
    return unpack_full(full, engine.layout)
