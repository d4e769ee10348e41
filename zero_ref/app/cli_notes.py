"""Settings that a run's other settings make moot: each is said once, as a config key
with no effect here is ("has no effect ..."), whether a flag or a --config key set it.

One row per case: the setting, when it is moot (a test of the merged settings), and
why, in the engine's terms. Nothing is changed: the value stays what was given, so a
resume or a report shows it as given; the run just cannot use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from zero_ref.app.settings import BY_DEST, DEFAULTS

Moot = tuple[str, Callable[[Mapping[str, Any]], bool], str]

MOOT: tuple[Moot, ...] = (
    ("overlap_comm", lambda s: s["overlap_comm"] and s["stage"] == 0,
     "at stage 0: its all-reduce chunks are waited for where they are issued"),
    ("progress", lambda s: s["progress"] != DEFAULTS["progress"] and not s["overlap_comm"],
     "without --overlap-comm: every collective is waited for where it is issued, so there "
     "is nothing in flight to progress"),
    ("prefetch_numel", lambda s: s["prefetch_numel"] is not None and s["stage"] != 3,
     "below stage 3: only stage 3 gathers parameters ahead of use"),
    ("prefetch_numel",
     lambda s: s["prefetch_numel"] is not None and s["stage"] == 3 and not s["overlap_comm"],
     "without --overlap-comm: a blocking stage 3 gathers each unit when it is used"),
    ("max_live_numel", lambda s: s["max_live_numel"] is not None and s["stage"] != 3,
     "below stage 3: no parameters are gathered (every rank holds them all)"),
    ("persistence_numel",
     lambda s: s["persistence_numel"] != DEFAULTS["persistence_numel"] and s["stage"] != 3,
     "below stage 3: no parameters are gathered (every rank holds them all)"),
)  # fmt: skip


def moot_notes(settings: Mapping[str, Any]) -> list[str]:
    """One note per moot setting, naming its flag and its DeepSpeed key."""
    notes = []
    for dest, moot, why in MOOT:
        if moot(settings):
            s = BY_DEST[dest]
            key = f" ({', '.join(s.ds)})" if s.ds else ""
            given = s.option if s.type is bool else f"{s.option} {settings[dest]}"
            notes.append(f"config: {given}{key} has no effect {why}")
    return notes
