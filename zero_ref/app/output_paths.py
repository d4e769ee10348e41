"""Every file a run will write, checked before its first step.

A run that trains for an hour and then cannot write its export has lost the
hour. So before training, every output path (--export, --log-jsonl, --save-dir)
is checked: its folder exists (--save-dir's is made) and is writable, its
extension is one zero_ref writes, and no two outputs share a path. A problem
is one UsageError (rank 0 prints it, exit 2).

It also finds what a killed writer left: atomic writes go to a hidden temporary
`.NAME.tmp-PID` beside the target (zero_ref/io/atomic.py); older versions of the
log used `.NAME.partial-PID`. Those whose process is gone are removed at the next
start, and each removal is reported.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zero_ref.app.cli import RunConfig, UsageError
from zero_ref.io.atomic import process_alive

EXTENSIONS = {"export": (".safetensors",), "log_jsonl": (".jsonl",), "trace": (".json",)}
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?:tmp|partial)-(?P<pid>\d+)$")


def output_paths(run: RunConfig) -> dict[str, Path]:
    """flag name -> path, for the outputs this run will write."""
    return {flag: Path(getattr(run, flag)) for flag in EXTENSIONS if getattr(run, flag)}


def check_output_paths(run: RunConfig) -> None:
    """Raise UsageError naming the flag and the problem, before any work is done."""
    paths = output_paths(run)
    for flag, path in paths.items():
        check_output_file(f"--{flag.replace('_', '-')}", path, EXTENSIONS[flag])
    resolved = [p.resolve() for p in paths.values()]
    if len(set(resolved)) < len(resolved):
        flags = ", ".join(f"--{flag.replace('_', '-')}" for flag in paths)
        raise UsageError(f"two of {flags} name the same file: each needs its own")
    if run.save_dir:
        check_save_dir(Path(run.save_dir))


def check_save_dir(folder: Path) -> None:
    """--save-dir: a folder that exists and is writable, or that can be made now."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--save-dir {folder}: is a file; give a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--save-dir {folder}: cannot create the folder ({e.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--save-dir {folder}: the folder is not writable")


def check_output_file(flag: str, path: Path, extensions: tuple[str, ...]) -> None:
    if path.suffix not in extensions:
        raise UsageError(
            f"{flag} {path}: the extension must be {' or '.join(extensions)}, not "
            f"{path.suffix or 'none'!r}"
        )
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder {folder} is not writable")
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the file exists and is not writable")


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries a killed writer of `path` left; returns what was removed."""
    removed = []
    for candidate in path.parent.glob(f".{path.name}.*-*"):
        match = _TEMPORARY.match(candidate.name)
        if match and match["name"] == path.name and not process_alive(int(match["pid"])):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed
