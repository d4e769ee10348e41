"""The checkpoint format: a tag folder of per-rank safetensors files and a manifest.

    DIR/latest                   the name of the newest complete tag, e.g. "step_000123"
    DIR/step_000123/manifest.json
    DIR/step_000123/rank_00000.safetensors ... rank_{W-1}.safetensors

Rank r's file holds three 1-D float32 tensors, "param", "exp_avg" and
"exp_avg_sq", each rank r's shard buffer: its slice of unit 0, then of unit 1,
... (zero_ref/layout/flat.py). Every stage saves exactly these slices (stage 0
keeps the whole model but writes only its own slice), so a checkpoint does not
depend on the stage that wrote it, and resharding is only re-cutting ranges
(zero_ref/checkpoint/reshard.py).

The manifest is plain JSON (never a pickle): format and version, who wrote it
(zero_ref version, world size, stage), the flat layout (every unit's tensors,
shapes and offsets, padded sizes and slice boundaries), each rank file's size
and CRC-32, and the training state (step, learning-rate schedule, data
position, random state, config).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from zero_ref.layout.flat import FlatLayout, build_layout

FORMAT = "zero_ref checkpoint"
FORMAT_VERSION = 1
STATE_KINDS = ("param", "exp_avg", "exp_avg_sq")  # the tensors of every rank file
MANIFEST = "manifest.json"
LATEST = "latest"
TAG = re.compile(r"^step_(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with the file and what is wrong with it."""


def tag_for(step: int) -> str:
    """The folder name of the checkpoint taken after optimizer step `step`."""
    return f"step_{step:06d}"


def rank_file_name(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


def layout_record(layout: FlatLayout) -> dict[str, Any]:
    """The flat layout as plain data: enough to find any element in the rank files."""
    record = {
        "world_size": layout.world_size,
        "numel": layout.numel,
        "full_numel": layout.full_numel,
        "shard_numel": layout.shard_numel,
        "units": [
            {
                "name": u.name,
                "numel": u.numel,
                "padded_numel": u.padded_numel,
                "full_offset": u.full_offset,
                "shard_offset": u.shard_offset,
                "shard_numel": u.shard_numel,
                "tensors": [
                    {"name": s.name, "shape": list(s.shape), "offset": s.offset} for s in u.slots
                ],
            }
            for u in layout.units
        ],
    }
    if layout.align != 1:  # qwZ's blocks: units padded to whole blocks per rank
        record["align"] = layout.align
    return record


def layout_from_record(record: dict[str, Any], where: str) -> FlatLayout:
    """Rebuild the layout a manifest describes, and check every number it states
    against the rebuilt one (a hand-edited or damaged manifest is refused)."""
    try:
        units = [
            (u["name"], [(t["name"], tuple(t["shape"])) for t in u["tensors"]])
            for u in record["units"]
        ]
        layout = build_layout(units, int(record["world_size"]), int(record.get("align", 1)))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{where}: the layout cannot be read ({type(e).__name__}: {e})"
        ) from None
    if layout_record(layout) != record:
        raise CheckpointError(
            f"{where}: the layout's offsets or sizes are not those of its own tensors "
            "(the manifest was edited or damaged)"
        )
    return layout


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a tag folder, checked for format and version."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: no manifest (not a zero_ref checkpoint, or a partial save)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: the manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a zero_ref checkpoint manifest (no format {FORMAT!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {version!r}; this zero_ref reads version {FORMAT_VERSION}"
        )
    for key in ("step", "optimizer_steps", "world_size", "stage", "layout", "files", "training"):
        if key not in manifest:
            raise CheckpointError(f"{path}: the manifest has no {key!r}")
    return manifest


def resolve_tag(path: str | Path) -> Path:
    """The tag folder `path` names: a tag folder itself, or a checkpoint folder whose
    `latest` file names one."""
    path = Path(path)
    if (path / MANIFEST).exists() or TAG.match(path.name):
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such checkpoint folder")
        return path
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    latest = path / LATEST
    if not latest.is_file():
        tags = sorted(p.name for p in path.iterdir() if TAG.match(p.name))
        hint = f"; it holds {', '.join(tags)}: name one" if tags else ""
        raise CheckpointError(f"{path}: no '{LATEST}' file, so no complete checkpoint{hint}")
    tag = latest.read_text(encoding="utf-8").strip()
    if not TAG.match(tag):
        raise CheckpointError(f"{latest}: names {tag!r}, which is not a checkpoint tag")
    folder = path / tag
    if not folder.is_dir():
        replaced = path / f".{tag}.replaced"
        if (replaced / MANIFEST).is_file():  # a kill mid-way through re-saving this tag
            return replaced
        raise CheckpointError(f"{latest}: names {tag}, but {folder} does not exist")
    return folder


def tags_in(directory: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete-looking tag folder in `directory`, oldest first."""
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := TAG.match(p.name))]
    return sorted(found)
