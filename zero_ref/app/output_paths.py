"""Every file a run will write, checked before its first step.

A run that trains for an hour and then cannot write its export has lost the
hour. So before training, every output path (--export, --log-jsonl, --save-dir)
is checked: its folder exists (--save-dir's is made) and is writable, its
extension is one zero_ref writes, no two outputs share a path, and none is, or
lies inside, a checkpoint the run reads (--resume) or writes (--save-dir): an
--export over a rank file would replace it and the checkpoint would be refused
as truncated. Paths are compared after resolving symlinks and "..". A problem
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
from zero_ref.checkpoint.manifest import CheckpointError, resolve_tag
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
    read = checkpoint_folders(f"--resume {run.resume}", run.resume) if run.resume else {}
    written = {f"--save-dir {run.save_dir}": real_path(Path(run.save_dir))} if run.save_dir else {}
    for flag, path in paths.items():
        check_outside_checkpoints(f"--{flag.replace('_', '-')}", path, read | written)
    if run.save_dir:
        check_save_dir(Path(run.save_dir))
        # saving into the folder resumed from is how a run goes on; into its tag, not
        tag = tag_folder(f"--resume {run.resume}", run.resume) if run.resume else {}
        check_outside_checkpoints("--save-dir", Path(run.save_dir), tag)


def checkpoint_folders(label: str, folder: str | Path) -> dict[str, Path]:
    """The folder a checkpoint is read from, and the tag folder it names."""
    return {label: real_path(Path(folder))} | tag_folder(label, folder)


def tag_folder(label: str, folder: str | Path) -> dict[str, Path]:
    """{"LABEL (tag step_N)": the tag folder `folder` names}, or {} where it names none
    (a checkpoint that cannot be opened is reported when it is opened)."""
    try:
        tag = resolve_tag(folder)
    except (CheckpointError, OSError):
        return {}
    return {f"{label} (tag {tag.name})": real_path(tag)}


def check_outside_checkpoints(flag: str, path: Path, checkpoints: dict[str, Path]) -> None:
    """UsageError if `path` is, or lies inside, one of the checkpoint folders: through
    a symlink (of a folder on the way, or of the file itself) as well."""
    for where in {real_path(path), real_path(path.parent) / path.name}:
        for label, folder in checkpoints.items():
            if where == folder or folder in where.parents:
                raise UsageError(
                    f"{flag} {path}: lies inside the checkpoint {label} ({where} is in "
                    f"{folder}); writing there would destroy it: give a path outside it"
                )


def real_path(path: Path) -> Path:
    """Absolute, with every symlink and ".." resolved (for paths that do not exist yet:
    as far as they do)."""
    return Path(os.path.realpath(path))


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
