"""The checkpoint format (zero_ref.checkpoint) without MPI jobs.

Resharding is pure integer math, checked against a simulation of the saving
ranks' files in NumPy; the manifest's checks, the writer's housekeeping and
the streaming safetensors writer are checked on small folders; and a real
engine at world size 1 (every stage, in-process on COMM_SELF) is saved,
verified, damaged, consolidated and rebuilt from its checkpoint. Multi-rank
checkpoints are written here too, rank by rank, by stand-in engines that lend
slices of a known buffer, so resharding is also checked through the reader.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from safetensors.numpy import load_file

from zero_ref.checkpoint.manifest import (
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    STATE_KINDS,
    CheckpointError,
    layout_from_record,
    layout_record,
    rank_file_name,
    read_manifest,
    resolve_tag,
    tag_for,
    tags_in,
)
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.reshard import Piece, pieces
from zero_ref.checkpoint.to_safetensors import consolidate
from zero_ref.checkpoint.writer import (
    _publish,
    build_manifest,
    prune,
    remove_unfinished,
    save_checkpoint,
    write_rank_file,
)
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.io.tensor_io import SafetensorsWriter, load_named
from zero_ref.layout.flat import build_layout, rank_rows, tensor_views
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.testing.engine_state import full_parameters

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# 0-d scalars, zero-size tensors, and units smaller than most world sizes
shapes = st.one_of(
    st.just(()),
    st.tuples(st.sampled_from([0, 1, 2, 3, 5, 7, 11])),
    st.tuples(st.integers(0, 4), st.integers(0, 5)),
)
unit_specs = st.lists(st.lists(shapes, min_size=0, max_size=3), min_size=1, max_size=4).map(
    lambda us: [(f"u{i}", [(f"t{j}", s) for j, s in enumerate(ts)]) for i, ts in enumerate(us)]
)
worlds = st.integers(1, 6)
seeds = st.integers(0, 2**32 - 1)


# ---- simulated rank files


def real_values(layout, seed: int) -> dict[str, np.ndarray]:
    """Each unit's real elements: distinct and nonzero, so a misplaced element or a
    padding zero read as data cannot go unseen."""
    rng = np.random.default_rng(seed)
    return {u.name: (rng.permutation(u.numel) + 1).astype(np.float32) for u in layout.units}


def padded(unit, reals: dict[str, np.ndarray], extra: int = 0) -> np.ndarray:
    """The unit's padded range (zeros past its real elements), plus `extra` zeros."""
    flat = np.zeros(unit.padded_numel + extra, np.float32)
    flat[: unit.numel] = reals[unit.name]
    return flat


