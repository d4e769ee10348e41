"""What a reader meets in one stage-3 step: the minimal engine against the full one.

One rank (COMM_SELF), fp32, deterministic, blocking, a tiny GPT; one untraced step first
(Numba's compile, first-use allocations), then one traced step of each engine:

  window      the Python calls made between the return of the last unit's backward
              (unit 0's, whose gradient write ends backward) and the call of the AdamW
              kernel (zero_ref/optim/adamw.py adamw_kernel): every call in order
              (window_calls), the distinct zero_ref functions among them, and the ones
              of them that are not comm/ or optim/ (what the engine itself adds);
  stack       the frames between train_step and adamw_kernel, both counted, when the
              kernel is called: how deep the data path is;
  grad path   the frames a reader follows from backward's gradient to the kernel: the
              deepest zero_ref stack below the backward loop (forward_backward, not
              counted) that the window's reduction reaches, plus the update's stack
              below train_step down to adamw_kernel (both counted);
  step        every zero_ref line executed in the step (sys.settrace 'line' events,
              each (file, line) once), the functions and the files they lie in, and
              the lines those files hold; the model's own code (zero_ref/models/, the
              same for both engines) is counted apart.

docs/stages.md quotes the figures. Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.minimal import MinimalEngine
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.models.unit import init_params

PACKAGE = Path(__file__).resolve().parents[2] / "zero_ref"


def rel(filename: str) -> str | None:
    """zero_ref/... for a file of the package, else None."""
    path = Path(filename).resolve()
    return str(path.relative_to(PACKAGE.parent)) if path.is_relative_to(PACKAGE) else None


def name_of(code) -> str:
    where = rel(code.co_filename) or Path(code.co_filename).name
    # co_qualname is Python 3.11's; before it a function's first line keeps names apart
    qualname = getattr(code, "co_qualname", f"{code.co_name} (line {code.co_firstlineno})")
    return f"{where}:{qualname}"


def is_unit_backward(frame) -> bool:
    """A unit's backward called by the engine (not a layer's helper inside a unit)."""
    in_models = (rel(frame.f_code.co_filename) or "").startswith("zero_ref/models/")
    caller = frame.f_back
    caller_in_models = caller is not None and (rel(caller.f_code.co_filename) or "").startswith(
        "zero_ref/models/"
    )
    return frame.f_code.co_name == "backward" and in_models and not caller_in_models


class Window:
    """sys.setprofile: the calls from the last unit backward's return to adamw_kernel."""

    def __init__(self) -> None:
        self.calls: list[str] | None = None  # None: not recording
        self.stack: list[str] = []
        self.reduction_stack: list[str] = []  # the deepest below forward_backward
        self.done = False

    def __call__(self, frame, event, arg) -> None:
        if self.done or event not in ("call", "return"):
            return
        if is_unit_backward(frame):
            self.calls = [] if event == "return" else None
            return
        if event != "call" or self.calls is None:
            return
        if frame.f_code.co_name == "adamw_kernel":
            self.stack = stack_from_train_step(frame)
            self.done = True
            return
        self.calls.append(name_of(frame.f_code))
        below = zero_ref_frames_below(frame, "forward_backward")
        if below is not None and len(below) > len(self.reduction_stack):
            self.reduction_stack = below


def zero_ref_frames_below(frame, caller: str) -> list[str] | None:
    """The zero_ref frames from `caller` (not counted) down to `frame`, outermost first;
    None when `caller` is not on the stack."""
    stack = []
    while frame is not None:
        if frame.f_code.co_name == caller:
            return stack[::-1]
        if rel(frame.f_code.co_filename) is not None:
            stack.append(name_of(frame.f_code))
        frame = frame.f_back
    return None


def stack_from_train_step(frame) -> list[str]:
    stack = []
    while frame is not None:
        stack.append(name_of(frame.f_code))
        if frame.f_code.co_name == "train_step":
            break
        frame = frame.f_back
    return stack[::-1]


class Lines:
    """sys.settrace: each zero_ref (file, line) executed, and each function entered."""

    def __init__(self) -> None:
        self.lines: set[tuple[str, int]] = set()
        self.functions: set[str] = set()

    def __call__(self, frame, event, arg):
        where = rel(frame.f_code.co_filename)
        if where is None:
            return None  # no line events inside NumPy or the standard library
        if event == "call":
            self.functions.add(name_of(frame.f_code))
        if event == "line":
            self.lines.add((where, frame.f_lineno))
        return self


def step_figures(lines: Lines) -> dict:
    def part(keep) -> dict:
        files = sorted({f for f, _ in lines.lines if keep(f)})
        return {
            "executed_lines": sum(1 for f, _ in lines.lines if keep(f)),
            "functions": sum(1 for n in lines.functions if keep(n.split(":")[0])),
            "files": len(files),
            "lines_in_those_files": sum(
                len((PACKAGE.parent / f).read_text().splitlines()) for f in files
            ),
            "file_list": files,
        }

    return {
        "engine_side": part(lambda f: not f.startswith("zero_ref/models/")),
        "model": part(lambda f: f.startswith("zero_ref/models/")),
    }


