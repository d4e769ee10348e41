"""Unknown keys of a DeepSpeed-style config: the nearest known key, and when a typo is
an error rather than a warning.

DeepSpeed refuses every key its config models do not name (DeepSpeedConfigModel has
extra="forbid", deepspeed/runtime/config_utils.py ~line 110). zero_ref reads other
frameworks' configs too, so an unknown key is a warning naming the nearest key it
knows, except where the key is a near miss (a few edits) of a key under
zero_optimization, or of that section's own name: a misspelt ZeRO switch
(`zero_quantized_weight`) would otherwise train without what it asks for, so that is
an error. Many unknown keys are summarised: the first few named, then the count.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable

from zero_ref.app.ds_values import ConfigError

ZERO = "zero_optimization"
NEAR_EDITS = 2  # a ZeRO key this many edits (insert, delete, replace) away is a typo
SHOWN = 5  # unknown keys named one by one; the rest are counted


def edit_distance(a: str, b: str, limit: int = NEAR_EDITS) -> int:
    """Levenshtein distance of a and b, or limit + 1 once it is known to exceed limit."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > limit:
            return limit + 1
    return min(row[-1], limit + 1)


def _parent(key: str) -> tuple[str, str]:
    """("zero_optimization", "stage") for "zero_optimization.stage"; ("", k) at the top."""
    head, _, last = key.rpartition(".")
    return head, last


def _siblings(known: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in known:
        head, last = _parent(key)
        out.setdefault(head, []).append(last)
    return out


def near_miss(key: str, siblings: dict[str, list[str]], known: Collection[str]) -> str | None:
    """The ZeRO key `key` is a typo of, or None: a key within NEAR_EDITS of a key in
    the same zero_optimization block, or of the name zero_optimization itself."""
    head, last = _parent(key)
    if head == ZERO or head.startswith(ZERO + "."):
        candidates = siblings.get(head, [])
    elif head == "":
        candidates = [ZERO]
    else:
        return None
    if key in known:
        return None  # a dotted name written inside one object ("a.b": {...}), not a typo
    close = sorted((edit_distance(last, c), c) for c in candidates)
    if not close or close[0][0] > NEAR_EDITS:
        return None
    return f"{head}.{close[0][1]}" if head else close[0][1]


def nearest(key: str, siblings: dict[str, list[str]], known: Collection[str]) -> str | None:
    """The most similar known key beside `key` (difflib's ratio >= 0.6), or None (and
    for a dotted name written inside one object, which is no typo)."""
    if key in known:
        return None
    head, last = _parent(key)
    found = difflib.get_close_matches(last, siblings.get(head, []), n=1)
    if not found:
        return None
    return f"{head}.{found[0]}" if head else found[0]


def refuse_near_misses(unknown: Iterable[str], known: Collection[str]) -> None:
    """ConfigError naming the first unknown key that is a near miss of a ZeRO key."""
    siblings = _siblings(known)
    for key in unknown:
        meant = near_miss(key, siblings, known)
        if meant is not None:
            raise ConfigError(
                f"config {key}: no such key; did you mean {meant}? A near miss of a ZeRO key "
                "is an error, not a warning: the run would go on without what it names"
            )


def unknown_key_notes(unknown: list[str], known: Collection[str]) -> list[str]:
    """The warnings for unknown keys: each of the first SHOWN with its nearest known
    key, then one line counting the rest."""
    siblings = _siblings(known)
    notes = []
    for key in unknown[:SHOWN]:
        meant = nearest(key, siblings, known)
        hint = f"; did you mean {meant}?" if meant else ""
        notes.append(f"config: warning: unknown key {key} (ignored{hint})")
    if len(unknown) > SHOWN:
        notes.append(
            f"config: warning: {len(unknown) - SHOWN:,} more unknown keys (ignored), "
            f"{len(unknown):,} in all"
        )
    return notes
