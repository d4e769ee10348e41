#!/usr/bin/env bash
# The wheels scripts/tools/gpu_check.sh may need on a lent GPU machine that reaches no package
# registry, downloaded here (where pip reaches PyPI) into a git-ignored folder that the
# device tool carries (docs/gpu.md, "On a lent machine"):
#
#   bash scripts/tools/gpu_wheels.sh [DIR]        # DIR defaults to .whl
#   GPU_WHEELS_PYTHON=3.11 bash scripts/tools/gpu_wheels.sh DIR   # another CPython's mpi4py
#                                            # (scripts/tools/gpu_check_offline.sh rehearses here)
#
# That machine runs CPython 3.12 on x86-64 Linux and already has numpy, numba, numba-cuda,
# cupy-cuda13x, mpi4py, ml_dtypes, safetensors, tqdm, threadpoolctl, pytest and hypothesis
# (/work/.library/device/KINDS.md); whether it has an MPI library and `mpirun` is not
# known. So the folder holds the MPI alone:
#   mpich   mpirun (Hydra) and libmpi.so.12, for a machine with no MPI;
#   mpi4py  a wheel that loads an MPICH-ABI libmpi at run time (mpi4py 4's wheels dlopen
#           it: MPI4PY_LIBMPI names the file), used only where the machine's own mpi4py
#           cannot be pointed at the carried libmpi.
# zero_ref itself needs no wheel: gpu_check.sh puts the working tree on PYTHONPATH.
# Neither wheel requires another (their METADATA has no Requires-Dist; printed below).
# One version of each, pinned: the versions this repository's CI runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.whl}
LIMIT_BYTES=$((64 * 1024 * 1024)) # everything the device tool carries, the tree included
WHEELS=("mpich==5.0.2" "mpi4py==4.1.2")

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version "${GPU_WHEELS_PYTHON:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$DIR" "${WHEELS[@]}"

for wheel in "$DIR"/*.whl; do
  needs=$(unzip -p "$wheel" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true)
  echo "$(basename "$wheel"): $(du -b "$wheel" | cut -f1) bytes; requires: ${needs:-nothing}"
done
total=$(du -cb "$DIR"/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($((total / 1024 / 1024)) MiB) in $DIR, of the 64 MiB the device tool carries"
if ((total > LIMIT_BYTES)); then
  echo "error: $DIR holds $total bytes, over the device tool's 64 MiB" >&2
  exit 1
fi