def rank_files(layout, reals: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What each rank of `layout` saves: its slice of every unit, in unit order."""
    files = [np.full(layout.shard_numel, np.nan, np.float32) for _ in range(layout.world_size)]
    for unit in layout.units:
        rows = rank_rows(padded(unit, reals), unit)  # (world, shard_numel)
        for rank, file in enumerate(files):
            file[unit.shard_slice()] = rows[rank]
    return files


def read_via_pieces(files: list[np.ndarray], saved, lo: int, hi: int) -> np.ndarray:
    out = np.full(hi - lo, np.nan, np.float32)
    out[:] = 0  # what the reader does: padding is zero
    for p in pieces(saved, lo, hi):
        out[p.out_start : p.out_start + p.numel] = files[p.rank][p.file_start :][: p.numel]
    return out


def check_piece_invariants(saved, lo: int, hi: int, found: list[Piece]) -> None:
    """In order, disjoint, covering exactly the real elements of [lo, hi), none in padding,
    each inside its rank's slice of this unit."""
    width, at = saved.shard_numel, 0
    for p in found:
        assert p.numel > 0
        assert p.out_start == at, "pieces are out of order, overlap or leave a gap"
        assert 0 <= p.rank < saved.world_size
        within = p.file_start - saved.shard_offset  # position in the rank's slice of the unit
        assert within >= 0 and within + p.numel <= width
        element = p.rank * width + within  # position in the unit's padded range
        assert element == lo + p.out_start
        assert element + p.numel <= saved.numel, "a piece covers padding"
        at += p.numel
    assert at == max(0, min(hi, saved.numel) - lo)
    assert [p.rank for p in found] == sorted({p.rank for p in found})


# ---- 1. resharding: pieces()


@settings(max_examples=60, **SETTINGS)
@given(units=unit_specs, w1=worlds, w2=worlds, seed=seeds)
@example(units=[("u0", [("t0", (10,))])], w1=4, w2=3, seed=0)
@example(units=[("u0", [("t0", ())]), ("u1", [("t0", (0,))])], w1=6, w2=5, seed=1)
def test_pieces_give_every_new_rank_its_slice(units, w1, w2, seed):
    old, new = build_layout(units, w1), build_layout(units, w2)
    reals = real_values(old, seed)
    files = rank_files(old, reals)
    for saved, unit in zip(old.units, new.units, strict=True):
        expected = padded(unit, reals)
        for rank in range(w2):
            lo = rank * unit.shard_numel
            hi = lo + unit.shard_numel
            check_piece_invariants(saved, lo, hi, pieces(saved, lo, hi))
            np.testing.assert_array_equal(read_via_pieces(files, saved, lo, hi), expected[lo:hi])
        # stages 0-2 keep the parameters whole: the unit's whole padded range
        whole = read_via_pieces(files, saved, 0, unit.padded_numel)
        np.testing.assert_array_equal(whole, expected)


@settings(max_examples=60, **SETTINGS)
@given(units=unit_specs, world=worlds, seed=seeds, data=st.data())
def test_pieces_of_any_range_including_past_the_padding(units, world, seed, data):
    layout = build_layout(units, world)
    reals = real_values(layout, seed)
    files = rank_files(layout, reals)
    for saved in layout.units:
        end = saved.padded_numel + 3
        lo = data.draw(st.integers(0, end), label=f"lo of {saved.name}")
        hi = data.draw(st.integers(lo, end), label=f"hi of {saved.name}")
        found = pieces(saved, lo, hi)
        check_piece_invariants(saved, lo, hi, found)
        expected = padded(saved, reals, extra=3)[lo:hi]
        np.testing.assert_array_equal(read_via_pieces(files, saved, lo, hi), expected)


def test_pieces_example_from_the_module_docstring():
    # numel 10 saved by 4 ranks (slices of 3), read back by 3 ranks (slices of 4)
    (saved,) = build_layout([("u", [("w", (10,))])], 4).units
    assert pieces(saved, 4, 8) == [Piece(1, 1, 2, 0), Piece(2, 0, 2, 2)]
    assert pieces(saved, 8, 12) == [Piece(2, 2, 1, 0), Piece(3, 0, 1, 1)]  # then 2 padding
    assert pieces(saved, 10, 12) == []  # all padding
    assert pieces(saved, 5, 5) == []


def test_pieces_use_the_units_offset_in_the_shard_buffer():
    layout = build_layout([("a", [("w", (5,))]), ("b", [("w", (7,))])], 2)
    saved = layout.units[1]  # b's slices start after a's 3 elements in every rank file
    assert pieces(saved, 0, 8) == [Piece(0, 3, 4, 0), Piece(1, 3, 3, 4)]


@pytest.mark.parametrize("lo, hi", [(-1, 3), (4, 3), (-2, -1)])
def test_pieces_refuse_bad_ranges(lo, hi):
    (saved,) = build_layout([("u", [("w", (10,))])], 4).units
    with pytest.raises(ValueError, match=r"unit u .*0 <= lo <= hi"):
        pieces(saved, lo, hi)


# ---- 1b. the same, through real rank files and the reader


def fake_engine(layout, rank: int, states: dict[str, dict[str, np.ndarray]]):
    """What write_rank_file and build_manifest use of an engine, lending slices of
    known buffers, so a W-rank checkpoint can be written in one process."""

    def owned_state(kind, unit):
        return rank_rows(padded(unit, states[kind]), unit)[rank]

    return SimpleNamespace(
        layout=layout, rank=rank, shard_rank=rank, world=layout.world_size, stage=3, step_count=7,
        owned_state=owned_state, cfg=ZeroConfig(), scaler=None,
        release_offloaded=lambda: None, release_pages=lambda view: None,
    )  # fmt: skip


def streamable(layout) -> bool:
    """False where write_rank_file fails: after the last unit with elements, an empty
    slice is taken for the next kind (test_write_rank_file_with_a_trailing_empty_unit)."""
    return bool(layout.units) and layout.units[-1].numel > 0


def write_whole_buffers(engine, path: Path) -> dict:
    """write_rank_file's result, each kind written as one whole shard buffer."""
    layout, shard = engine.layout, (engine.layout.shard_numel,)
    with SafetensorsWriter(path, [(kind, shard) for kind in STATE_KINDS]) as writer:
        for kind in STATE_KINDS:
            units = [engine.owned_state(kind, u) for u in layout.units]
            writer.write(kind, np.concatenate([np.empty(0, np.float32), *units]))
    return {"rank": engine.rank, "file": path.name, "bytes": writer.nbytes, "crc32": writer.crc32}


def write_fake_checkpoint(directory: Path, layout, step: int, seed: int) -> dict:
    """A complete checkpoint of `layout` (every rank's file, manifest, latest) holding
    distinct values per kind; returns {kind: {unit name: real elements}}."""
    states = {kind: real_values(layout, seed + i) for i, kind in enumerate(STATE_KINDS)}
    tag = tag_for(step)
    partial = directory / f".{tag}.partial"
    partial.mkdir(parents=True)
    write = write_rank_file if streamable(layout) else write_whole_buffers
    entries = [
        write(fake_engine(layout, r, states), partial / rank_file_name(r))
        for r in range(layout.world_size)
    ]
    manifest = build_manifest(fake_engine(layout, 0, states), step, entries, {"seed": seed})
    (partial / MANIFEST).write_text(json.dumps(manifest))
    _publish(directory, partial, tag)
    (directory / LATEST).write_text(tag + "\n")
    return states


@settings(max_examples=15, **SETTINGS)
@given(units=unit_specs, w1=worlds, w2=worlds, seed=seeds)
@example(units=[("u0", [("t0", (3, 5))]), ("u1", [("t0", (1,))])], w1=6, w2=4, seed=0)
def test_reader_reshards_a_checkpoint_written_by_w1_ranks(units, w1, w2, seed):
    old, new = build_layout(units, w1), build_layout(units, w2)
    with tempfile.TemporaryDirectory() as tmp:
        states = write_fake_checkpoint(Path(tmp), old, 5, seed)
        ckpt = Checkpoint(tmp)
        try:
            assert ckpt.verify(range(w1)) == []
            assert ckpt.manifest["optimizer_steps"] == 7 and ckpt.step == 5
            for kind in STATE_KINDS:
                for unit in new.units:
                    expected = padded(unit, states[kind])
                    for rank in range(w2):
                        lo = rank * unit.shard_numel
                        out = np.full(unit.shard_numel, np.nan, np.float32)
                        ckpt.source(kind).fill_unit(unit, out, lo, lo + unit.shard_numel)
                        np.testing.assert_array_equal(out, expected[lo : lo + unit.shard_numel])
            out_path = Path(tmp) / "all.safetensors"
            consolidate(ckpt, out_path, optimizer_states=True, window=2)
        finally:
            ckpt.close()
        got = load_named(out_path)
        for unit in old.units:
            for prefix, kind in [("", "param"), ("exp_avg.", "exp_avg")]:
                views = tensor_views(padded(unit, states[kind]), unit)
                for name, view in views.items():
                    np.testing.assert_array_equal(got[f"{prefix}{unit.name}.{name}"], view)


@pytest.mark.parametrize(
    "units",
    [
        [("u0", [("t0", (3,))]), ("u1", [("t0", (0,))])],  # a unit of nothing at the end
        [("u0", [("t0", (0,))]), ("u1", [])],  # a model of nothing: shard_numel 0
    ],
)
def test_write_rank_file_with_a_trailing_empty_unit(tmp_path, units):
    """A unit's empty slice after `param` is complete is no piece of `exp_avg`, and a
    model of nothing still writes its three (empty) tensors."""
    layout = build_layout(units, 2)
    states = {kind: real_values(layout, 0) for kind in STATE_KINDS}
    write_rank_file(fake_engine(layout, 1, states), tmp_path / rank_file_name(1))


def test_write_rank_file_streams_what_whole_buffers_hold(tmp_path):
    layout = build_layout([("a", [("w", (5,)), ("s", ())]), ("b", []), ("c", [("w", (4,))])], 3)
    states = {kind: real_values(layout, i) for i, kind in enumerate(STATE_KINDS)}
    for rank in range(3):
        engine = fake_engine(layout, rank, states)
        streamed = write_rank_file(engine, tmp_path / "streamed.safetensors")
        whole = write_whole_buffers(engine, tmp_path / "whole.safetensors")
        assert {**streamed, "file": "whole.safetensors"} == whole
        data = (tmp_path / "whole.safetensors").read_bytes()
        assert (tmp_path / "streamed.safetensors").read_bytes() == data
        expected = rank_files(layout, states["exp_avg"])[rank]
        np.testing.assert_array_equal(
            load_file(str(tmp_path / "whole.safetensors"))["exp_avg"], expected
        )


# ---- 2. the layout in the manifest


@settings(max_examples=30, **SETTINGS)
@given(units=unit_specs, world=worlds)
def test_layout_record_round_trips_through_json(units, world):
    layout = build_layout(units, world)
    record = json.loads(json.dumps(layout_record(layout)))
    assert layout_from_record(record, "m.json") == layout


def small_record() -> dict:
    units = [("a", [("w", (3, 2)), ("b", (2,))]), ("c", [("s", ())])]
    return json.loads(json.dumps(layout_record(build_layout(units, 3))))


def _edit_offset(r):
    r["units"][0]["tensors"][1]["offset"] += 1


def _edit_unit_size(r):
    r["units"][1]["padded_numel"] = 6


def _edit_shard_offset(r):
    r["units"][1]["shard_offset"] = 0


def _edit_total(r):
    r["shard_numel"] += 1


def _edit_shape(r):
    r["units"][0]["tensors"][0]["shape"] = [2, 3]  # same numel, other shape: still caught?


@pytest.mark.parametrize(
    "edit", [_edit_offset, _edit_unit_size, _edit_shard_offset, _edit_total, _edit_shape]
)
def test_layout_record_with_an_edited_number_is_refused(edit):
    record = small_record()
    edit(record)
    if edit is _edit_shape:  # a consistent shape change rebuilds to a consistent layout
        assert layout_from_record(record, "m.json").units[0].slots[0].shape == (2, 3)
        return
    with pytest.raises(CheckpointError, match=r"^/ck/manifest\.json: .*edited or damaged"):
        layout_from_record(record, "/ck/manifest.json")


def _drop_shape(r):
    del r["units"][0]["tensors"][0]["shape"]


def _drop_units(r):
    del r["units"]


def _drop_world(r):
    del r["world_size"]


def _negative_shape(r):
    r["units"][0]["tensors"][1]["shape"] = [-2]


def _zero_world(r):
    r["world_size"] = 0


def _tensors_not_a_list(r):
    r["units"][0]["tensors"] = 7


@pytest.mark.parametrize(
    "edit",
    [_drop_shape, _drop_units, _drop_world, _negative_shape, _zero_world, _tensors_not_a_list],
)
def test_layout_record_that_cannot_be_read_is_refused(edit):
    record = small_record()
    edit(record)
    with pytest.raises(CheckpointError, match=r"^/ck/manifest\.json: the layout cannot be read"):
        layout_from_record(record, "/ck/manifest.json")


# ---- 3. the manifest and the tag folders


def valid_manifest() -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": 3,
        "optimizer_steps": 3,
        "world_size": 1,
        "stage": 1,
        "layout": layout_record(build_layout([("u", [("w", (2,))])], 1)),
        "files": [],
        "training": {},
    }


