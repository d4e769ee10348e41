"""The Comm a configuration asks for: the one place that maps ZeroConfig to a Comm.

Its reduction policy (MPI's sum, or rank order for determinism), whether ranks check
the collective schedule, and with --device gpu how device buffers reach MPI: handed
to a CUDA-aware MPI directly, or staged through host buffers (zero_ref/comm/staging.py).
Apart from collectives.py and staging.py because it chooses between them, and both
are below it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.comm.hier_order import hosts_of, spans_hosts
from zero_ref.comm.hierarchical import HierarchicalComm, host_labels
from zero_ref.comm.reduction import MPIReduction, OrderedReduction
from zero_ref.comm.two_level import two_level_comm
from zero_ref.config import ZeroConfig

if TYPE_CHECKING:
    from zero_ref.comm.staging import StagedComm


def comm_for(mpi_comm: MPI.Comm, cfg: ZeroConfig) -> Comm:
    """The Comm an engine with config `cfg` needs: its reduction policy and schedule
    checking both follow the config (the only place that maps one to the other)."""
    reduction = OrderedReduction() if cfg.deterministic else MPIReduction()
    if use_hierarchical(mpi_comm, cfg):  # two-level gathers and sums (docs/multihost.md)
        strict = cfg.overlap.collectives == "hierarchical"  # else a group may stay flat
        comm = two_level_comm(mpi_comm, reduction, cfg.check_schedule, strict=strict)
    else:
        comm = Comm(mpi_comm, reduction, check_schedule=cfg.check_schedule)
    if cfg.device == "gpu":  # collectives on device arrays (docs/gpu.md)
        return device_comm(comm, cfg.cuda_aware_mpi)
    return comm


def use_hierarchical(mpi_comm: MPI.Comm, cfg: ZeroConfig, host_of=None) -> bool:
    """cfg.overlap.collectives resolved (a collective): "flat" no, "hierarchical" yes,
    "auto" yes when the job spans more than one host with more than one rank on some
    host (hosts of any sizes: two_level_comm picks the Comm for them). hpZ's and hybrid
    sharding's groups follow the world's Comm (two_level.group_comm); qgZ's hops
    are its own."""
    collectives = cfg.overlap.collectives
    if collectives == "flat":
        return False
    return collectives == "hierarchical" or spans_hosts(hosts_of(host_labels(mpi_comm, host_of)))


def world_comm(cfg: ZeroConfig) -> Comm:
    """comm_for over every process of the job (MPI.COMM_WORLD): for an entry point that
    is not itself allowed to import mpi4py (zero_ref/engine/minimal.py's command)."""
    return comm_for(MPI.COMM_WORLD, cfg)


def device_comm(comm: Comm, cuda_aware_mpi: str) -> Comm | StagedComm:
    """The Comm a --device gpu engine uses: the library asked whether it is CUDA-aware
    and --cuda-aware-mpi resolved against its answer (zero_ref/gpu/mpi_support.py).
    CUDA-aware: a Comm that hands MPI the device arrays themselves, its temporaries and
    16-bit sums on the device, each call after a device synchronize (DeviceArrays).
    Not: a StagedComm, through reused pinned host buffers."""
    from numba import cuda  # the device modules only when asked: the CPU path needs none

    from zero_ref.comm.staging import StagedComm
    from zero_ref.gpu.arrays import DeviceArrays
    from zero_ref.gpu.mpi_support import choose_path, library_says_cuda_aware

    path = choose_path(cuda_aware_mpi, library_says_cuda_aware())
    if not path.cuda_aware:
        return StagedComm(comm, cuda.pinned_array, path.describe())
    if isinstance(comm, HierarchicalComm):  # its levels' reorders are host NumPy
        _device_buffers_go_flat(comm)
    direct = Comm(comm.mpi, comm.reduction, comm.check_schedule)
    direct.arrays = DeviceArrays(lambda: f"rank {direct.rank}, step {direct.step}")
    direct.path = path.describe()
    return direct


def _device_buffers_go_flat(comm: HierarchicalComm) -> None:
    """Device buffers handed to a CUDA-aware MPI take the flat collectives: the two
    levels' block reorders are host NumPy. Refused for collectives 'hierarchical'; said
    once by rank 0 for 'auto' (the staged path, through host buffers, keeps two levels)."""
    why = "the two-level collectives run on host buffers, not a CUDA-aware MPI's device ones"
    if comm.strict:
        raise ValueError(
            f"collectives 'hierarchical' with a CUDA-aware MPI: {why}; give "
            "--cuda-aware-mpi no (staged through host buffers, two levels) or collectives "
            "'auto' or 'flat' (flat)"
        )
    if comm.rank == 0:
        print(f"collectives auto: {why}; flat", flush=True)
    comm.free()
