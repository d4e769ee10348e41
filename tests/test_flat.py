"""Layout math (zero_ref.layout.flat) and bucket plans (zero_ref.layout.buckets): pure integers.

Every element of every unit is owned by exactly one rank, views are views (not
copies), offsets leave no gaps, and buckets cover the units exactly once in
the order backward produces them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.layout.buckets import plan_buckets
from zero_ref.layout.flat import (
    FlatLayout,
    build_layout,
    padded_numel,
    rank_rows,
    shard_range,
    tensor_views,
)

# 0-d scalars, zero-size tensors, primes and small matrices with a zero side
shapes = st.one_of(
    st.just(()),
    st.tuples(st.sampled_from([0, 1, 2, 3, 5, 7, 11, 13])),
    st.tuples(st.integers(0, 7), st.integers(0, 9)),
    st.tuples(st.integers(1, 3), st.integers(0, 3), st.integers(1, 4)),
)
unit_specs = st.lists(st.lists(shapes, min_size=0, max_size=4), min_size=0, max_size=6).map(
    lambda us: [(f"u{i}", [(f"t{j}", s) for j, s in enumerate(ts)]) for i, ts in enumerate(us)]
)
worlds = st.integers(1, 8)


def numel_of(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---- padded_numel and shard_range


@pytest.mark.parametrize("world", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("numel", [0, 1, 7, 13, 1009])
def test_padded_numel_is_the_smallest_multiple(numel, world):
    padded = padded_numel(numel, world)
    assert padded % world == 0
    assert numel <= padded < numel + world
    assert padded_numel(0, world) == 0


@pytest.mark.parametrize("world", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("numel", [0, 1, 7, 13, 1009])
def test_shard_ranges_tile_the_padded_range(numel, world):
    owner = np.zeros(padded_numel(numel, world), np.int64)
    for rank in range(world):
        info = shard_range(numel, rank, world)
        assert info.numel == padded_numel(numel, world) // world
        assert info.offset == rank * info.numel
        owner[info.offset : info.offset + info.numel] += 1
    assert np.all(owner == 1)


@pytest.mark.parametrize("world", [0, -1])
def test_padded_numel_rejects_world(world):
    with pytest.raises(ValueError, match="world_size"):
        padded_numel(5, world)


def test_padded_numel_rejects_negative_numel():
    with pytest.raises(ValueError, match="numel=-1"):
        padded_numel(-1, 2)


@pytest.mark.parametrize("rank, world", [(-1, 3), (3, 3), (4, 3), (0, 0)])
def test_shard_range_rejects_bad_rank(rank, world):
    with pytest.raises(ValueError, match=f"rank={rank}"):
        shard_range(10, rank, world)


# ---- build_layout


def check_offsets(layout: FlatLayout, specs) -> None:
    """Units follow each other with no gap in the full and the shard buffer; tensors too."""
    world = layout.world_size
    full_offset = shard_offset = 0
    for unit, (name, tensors) in zip(layout.units, specs, strict=True):
        assert unit.name == name
        assert unit.full_offset == full_offset and unit.shard_offset == shard_offset
        offset = 0
        for slot, (tname, shape) in zip(unit.slots, tensors, strict=True):
            assert (slot.name, slot.shape, slot.offset) == (tname, tuple(shape), offset)
            offset += numel_of(shape)
        assert unit.numel == offset
        assert unit.padded_numel == padded_numel(offset, world)
        assert unit.shard_numel * world == unit.padded_numel
        full_offset += unit.padded_numel
        shard_offset += unit.shard_numel
    assert layout.full_numel == full_offset
    assert layout.shard_numel == shard_offset
    assert layout.full_numel == layout.shard_numel * world
    assert layout.numel == sum(numel_of(s) for _, ts in specs for _, s in ts)


@settings(max_examples=60, deadline=None)
@given(unit_specs, worlds)
def test_layout_offsets_are_contiguous_and_padded(specs, world):
    layout = build_layout(specs, world)
    assert layout.world_size == world
    check_offsets(layout, specs)
    assert layout.names() == [f"{u}.{t}" for u, ts in specs for t, _ in ts]


@settings(max_examples=60, deadline=None)
@given(unit_specs, worlds)
def test_views_share_memory_with_the_buffer(specs, world):
    layout = build_layout(specs, world)
    full = np.arange(layout.full_numel, dtype=np.float32)
    for unit in layout.units:
        unit_buffer = full[unit.full_slice()]
        views = tensor_views(unit_buffer, unit)
        assert list(views) == [s.name for s in unit.slots]
        for slot in unit.slots:
            view = views[slot.name]
            assert view.shape == slot.shape and view.dtype == np.float32
            expected = unit.full_offset + slot.offset + np.arange(slot.numel)
            np.testing.assert_array_equal(view.reshape(-1), expected.astype(np.float32))
            if slot.numel:  # a zero-size array shares no memory with anything
                assert np.shares_memory(view, full)
        # writing through a view writes the buffer
        for slot in unit.slots:
            views[slot.name][...] = -1.0
        if unit.numel:
            assert np.all(unit_buffer[: unit.numel] == -1.0)
        assert np.all(unit_buffer[unit.numel :] >= 0)  # padding untouched


@settings(max_examples=60, deadline=None)
@given(unit_specs, worlds)
def test_every_element_has_exactly_one_owner(specs, world):
    layout = build_layout(specs, world)
    full = np.arange(layout.full_numel, dtype=np.float32)
    owner = np.zeros(layout.full_numel, np.int64)
    shards = [np.empty(layout.shard_numel, np.float32) for _ in range(world)]
    for unit in layout.units:
        unit_buffer = full[unit.full_slice()]
        rows = rank_rows(unit_buffer, unit)  # (world, shard_numel)
        assert rows.shape == (world, unit.shard_numel)
        for rank in range(world):
            info = shard_range(unit.numel, rank, world)
            assert info.numel == unit.shard_numel
            start = unit.full_offset + info.offset
            owner[start : start + info.numel] += 1
            np.testing.assert_array_equal(rows[rank], full[start : start + info.numel])
            if info.numel:
                assert np.shares_memory(rows[rank], full)
            shards[rank][unit.shard_slice()] = rows[rank]
    assert np.all(owner == 1)
    # the shard buffers, row by row, hold the full buffer exactly once
    if layout.full_numel:
        gathered = np.sort(np.concatenate(shards))
        np.testing.assert_array_equal(gathered, full)


def test_zero_d_and_zero_size_tensors():
    layout = build_layout([("a", [("s", ()), ("e", (0, 3)), ("v", (5,))]), ("b", [])], 3)
    a, b = layout.units
    assert [s.numel for s in a.slots] == [1, 0, 5]
    assert [s.offset for s in a.slots] == [0, 1, 1]
    assert (a.numel, a.padded_numel, a.shard_numel) == (6, 6, 2)
    assert (b.numel, b.padded_numel, b.shard_numel, b.full_offset) == (0, 0, 0, 6)
    views = tensor_views(np.arange(6, dtype=np.float32), a)
    assert views["s"].shape == () and views["s"] == 0
    assert views["e"].shape == (0, 3)
    np.testing.assert_array_equal(views["v"], [1, 2, 3, 4, 5])


def test_negative_shape_is_rejected():
    with pytest.raises(ValueError, match=r"u\.w: shape \(2, -1\) has a negative size"):
        build_layout([("u", [("w", (2, -1))])], 2)


def test_duplicate_name_is_rejected():
    with pytest.raises(ValueError, match=r"u\.w appears twice"):
        build_layout([("u", [("w", (2,)), ("w", (3,))])], 2)
    with pytest.raises(ValueError, match=r"u\.w appears twice"):
        build_layout([("u", [("w", (2,))]), ("u", [("w", (2,))])], 1)


@pytest.mark.parametrize("world", [0, -2])
def test_build_layout_rejects_world(world):
    with pytest.raises(ValueError, match=f"world_size={world}"):
        build_layout([("u", [("w", (2,))])], world)


# ---- plan_buckets


def layout_and_buckets(specs, world, bucket_numel):
    layout = build_layout(specs, world)
    units = layout.units
    buckets = plan_buckets(
        [u.shard_numel for u in units], [u.shard_offset for u in units], bucket_numel, world
    )
    return layout, buckets


@settings(max_examples=80, deadline=None)
@given(unit_specs, worlds, st.integers(1, 120))
def test_buckets_tile_the_shard_space_from_the_top(specs, world, bucket_numel):
    layout, buckets = layout_and_buckets(specs, world, bucket_numel)
    top = layout.shard_numel
    for b in buckets:  # in firing order: each ends where the one before began
        assert b.shard_offset + b.shard_numel == top and b.shard_numel >= 1
        top = b.shard_offset
    assert top == 0


@settings(max_examples=80, deadline=None)
@given(unit_specs, worlds, st.integers(1, 120))
def test_staging_never_exceeds_the_bucket_size(specs, world, bucket_numel):
    """Every bucket is bucket_numel // W columns wide (at least 1), the lowest may be less:
    a unit wider than that is cut into pieces instead of widening the staging."""
    layout, buckets = layout_and_buckets(specs, world, bucket_numel)
    columns = max(1, bucket_numel // world)
    assert all(b.shard_numel == columns for b in buckets[:-1])
    assert all(world * b.shard_numel <= max(bucket_numel, world) for b in buckets)


@settings(max_examples=80, deadline=None)
@given(unit_specs, worlds, st.integers(1, 120))
def test_a_bucket_fires_after_the_lowest_unit_it_touches(specs, world, bucket_numel):
    layout, buckets = layout_and_buckets(specs, world, bucket_numel)
    for b in buckets:
        touching = [
            i
            for i, u in enumerate(layout.units)
            if u.shard_numel
            and u.shard_offset < b.shard_offset + b.shard_numel
            and b.shard_offset < u.shard_offset + u.shard_numel
        ]
        assert (b.first_unit, b.last_unit) == (touching[0], touching[-1])


def test_a_wide_unit_is_cut_into_pieces():
    # 2 ranks, shard widths 20, 2, 15, 25 (62 columns); bucket 20 elements = 10 columns
    buckets = plan_buckets([20, 2, 15, 25], [0, 20, 22, 37], 20, 2)
    assert [(b.first_unit, b.last_unit) for b in buckets] == [
        (3, 3), (3, 3), (2, 3), (2, 2), (0, 1), (0, 0), (0, 0),
    ]  # fmt: skip
    assert [(b.shard_offset, b.shard_numel) for b in buckets] == [
        (52, 10), (42, 10), (32, 10), (22, 10), (12, 10), (2, 10), (0, 2),
    ]  # fmt: skip


def test_small_units_share_a_bucket():
    buckets = plan_buckets([3, 3, 3, 3, 3], [0, 3, 6, 9, 12], 6, 1)
    assert [(b.first_unit, b.last_unit) for b in buckets] == [(3, 4), (1, 2), (0, 0)]


def test_no_units_no_buckets():
    assert len(plan_buckets([], [], 10, 4)) == 0 and list(plan_buckets([], [], 10, 4)) == []


@pytest.mark.parametrize("bucket_numel", [0, -1])
def test_bucket_numel_must_be_positive(bucket_numel):
    with pytest.raises(ValueError, match=f"bucket_numel={bucket_numel}"):
        plan_buckets([4, 4], [0, 2], bucket_numel, 2)


def test_who_owns_which_elements_of_a_3x2_and_a_2_element_tensor_on_4_ranks():
    """docs/oracle.md's worked example: 8 elements, 2 per rank; the weight's flat
    elements 0-5 go to ranks 0-2 in pairs, the bias to rank 3. An odd size pads."""
    from zero_ref.layout.flat import model_layout, ownership
    from zero_ref.testing.replay import ReplayModel

    model = ReplayModel([("hidden", [("weight", (3, 2)), ("bias", (2,))])])
    assert ownership(model_layout(model, 4)) == [
        ("hidden.weight", 0, 0, 2),
        ("hidden.weight", 1, 2, 4),
        ("hidden.weight", 2, 4, 6),
        ("hidden.bias", 3, 0, 2),
    ]
    odd = ReplayModel([("u", [("w", (5,))])])  # padded to 8: rank 2 ends with padding
    assert ownership(model_layout(odd, 4)) == [
        ("u.w", 0, 0, 2),
        ("u.w", 1, 2, 4),
        ("u.w", 2, 4, 5),
        ("u (padding)", 2, 0, 1),
        ("u (padding)", 3, 1, 3),
    ]