def write_manifest(folder: Path, content) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_read_manifest_reads_a_valid_one(tmp_path):
    write_manifest(tmp_path, valid_manifest())
    assert read_manifest(tmp_path) == valid_manifest()


def _without(key):
    m = valid_manifest()
    del m[key]
    return m


@pytest.mark.parametrize(
    "content, says",
    [
        ("{not json", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        ("", "not valid JSON"),
        ([1, 2], "not a zero_ref checkpoint manifest"),
        ({**valid_manifest(), "format": "other"}, "not a zero_ref checkpoint manifest"),
        (_without("format"), "not a zero_ref checkpoint manifest"),
        ({**valid_manifest(), "format_version": 2}, "format version 2; this zero_ref reads"),
        ({**valid_manifest(), "format_version": "1"}, "format version '1'"),
        (_without("format_version"), "format version None"),
        *[(_without(key), f"has no '{key}'") for key in ("step", "layout", "files", "training")],
        *[(_without(key), f"has no '{key}'") for key in ("optimizer_steps", "world_size")],
    ],
)
def test_read_manifest_refuses_a_bad_one_naming_its_path(tmp_path, content, says):
    path = write_manifest(tmp_path / "step_000003", content)
    with pytest.raises(CheckpointError) as caught:
        read_manifest(path.parent)
    assert str(caught.value).startswith(f"{path}: ")
    assert says in str(caught.value)


def test_read_manifest_of_a_folder_without_one(tmp_path):
    with pytest.raises(CheckpointError, match=rf"^{tmp_path}/manifest\.json: no manifest"):
        read_manifest(tmp_path)


def make_tags(directory: Path, *steps: int) -> list[Path]:
    folders = [directory / tag_for(s) for s in steps]
    for folder in folders:
        write_manifest(folder, valid_manifest())
    return folders


def test_resolve_tag_of_a_tag_folder_and_of_latest(tmp_path):
    first, second = make_tags(tmp_path, 1, 2)
    assert resolve_tag(first) == first
    assert resolve_tag(str(second)) == second
    (tmp_path / LATEST).write_text("step_000001\n")
    assert resolve_tag(tmp_path) == first
    bare = tmp_path / "step_000009"  # named like a tag: taken as one even without a manifest
    bare.mkdir()
    assert resolve_tag(bare) == bare
    other = tmp_path / "renamed"  # any name, if it holds a manifest
    write_manifest(other, valid_manifest())
    assert resolve_tag(other) == other


def test_resolve_tag_without_latest_lists_the_tags(tmp_path):
    make_tags(tmp_path, 2, 1)
    (tmp_path / ".step_000003.partial").mkdir()
    (tmp_path / "notes").mkdir()
    with pytest.raises(CheckpointError) as caught:
        resolve_tag(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}: no 'latest' file")
    assert message.endswith("it holds step_000001, step_000002: name one")


def test_resolve_tag_without_latest_or_tags(tmp_path):
    with pytest.raises(CheckpointError, match=r"no 'latest' file, so no complete checkpoint$"):
        resolve_tag(tmp_path)


@pytest.mark.parametrize("name", ["nowhere", "step_000004"])
def test_resolve_tag_of_a_missing_folder(tmp_path, name):
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / name}: no such checkpoint folder"):
        resolve_tag(tmp_path / name)


