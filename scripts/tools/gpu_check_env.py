"""What scripts/tools/gpu_check.sh's env phase found: the machine's facts, one JSON line.

    python scripts/tools/gpu_check_env.py --require gpu|simulator --probe WORK/probe

Prints what the GPU path will run on (Python, the packages zero_ref needs and their
versions, the MPI library mpi4py loaded, the GPU or the simulator, and what
tests/gpu_ptx_check.py found on the real CUDA target: WORK/probe.json, .err and .rc) as
one JSON line, and exits 1 when what --require names is missing ("missing": each with
its cause). scripts/tools/gpu_check_report.py reads that line into summary.json.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
import re
import sys
from pathlib import Path

PACKAGES = (  # zero_ref's dependencies, the test extra's, and the GPU extra's (either CUDA)
    "numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "mpi4py", "mpich",
    "ml_dtypes", "safetensors", "tqdm", "threadpoolctl", "pytest", "hypothesis",
)  # fmt: skip


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def mpi_facts() -> dict:
    """The MPI library mpi4py loads, or why it cannot (a singleton: no mpirun needed)."""
    try:
        from mpi4py import MPI

        return {"library": MPI.Get_library_version().splitlines()[0].strip()}
    except Exception as e:  # the report says why instead
        return {"error": f"{type(e).__name__}: {e}"}


def cuda_facts() -> dict:
    """numba's view of the device (the simulator's, or the GPUs'), and CuPy's."""
    import numba
    from numba import cuda

    facts: dict = {"simulator": bool(numba.config.ENABLE_CUDASIM)}
    try:
        facts["available"] = bool(cuda.is_available())
        if facts["available"] and not facts["simulator"]:
            facts["gpus"] = [_name(g.name) for g in cuda.gpus]
    except Exception as e:
        facts["error"] = f"{type(e).__name__}: {e}"
    try:
        cp = importlib.import_module("cupy")
        facts["cupy"] = cp.__version__
        if not facts["simulator"]:
            facts["cupy_devices"] = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # absent in the simulator: the GPU path uses NumPy there
        facts["cupy_error"] = f"{type(e).__name__}: {e}"
    return facts


def _name(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def probe_facts(prefix: Path) -> dict:
    """tests/gpu_ptx_check.py's result on the real target (NUMBA_ENABLE_CUDASIM=0): its
    exit code, its JSON (each kernel's PTX instructions, what the missing toolchain kept
    from compiling, the launch through libdevice) and, if it failed, its error's line."""
    rc = prefix.with_suffix(".rc")
    facts: dict = {"exit": int(rc.read_text()) if rc.exists() else None}
    found = [x for x in _lines(prefix.with_suffix(".json")) if x.startswith("{")]
    if found:
        out = json.loads(found[-1])
        facts["compiled"] = sorted(k for k in out if k not in ("unavailable", "launch"))
        facts |= {k: out[k] for k in ("unavailable", "launch") if k in out}
    errors = [x.strip() for x in _lines(prefix.with_suffix(".err")) if x.strip()]
    if facts["exit"] != 0 and errors:
        facts["error"] = exception_text(errors)
    return facts


def exception_text(lines: list[str]) -> str:
    """A traceback's exception: from its last `SomeError: ...` line to the end (numba's
    messages run over several lines), else the last line."""
    starts = [i for i, x in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception)\b", x)]
    return " ".join(lines[starts[-1] if starts else -1 :])[:500]


def env_facts(probe: Path | None) -> dict:
    import zero_ref

    facts = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "zero_ref": str(Path(zero_ref.__file__).parent),
        "packages": {name: version(name) for name in PACKAGES},
        "mpi": mpi_facts(),
        "cuda": cuda_facts(),
    }
    if probe is not None:
        facts["real_target"] = probe_facts(probe)
    return facts


def real_target_missing(probe: dict, require: str) -> list[str]:
    """A compiler that is there and broken fails everywhere; on a GPU every kernel must
    also compile and the libdevice kernel run bitwise NumPy's."""
    if probe.get("exit") != 0:
        why = probe.get("error") or f"exit {probe.get('exit')}"
        return [f"the CUDA target cannot compile zero_ref's kernels ({why})"]
    if require != "gpu":
        return []  # a machine without NVVM or a driver: listed as unavailable, not missing
    lacking = [f"{k} did not compile: {v}" for k, v in probe.get("unavailable", {}).items()]
    launch = probe.get("launch", {})
    if not launch.get("bitwise"):
        lacking.append(f"the libdevice kernel on the GPU is not bitwise NumPy's ({launch})")
    return lacking


def missing(facts: dict, require: str) -> list[str]:
    """What the run needs and this machine lacks: on a GPU numba's device and CuPy;
    in a rehearsal the simulator; everywhere an MPI library mpi4py can load, and a CUDA
    target that compiles (tests/gpu_ptx_check.py's probe, where one ran)."""
    cuda, lacking = facts["cuda"], []
    if "error" in facts["mpi"]:
        lacking.append(f"mpi4py cannot load an MPI library ({facts['mpi']['error']})")
    if "real_target" in facts:
        lacking += real_target_missing(facts["real_target"], require)
    if require == "simulator" and not cuda["simulator"]:
        lacking.append("NUMBA_ENABLE_CUDASIM=1 (numba-cuda's simulator)")
    if require == "gpu":
        if cuda["simulator"] or not cuda.get("available"):
            lacking.append("a CUDA GPU numba can use (NUMBA_ENABLE_CUDASIM=0)")
        if "cupy" not in cuda:
            lacking.append(f"CuPy ({cuda.get('cupy_error')})")
    return lacking


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--require", choices=("gpu", "simulator"), required=True)
    p.add_argument("--probe", type=Path, help="WORK/probe: gpu_ptx_check.py's .json/.err/.rc")
    a = p.parse_args()
    facts = env_facts(a.probe)
    facts["missing"] = missing(facts, a.require)
    print(json.dumps(facts), flush=True)
    return 1 if facts["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
