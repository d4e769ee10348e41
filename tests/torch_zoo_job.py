"""Run the zoo (tests/torch_zoo.py) in one 2-rank gloo job; JSON of the outcomes last.

    python tests/torch_zoo_job.py [--records DIR] [CASE ...]   # all cases when none is named

Per case, rank 0 reports the step the checker first flagged (None: no alarm), the
diagnoses it named, its message and how many steps ran; a buggy case stops at its first
flagged step (CheckFailed is raised on every rank). Also the watched run beside the
unwatched one, for DDP, FSDP2 and FSDP1: their parameters must be bitwise the same. With
--records DIR, the RECORDED cases are also run watched into DIR/CASE with check=False,
for `python -m zero_ref.check DIR/CASE` (tests/test_check_torch.py runs it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.` importable

WORLD = 2
BITWISE_STEPS = 10
RECORDED = ("fsdp2", "ddp_grad_scaler", "clip_shard", "not_divided")  # a clean, a buggy of each


def run_case(name: str, rank: int) -> dict:
    from tests.torch_zoo import CASES
    from tests.torch_zoo_loops import train
    from zero_ref.check.torch_watch import CheckFailed

    case = CASES[name]
    steps = case.loop.steps if case.bug is None else case.first + 2
    loop = case.loop.__class__(**{**case.loop.__dict__, "steps": steps})
    try:
        ctx = train(loop, rank, WORLD, watch_options={})
    except CheckFailed as err:
        verdict = err.verdict
        return {
            "flagged": verdict.step if verdict is not None else -1,
            "diagnoses": list(verdict.diagnoses) if verdict is not None else [],
            "message": str(err),
        }
    return {"flagged": None, "diagnoses": [], "steps": ctx.saved["watcher"].step}


def record_case(name: str, rank: int, folder: str) -> None:
    """The case watched into a folder only, 8 steps: nothing checked while it runs."""
    from tests.torch_zoo import CASES
    from tests.torch_zoo_loops import train

    loop = CASES[name].loop.__class__(**{**CASES[name].loop.__dict__, "steps": 8})
    train(loop, rank, WORLD, watch_options={"folder": folder, "check": False})


def run_bitwise(framework: str, rank: int) -> bool:
    """The same loop watched and unwatched: the parameters after it, bit for bit."""
    from tests.torch_zoo_loops import Loop, train
    from zero_ref.check.torch_capture import capture_for

    loop = Loop(framework=framework, steps=BITWISE_STEPS)
    after = []
    for options in (None, {}):
        ctx = train(loop, rank, WORLD, watch_options=options)
        capture = capture_for(ctx.model, lambda name, grad: None)
        after.append(capture.full_params())
        capture.close()
    plain, watched = after
    return all(plain[n].tobytes() == watched[n].tobytes() for n in plain)


def worker(rank: int, store: str, out: str, names: list[str], records: str | None) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {name: run_case(name, rank) for name in names}
    bitwise = {fw: run_bitwise(fw, rank) for fw in ("ddp", "fsdp2", "fsdp1")}
    if records is not None:
        for name in RECORDED:
            record_case(name, rank, os.path.join(records, name))
    if rank == 0:
        Path(out).write_text(json.dumps({"cases": results, "bitwise": bitwise}))
    dist.barrier()  # no rank tears gloo down while another still uses it
    dist.destroy_process_group()
    # Leave without the interpreter's finalization: a gloo worker thread can still hold
    # objects whose destruction then needs the GIL, and the process aborts ("terminate called
    # without an active exception": a rank of this example ended so twice, in CI and under
    # load; pytorch/pytorch PR #179291 describes the cause). Everything this rank writes is
    # closed above; the exit code is 0, as mp.spawn expects.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    import warnings

    import torch.multiprocessing as mp

    from tests.torch_zoo import CASES

    warnings.filterwarnings("ignore")
    args = sys.argv[1:]
    records = None
    if args[:1] == ["--records"]:
        records, args = args[1], args[2:]
    names = args or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; the zoo has {sorted(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        mp.spawn(worker, args=(store, out, names, records), nprocs=WORLD, join=True)
        print(Path(out).read_text(), flush=True)


if __name__ == "__main__":
    main()