def test_resolve_tag_when_latest_names_a_missing_tag(tmp_path):
    make_tags(tmp_path, 1)
    (tmp_path / LATEST).write_text("step_000002\n")
    with pytest.raises(CheckpointError) as caught:
        resolve_tag(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / LATEST}: names step_000002, but {tmp_path / 'step_000002'} does not exist"
    )


@pytest.mark.parametrize("garbage", ["", "../step_000001", "step_12", "step_000001/x", "latest"])
def test_resolve_tag_when_latest_names_garbage(tmp_path, garbage):
    make_tags(tmp_path, 1)
    (tmp_path / LATEST).write_text(garbage)
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / LATEST}: names .*not a checkpoint"):
        resolve_tag(tmp_path)


def test_tags_in_sorts_by_step_and_skips_the_rest(tmp_path):
    make_tags(tmp_path, 10, 2, 1000000, 999999)
    (tmp_path / ".step_000003.partial").mkdir()
    (tmp_path / "step_3").mkdir()
    (tmp_path / LATEST).write_text("step_000010")
    assert [(s, p.name) for s, p in tags_in(tmp_path)] == [
        (2, "step_000002"),
        (10, "step_000010"),
        (999999, "step_999999"),
        (1000000, "step_1000000"),
    ]


# ---- 4. the writer's housekeeping


