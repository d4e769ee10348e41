"""Stage 3's parameter readahead (--offload-param nvme, zero_ref/engine/stage3.py):
while one unit computes, the kernel is asked (posix_fadvise WILLNEED) to read the
slice of the unit that is gathered next, whichever way the pass goes. Forward
needs unit i + 1 next, backward unit i - 1; the trace records every range advised
("readahead <unit>" in lane "swap reads"), and this checks them against the
gathers the same trace records."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OffloadConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.io.trace import Trace
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

# Units of different sizes, so each unit's range in the swap file is its own.
UNITS = [(f"u{i}", [("w", (7 + 3 * i, 11 + i))]) for i in range(5)]
GATHER = re.compile(r"micro-step (\d+) (forward|backward) (\S+)$")


def traced_steps(tmp_path, steps: int, grad_accum: int, precision: str):
    """A stage-3 engine with offloaded parameters after `steps` traced steps."""
    model = ReplayModel(UNITS)
    config = ZeroConfig(
        stage=3,
        grad_accum=grad_accum,
        deterministic=True,
        mixed_precision=MixedPrecisionConfig(dtype=precision),
        offload=OffloadConfig(param="nvme", nvme_path=str(tmp_path)),
    )
    comm = comm_for(MPI.COMM_SELF, config)
    engine = make_engine(model, init_params(model, 0), config, comm)
    trace = Trace(0)
    engine.attach_trace(trace)
    for step in range(steps):
        contexts = model.contexts(1, step, grad_accum, 1)[:, 0]
        engine.train_step(contexts, np.zeros((grad_accum, 1)))
    return engine, trace


def gathers_and_advice(trace: Trace) -> list[tuple[str, str, list[dict]]]:
    """[(direction, unit gathered, [readahead events recorded after that gather])], in
    the order the main thread recorded them."""
    out: list[tuple[str, str, list[dict]]] = []
    for event in trace.events:
        if event.get("cat") == "collectives" and event["name"] == "allgather":
            match = GATHER.match(event["args"]["where"])
            if match:
                out.append((match.group(2), match.group(3), []))
        elif event.get("cat") == "swap reads" and event["name"].startswith("readahead "):
            assert out, f"readahead before any gather: {event}"
            out[-1][2].append(event)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_each_gather_asks_for_the_unit_gathered_next(tmp_path, precision, grad_accum):
    engine, trace = traced_steps(tmp_path, steps=2, grad_accum=grad_accum, precision=precision)
    names = [u.name for u in engine.layout.units]
    seq = gathers_and_advice(trace)
    directions = {d for d, _, _ in seq}
    assert directions == {"forward", "backward"}, seq  # both passes gather
    for direction, unit, advice in seq:
        asked = {e["name"].removeprefix("readahead ") for e in advice}
        assert all(e["args"]["gathered"] == unit for e in advice), advice
        assert unit not in asked, f"{direction} {unit}: advised its own slice, just gathered"
        i = names.index(unit)
        nxt = i + 1 if direction == "forward" else i - 1
        if 0 <= nxt < len(names):
            assert names[nxt] in asked, f"{direction} gather of {unit}: no readahead of the next"
    # Whatever the direction: the unit gathered next was asked for.
    for (direction, unit, advice), (_, following, _) in zip(seq, seq[1:], strict=False):
        asked = {e["name"].removeprefix("readahead ") for e in advice}
        if following != unit:  # a re-gather after the update reads the slice just written
            assert following in asked, (
                f"{direction} gather of {unit} was followed by {following}, which was not "
                f"read ahead (asked for {sorted(asked)})"
            )
    engine.close()


def test_the_advised_range_is_that_units_slice_of_the_swap_file(tmp_path):
    engine, trace = traced_steps(tmp_path, steps=1, grad_accum=1, precision="bf16")
    advice = [e for _, _, events in gathers_and_advice(trace) for e in events]
    assert advice
    by_name = {u.name: u for u in engine.layout.units}
    for event in advice:
        unit = by_name[event["name"].removeprefix("readahead ")]
        swap, offset = engine.nvme.locate(engine.shard_params[unit.shard_slice()])
        size = swap.dtype.itemsize
        assert event["args"]["file"] == swap.path.name
        assert event["args"]["byte_offset"] == offset * size
        assert event["args"]["bytes"] == unit.shard_numel * size > 0
    engine.close()


def test_without_parameter_offload_nothing_is_read_ahead(tmp_path):
    """In RAM there is nothing to read ahead: no readahead events at all."""
    model = ReplayModel(UNITS)
    config = ZeroConfig(stage=3, deterministic=True)
    comm = comm_for(MPI.COMM_SELF, config)
    engine = make_engine(model, init_params(model, 0), config, comm)
    trace = Trace(0)
    engine.attach_trace(trace)
    engine.train_step(model.contexts(1, 0, 1, 1)[:, 0], np.zeros((1, 1)))
    assert not [e for e in trace.events if e.get("name", "").startswith("readahead")]
    assert any(e.get("name") == "allgather" for e in trace.events)