def measure(build, model, batch) -> dict:
    engine = build()
    x, y = batch(0)
    engine.train_step(x, y)  # untraced: compile and first use
    x, y = batch(1)
    window = Window()
    sys.setprofile(window)
    try:
        engine.train_step(x, y)
    finally:
        sys.setprofile(None)
    lines = Lines()
    x, y = batch(2)
    sys.settrace(lines)
    try:
        engine.train_step(x, y)
    finally:
        sys.settrace(None)
    if hasattr(engine, "close"):
        engine.close()
    ours = [c for c in window.calls if c.startswith("zero_ref/")]
    distinct = list(dict.fromkeys(ours))
    own = [c for c in distinct if not c.startswith(("zero_ref/comm/", "zero_ref/optim/"))]
    return {
        "window_calls": len(window.calls),
        "window_zero_ref_functions": len(distinct),
        "window_engine_functions": len(own),
        "window_functions": distinct,
        "stack_depth": len(window.stack),
        "stack": window.stack,
        "grad_path_frames": len(window.reduction_stack) + len(window.stack) - 1,
        "reduction_stack": window.reduction_stack,
        "step": step_figures(lines),
    }


def measure_both() -> dict:
    """Both engines' figures, with the lists of functions and stacks."""
    cfg = ZeroConfig(stage=3, deterministic=True)
    model = GPT(GPTConfig(vocab_size=11, context=8, n_layer=1, n_head=2, d_model=8))
    init = init_params(model, 0)
    rng = np.random.default_rng(0)

    def batch(step: int):
        ids = rng.integers(0, 11, (1, 2, 8))  # (k, b, T) for one rank
        return ids, rng.integers(0, 11, (1, 2, 8))

    comm = lambda: comm_for(MPI.COMM_SELF, cfg)  # noqa: E731
    return {
        "what": "one fp32 stage-3 step on one rank, tiny GPT (n_layer 1)",
        "minimal": measure(lambda: MinimalEngine(model, init, cfg, comm()), model, batch),
        "full": measure(lambda: make_engine(model, init, cfg, comm()), model, batch),
    }


# docs/stages.md's table: the start of each row -> the figure it quotes for an engine
ROWS = {
    "| frames from `train_step`": lambda e: e["stack_depth"],
    "| frames from backward's gradient": lambda e: e["grad_path_frames"],
    "| distinct zero_ref functions": lambda e: e["window_zero_ref_functions"],
    "| ... of them outside comm/": lambda e: e["window_engine_functions"],
    "| zero_ref lines executed": lambda e: e["step"]["engine_side"]["executed_lines"],
    "| ... in files": lambda e: e["step"]["engine_side"]["files"],
    "| lines those files hold": lambda e: e["step"]["engine_side"]["lines_in_those_files"],
}
STAGES_MD = PACKAGE.parent / "docs" / "stages.md"


def update_page(result: dict, page: Path = STAGES_MD) -> None:
    """Write the figures into docs/stages.md's table rows (their words stay as written)."""
    lines = page.read_text().splitlines(keepends=True)
    for n, line in enumerate(lines):
        start = next((s for s in ROWS if line.startswith(s)), None)
        if start is not None:
            cells = line.rstrip("\n").strip("|").split("|")
            figures = [f" {ROWS[start](result[e]):,} " for e in ("minimal", "full")]
            lines[n] = "|" + "|".join([cells[0], *figures]) + "|\n"
    text = "".join(lines)
    model = result["minimal"]["step"]["model"]
    said = f"{model['executed_lines']} lines executed in {model['files']} files"
    text = re.sub(r"\d+ lines executed in \d+ files", said, text, count=1)
    functions = result["minimal"]["window_zero_ref_functions"]
    said = f"minimal engine's {functions} functions"
    text = re.sub(r"minimal engine's \d+ functions", said, text)
    page.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the functions and stacks")
    parser.add_argument(
        "--update-docs", action="store_true", help="write the figures into docs/stages.md"
    )
    args = parser.parse_args()
    result = measure_both()
    if args.update_docs:
        update_page(result)
    if args.list:
        for name in ("minimal", "full"):
            print(f"{name}: window", *result[name]["window_functions"], sep="\n  ")
            print(f"{name}: stack", *result[name]["stack"], sep="\n  ")
            print(f"{name}: reduction stack", *result[name]["reduction_stack"], sep="\n  ")
    for name in ("minimal", "full"):  # the JSON line keeps the counts, not the lists
        for key in ("window_functions", "stack", "reduction_stack"):
            result[name].pop(key)
        for side in result[name]["step"].values():
            side.pop("file_list")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