def test_tag_and_file_names():
    assert tag_for(0) == "step_000000"
    assert tag_for(123) == "step_000123"
    assert tag_for(1234567) == "step_1234567"
    assert rank_file_name(3) == "rank_00003.safetensors"


def test_remove_unfinished(tmp_path):
    make_tags(tmp_path, 3)
    (tmp_path / ".step_000004.partial").mkdir()
    (tmp_path / ".step_000004.partial" / "rank_00000.safetensors").write_bytes(b"x")
    restored = tmp_path / ".step_000002.replaced"  # killed between _publish's two renames
    write_manifest(restored, valid_manifest())
    (tmp_path / ".step_000003.replaced").mkdir()  # killed while deleting the old copy
    (tmp_path / ".step_000005.partial").write_text("a file, not a save: left alone")
    done = remove_unfinished(tmp_path)
    assert done == [
        ".step_000002.replaced (restored)",
        ".step_000003.replaced",
        ".step_000004.partial",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".step_000005.partial",
        "step_000002",
        "step_000003",
    ]
    assert (tmp_path / "step_000002" / MANIFEST).is_file()
    assert remove_unfinished(tmp_path) == []


def test_publish_replaces_a_tag_of_the_same_name(tmp_path):
    (old,) = make_tags(tmp_path, 4)
    (old / "rank_00000.safetensors").write_text("old")
    partial = tmp_path / ".step_000004.partial"
    partial.mkdir()
    (partial / "rank_00000.safetensors").write_text("new")
    _publish(tmp_path, partial, "step_000004")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000004"]
    assert [p.name for p in old.iterdir()] == ["rank_00000.safetensors"]
    assert (old / "rank_00000.safetensors").read_text() == "new"


