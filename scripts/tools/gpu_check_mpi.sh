# The MPI scripts/tools/gpu_check.sh runs on, as a library to source (docs/gpu.md, "MPI"):
#
#   source scripts/tools/gpu_check_mpi.sh
#   mpi_setup            # the machine's MPI if it runs 2 ranks, else the carried wheels
#   $GPU_CHECK_MPIRUN -n 4 python ...     # what every later phase launches with
#
# It reads PY (the interpreter), WHEELS (the carried .whl folder), WORK (scratch; env.sh
# is written there for the later phases to source), REPO (the working tree) and REHEARSE
# (1: install nothing). Apart from gpu_check.sh so that tests/test_gpu_check.py can run
# each function alone: install_wheels against a machine's own mpi4py, mpi_setup offline.

mpi_env() { # this shell's MPI launch environment: RES_OPTIONS, and Hydra's host file
  # Hydra resolves this machine's name through DNS when /etc/hosts lacks it, and a lent
  # machine reaches no DNS server: each lookup waits out the resolver's timeout (5 s, 2
  # tries). Naming localhost avoids most of them (-hosts localhost; HYDRA_HOST_FILE for
  # the mpiruns that tests start, tests/mpi_pool.py), and RES_OPTIONS makes the rest
  # give up after 1 s: scripts/tools/gpu_check_offline.sh measured 2 ranks starting in 18.6 s
  # plain, 6.3 s with -hosts localhost, 1.2 s with both. Nothing here resolves a name.
  export RES_OPTIONS=${RES_OPTIONS:-timeout:1 attempts:1}
  if mpi_is_hydra; then
    printf 'localhost\n' > "$WORK/hosts"
    export HYDRA_HOST_FILE=$WORK/hosts
  fi
}

mpi_is_hydra() { mpirun --version 2>&1 | grep -qi hydra; }

mpi_launcher() { # the mpirun command line to use: Hydra (MPICH) gets -hosts localhost
  if mpi_is_hydra; then
    echo "mpirun -hosts localhost"
  else
    echo "mpirun"
  fi
}

mpi_runs() { # 2 ranks of mpi4py, each seeing both
  command -v mpirun > /dev/null || {
    echo "no mpirun on PATH"
    return 1
  }
  local launch
  mpi_env
  launch=$(mpi_launcher)
  # shellcheck disable=SC2086
  timeout 12 $launch -n 2 "$PY" -c \
    "from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 2, 'ranks see 1 rank'" \
    && echo "MPI: $(command -v mpirun) ($launch) runs 2 ranks of mpi4py"
}

install_wheels() { # PREFIX NAME...: the carried wheels of these names, with no index
  local prefix=$1 files=() name
  shift
  for name in "$@"; do
    files+=("$(ls "$WHEELS/$name"-*.whl 2> /dev/null | head -1)")
    [[ -n ${files[-1]} ]] || {
      echo "no $name wheel in $WHEELS (run scripts/tools/gpu_wheels.sh here and carry .whl)"
      return 1
    }
  done
  echo "installing from $WHEELS, no index: ${files[*]##*/}"
  # --ignore-installed: into PREFIX whatever the machine has. Without it pip installs
  # nothing when the machine holds the same version ("already satisfied") and uninstalls
  # the machine's copy when it holds another.
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --ignore-installed --prefix "$prefix" "${files[@]}"
}

use_prefix() { # PREFIX: its mpirun, libmpi and Python packages first, here and later
  local prefix=$1 site
  site=$(find "$prefix" -type d -name site-packages | head -1)
  cat > "$WORK/env.sh" << EOF
export PATH="$prefix/bin:\$PATH"
export MPI4PY_LIBMPI="$prefix/lib/libmpi.so.12"
export LD_LIBRARY_PATH="$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$REPO${site:+:$site}\${PYTHONPATH:+:\$PYTHONPATH}"
EOF
  # shellcheck disable=SC1090
  . "$WORK/env.sh"
}

mpi_setup() { # the machine's MPI, else the carried MPICH, else MPICH and mpi4py
  echo "mpirun: $(command -v mpirun || echo none)"
  if mpi_runs; then
    echo "MPI: the machine's own runs 2 ranks; nothing installed"
  elif [[ $REHEARSE == 1 ]]; then
    echo "MPI: does not run 2 ranks, and a rehearsal installs nothing"
    return 1
  else
    echo "MPI: the machine's does not run 2 ranks; the carried MPICH, mpi4py's libmpi"
    install_wheels "$WORK/site" mpich && use_prefix "$WORK/site" || return 1
    if ! mpi_runs; then # the machine's mpi4py is tied to another library: carry ours
      echo "MPI: the machine's mpi4py cannot load it; the carried mpi4py too"
      install_wheels "$WORK/site" mpi4py && use_prefix "$WORK/site" && mpi_runs \
        && echo "MPI: the carried MPICH and mpi4py run 2 ranks" || return 1
    fi
  fi
  # what the later phases launch with, after the MPI is chosen
  mpi_env
  {
    echo "export GPU_CHECK_MPIRUN=\"$(mpi_launcher)\" RES_OPTIONS=\"$RES_OPTIONS\""
    [[ -z ${HYDRA_HOST_FILE:-} ]] || echo "export HYDRA_HOST_FILE=\"$HYDRA_HOST_FILE\""
  } >> "$WORK/env.sh"
}