@pytest.mark.parametrize(
    "keep_last, keep, left",
    [
        (2, 5, [4, 5]),
        (3, 5, [3, 4, 5]),
        (10, 5, [1, 2, 3, 4, 5]),
        (1, 5, [5]),
        (2, 1, [1, 2, 3, 4, 5]),  # later tags (an abandoned run's): not counted, not touched
        (1, 3, [3, 4, 5]),
        (0, 3, [3, 4, 5]),
        (None, 5, [1, 2, 3, 4, 5]),
    ],
)
def test_prune_keeps_the_newest_and_the_one_just_saved(tmp_path, keep_last, keep, left):
    make_tags(tmp_path, 1, 2, 3, 4, 5)
    (tmp_path / ".step_000000.partial").mkdir()
    pruned = prune(tmp_path, keep_last, keep=tag_for(keep))
    assert [s for s, _ in tags_in(tmp_path)] == left
    assert pruned == [tag_for(s) for s in [1, 2, 3, 4, 5] if s not in left]
    assert (tmp_path / ".step_000000.partial").is_dir()  # not a tag: not prune's business


# ---- 5. the streaming safetensors writer

SPECS = [("a", (2, 3)), ("scalar", ()), ("empty", (0,)), ("d", (7,)), ("wide", (0, 4))]


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SPECS}


def test_write_part_pieces_equal_write_of_whole_tensors(tmp_path):
    named = tensors()
    with SafetensorsWriter(tmp_path / "whole.safetensors", SPECS) as whole:
        for name, t in named.items():
            whole.write(name, t)
    with SafetensorsWriter(tmp_path / "parts.safetensors", SPECS) as parts:
        flat = {k: v.reshape(-1) for k, v in named.items()}
        parts.write_part("a", flat["a"][:2].astype(np.float64))  # converted to float32
        parts.write_part("a", flat["a"][2:2])  # an empty piece mid-tensor
        parts.write_part("a", flat["a"][2:])
        parts.write_part("scalar", flat["scalar"])
        parts.write_part("empty", flat["empty"])
        doubled = np.repeat(flat["d"], 2)
        parts.write_part("d", doubled[:6:2])  # not contiguous
        parts.write_part("d", flat["d"][3:])
        parts.write_part("wide", flat["wide"])
    data = (tmp_path / "whole.safetensors").read_bytes()
    assert (tmp_path / "parts.safetensors").read_bytes() == data
    for writer in (whole, parts):
        assert writer.crc32 == zlib.crc32(data)
        assert writer.nbytes == len(data)
    loaded = load_file(str(tmp_path / "parts.safetensors"))
    assert loaded.keys() == named.keys()
    for name, t in named.items():
        assert loaded[name].dtype == np.float32 and loaded[name].shape == t.shape
        np.testing.assert_array_equal(loaded[name], t)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.safetensors", "whole.safetensors"]


def test_a_file_of_only_a_zero_element_tensor(tmp_path):
    path = tmp_path / "z.safetensors"
    with SafetensorsWriter(path, [("z", (0, 3))]) as writer:
        writer.write_part("z", np.empty(0, np.float32))
    assert load_file(str(path))["z"].shape == (0, 3)
    assert writer.nbytes == path.stat().st_size and writer.crc32 == zlib.crc32(path.read_bytes())


@pytest.mark.parametrize(
    "steps, says",
    [
        ([("a", 7)], "expected 6 more elements of a next, got 7 of a"),
        ([("a", 4), ("a", 3)], "expected 2 more elements of a next, got 3 of a"),
        ([("scalar", 1)], "expected 6 more elements of a next, got 1 of scalar"),
        ([("a", 6), ("a", 1)], "expected 1 more elements of scalar next, got 1 of a"),
        (
            [("a", 6), ("scalar", 1), ("empty", 0), ("d", 7), ("wide", 0), ("x", 0)],
            "expected 1 more elements of None next, got 0 of x",
        ),
    ],
)
def test_write_part_refuses_too_many_elements_or_the_wrong_name(tmp_path, steps, says):
    path = tmp_path / "t.safetensors"
    with pytest.raises(ValueError, match=rf"^{path}: {says}"):  # noqa: SIM117
        with SafetensorsWriter(path, SPECS) as writer:
            for name, numel in steps:
                writer.write_part(name, np.zeros(numel, np.float32))
    assert list(tmp_path.iterdir()) == []  # the temporary is gone, nothing under the real name


def test_write_refuses_a_wrong_shape_or_a_tensor_begun_in_parts(tmp_path):
    writer = SafetensorsWriter(tmp_path / "t.safetensors", SPECS)
    with pytest.raises(ValueError, match="expected a"):
        writer.write("a", np.zeros((3, 2), np.float32))
    writer.write_part("a", np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="expected a"):
        writer.write("a", np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="4 tensors never written"):
        writer.write_part("a", np.zeros(4, np.float32))
        writer.close()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


# ---- 6. a real engine at world size 1: save, verify, consolidate, resume

MODEL = GPT(GPTConfig(vocab_size=11, context=5, n_layer=2, n_head=2, d_model=8))


@pytest.fixture(scope="module", params=[0, 1, 2, 3], ids=lambda s: f"stage{s}")
def saved(request, tmp_path_factory):
    """An engine trained 2 steps at world size 1 and its checkpoint (read-only: tests
    that damage files damage a copy)."""
    cfg = ZeroConfig(stage=request.param, deterministic=True)
    comm = comm_for(MPI.COMM_SELF, cfg)
    engine = make_engine(MODEL, RandomInit(MODEL, 0), cfg, comm)
    rng = np.random.default_rng(0)
    for _ in range(2):
        engine.train_step(rng.integers(0, 11, (1, 2, 5)), rng.integers(0, 11, (1, 2, 5)))
    directory = tmp_path_factory.mktemp(f"ckpt_stage{request.param}")
    result = save_checkpoint(engine, directory, 2, {"data_position": 4})
    return SimpleNamespace(engine=engine, cfg=cfg, comm=comm, dir=directory, result=result)


def damaged_copy(saved, tmp_path) -> tuple[Path, Path]:
    folder = tmp_path / "step_000002"
    shutil.copytree(saved.dir / "step_000002", folder)
    return folder, folder / rank_file_name(0)


def test_save_writes_a_sound_checkpoint(saved):
    assert saved.result.folder == saved.dir / "step_000002"
    assert (saved.dir / LATEST).read_text() == "step_000002\n"
    assert sorted(p.name for p in saved.dir.iterdir()) == [LATEST, "step_000002"]
    ckpt = Checkpoint(saved.dir)
    assert ckpt.verify(range(1)) == []
    assert ckpt.manifest["optimizer_steps"] == saved.engine.step_count == 2
    assert ckpt.manifest["stage"] == saved.cfg.stage and ckpt.manifest["training"] == {
        "data_position": 4
    }
    assert ckpt.layout == saved.engine.layout
    (entry,) = ckpt.manifest["files"]
    assert entry["bytes"] == saved.result.bytes == ckpt.path_of(0).stat().st_size
    assert entry["crc32"] == zlib.crc32(ckpt.path_of(0).read_bytes())
    ckpt.close()


def test_verify_names_a_flipped_byte(saved, tmp_path):
    folder, rank_file = damaged_copy(saved, tmp_path)
    data = bytearray(rank_file.read_bytes())
    data[-5] ^= 0x01  # inside exp_avg_sq: the header still parses
    rank_file.write_bytes(bytes(data))
    (problem,) = Checkpoint(folder).verify(range(1))
    assert problem.startswith(f"{rank_file}: CRC-32 ") and "the file is damaged" in problem
    with pytest.raises(CheckpointError, match="CRC-32"):
        consolidate(Checkpoint(folder), tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_verify_names_a_truncated_or_missing_file(saved, tmp_path):
    folder, rank_file = damaged_copy(saved, tmp_path)
    size = rank_file.stat().st_size
    os.truncate(rank_file, size - 4)
    ckpt = Checkpoint(folder)
    assert ckpt.verify(range(1)) == [
        f"{rank_file}: truncated: {size - 4} bytes, the manifest says {size}"
    ]
    last = ckpt.layout.units[-1]
    with pytest.raises(CheckpointError, match=rf"^{rank_file}: truncated: exp_avg_sq of head"):
        ckpt.read_range("exp_avg_sq", last, 0, last.padded_numel, np.empty(last.padded_numel))
    ckpt.close()
    rank_file.unlink()
    assert Checkpoint(folder).verify(range(1)) == [f"{rank_file}: missing"]


def test_consolidate_streams_every_tensor_bitwise(saved, tmp_path):
    ckpt = Checkpoint(saved.dir)
    out = consolidate(ckpt, tmp_path / "model.safetensors", optimizer_states=True, window=3)
    ckpt.close()
    got = load_named(out.path)
    full = full_parameters(saved.engine)
    assert out.tensors == 3 * len(full) == len(got)
    assert out.bytes == out.path.stat().st_size
    for name, tensor in full.items():
        assert got[name].shape == tensor.shape
        assert got[name].tobytes() == tensor.astype(np.float32).tobytes(), name
    for unit in saved.engine.layout.units:  # world 1: a rank's slice is the whole unit
        for kind in ("exp_avg", "exp_avg_sq"):
            views = tensor_views(saved.engine.owned_state(kind, unit), unit)
            for name, view in views.items():
                assert got[f"{kind}.{unit.name}.{name}"].tobytes() == view.tobytes()
    assert np.any(got["exp_avg.head.lm_head.weight"] != 0)  # trained: m is not all zeros


def test_engine_rebuilt_from_the_checkpoint_has_the_same_state(saved):
    ckpt = Checkpoint(saved.dir)
    ckpt.check_model(MODEL)
    rebuilt = make_engine(MODEL, ckpt.source("param"), saved.cfg, saved.comm)
    for kind in ("exp_avg", "exp_avg_sq"):
        rebuilt.load_state(kind, ckpt.source(kind))
    ckpt.close()
    for kind in STATE_KINDS:
        for unit in saved.engine.layout.units:
            mine = saved.engine.owned_state(kind, unit)
            assert rebuilt.owned_state(kind, unit).tobytes() == mine.tobytes(), (kind, unit.name)


@pytest.mark.parametrize(
    "other, says",
    [
        (GPTConfig(13, 5, 2, 2, 8), r"embed\.token\.weight \(11, 8\) there, .*\(13, 8\) here"),
        (GPTConfig(11, 6, 2, 2, 8), r"embed\.position\.weight \(5, 8\) there"),
        (GPTConfig(11, 5, 2, 2, 4), r"embed\.token\.weight \(11, 8\) there, .*\(11, 4\) here"),
        (GPTConfig(11, 5, 3, 2, 8), r"units \[embed, block0\.attn, .*\] there"),
    ],
)
def test_check_model_refuses_another_model(saved, other, says):
    ckpt = Checkpoint(saved.dir)
    with pytest.raises(CheckpointError, match=rf"^{saved.dir}/step_000002: saved for another"):
        ckpt.check_model(GPT(other), flags_hint=" (check --vocab)")
    with pytest.raises(CheckpointError, match=says + r".* \(check --vocab\)$"):
        ckpt.check_model(GPT(other), flags_hint=" (check --vocab)")
    ckpt.close()


def test_save_again_replaces_prunes_and_cleans_up(saved, tmp_path):
    if saved.cfg.stage != 1:
        pytest.skip("the writer's housekeeping does not depend on the stage")
    (tmp_path / ".step_000009.partial").mkdir()  # left by a killed save
    for step in (1, 2, 3, 3):
        result = save_checkpoint(saved.engine, tmp_path, step, {}, keep_last=2)
    assert result.removed == [] and result.pruned == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step_000002", "step_000003"]
    assert Checkpoint(tmp_path).folder == tmp_path / "step_000003"
    assert Checkpoint(tmp_path).verify(range(1)) == []
