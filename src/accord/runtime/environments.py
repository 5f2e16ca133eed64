"""Who started us: detect the launcher from environment variables (pure, no I/O).

:func:`detect` takes a mapping (``config.snapshot()``) and asks each detector in this fixed
order; the first that recognises its variables wins:

1. ``accord``   - accordrun / accord.spawn: ACCORD_RANK, ACCORD_SIZE (or HOROVOD_RANK/SIZE),
   ACCORD_LOCAL_*/CROSS_*, ACCORD_HOSTNAME, ACCORD_STORE_ADDR/PORT, ACCORD_JOB_SECRET or
   ACCORD_SECRET_FILE. Checked first because accordrun also sets torchrun's names for DDP scripts.
2. ``torchrun`` - RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
   MASTER_PORT, TORCHELASTIC_* (plain ``env://`` jobs that set RANK/WORLD_SIZE count too).
3. ``openmpi``  - OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE.
4. ``mpich``    - MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.
5. ``slurm``    - SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_TASKS_PER_NODE,
   SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (compressed lists such as ``node[01-03],x``);
   rank 0's store is on the step's first node, at MASTER_PORT or :func:`slurm_step_port`.
   After the MPI detectors: ``mpirun`` inside an allocation sees SLURM_* of the allocation.
6. ``single``   - nothing set: one process, rank 0 of 1.

More detectors can be added with :func:`register_detector`; a launcher that sets plain
integer variables needs only a :class:`LauncherVariables` entry and :func:`detect_from`.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from accord.config import int_variable
from accord.errors import ConfigError, with_hint
from accord.host_lists import expand_nodelist, expand_tasks_per_node, slurm_step_port
from accord.runtime.settings import AccordPlace, HostAndSecret

# How a source's processes meet: connect to accord's store the launcher runs; use torchrun's
# TCPStore; rank 0 starts accord's store and tells the others; or nothing to meet (one process).
ACCORD_STORE, TORCH_STORE, RANK0_STORE, NO_STORE = "accord-store", "torch-store", "rank0-store", "none"
# torch.distributed met the ranks already and hands its store over (the accord process group's creator)
GIVEN_STORE = "given-store"


@dataclass(frozen=True)
class JobEnvironment:
    """What the environment says about this process. ``None`` means "not given"."""

    source: str
    rank: int
    size: int
    rendezvous: str
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    store_addr: str | None = None
    store_port: int | None = None
    secret_hex: str | None = None
    secret_file: str | None = None
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    agent_store: bool = False

    @property
    def is_mpi(self) -> bool:
        """True under an MPI launcher (mpirun / mpiexec)."""
        return self.source in ("openmpi", "mpich")

    @property
    def single_host(self) -> bool | None:
        """True/False when the environment tells whether every rank runs on this host."""
        if self.size == 1:
            return True
        if self.local_size is not None:
            return self.local_size == self.size
        if self.nodes:
            return len(self.nodes) == 1
        return None


Detector = Callable[[Mapping[str, str]], "JobEnvironment | None"]


def _common(env: Mapping[str, str]) -> dict:
    """Settings that apply whatever the launcher (secret, host name override)."""
    return dataclasses.asdict(HostAndSecret.from_environ(env))  # its fields are JobEnvironment's


def _master(env: Mapping[str, str]) -> dict:
    return {"store_addr": env.get("MASTER_ADDR") or None, "store_port": int_variable(env, "MASTER_PORT")}


def detect_accord(env: Mapping[str, str]) -> JobEnvironment | None:
    """accord's own contract (accordrun, accord.spawn), including the HOROVOD_* aliases."""
    place = AccordPlace.from_environ(env)
    if place is None:
        return None
    own_store = bool(place.store_addr and place.store_port)
    where = {"store_addr": place.store_addr, "store_port": place.store_port} if own_store else _master(env)
    return JobEnvironment(
        source="accord", rank=place.rank, size=place.size,
        rendezvous=ACCORD_STORE if own_store else RANK0_STORE,
        local_rank=place.local_rank, local_size=place.local_size,
        cross_rank=place.cross_rank, cross_size=place.cross_size,
        **where, **_common(env),
    )


@dataclass(frozen=True)
class LauncherVariables:
    """Where a launcher that sets plain integer variables keeps rank, size and local values.

    ``extra`` reads launcher-specific fields; it runs only once rank and size are known to be
    set, so a malformed extra variable of a launcher that is not in use never raises.
    """

    source: str
    rendezvous: str
    world: tuple[str, str]  # (rank, size)
    local: tuple[str | None, str | None] = (None, None)  # (local rank, local size)
    extra: Callable[[Mapping[str, str]], dict] | None = None


def detect_from(names: LauncherVariables, env: Mapping[str, str]) -> JobEnvironment | None:
    """The environment ``names`` describe, or None when its rank or size variable is unset.

    Raises:
        ConfigError: one of the variables is set but not an integer.
    """
    rank, size = (int_variable(env, name) for name in names.world)
    if rank is None or size is None:
        return None
    local_rank, local_size = (int_variable(env, name) if name else None for name in names.local)
    fields = {"local_rank": local_rank, "local_size": local_size}
    extra = names.extra(env) if names.extra else {}
    # MASTER_ADDR/PORT win when set; an extra "store_addr"/"store_port" is the launcher's fallback.
    fallback = {key: extra.pop(key, None) for key in ("store_addr", "store_port")}
    fields.update(extra)
    fields.update(_master(env))
    for key, value in fallback.items():
        if fields[key] is None:
            fields[key] = value
    return JobEnvironment(source=names.source, rank=rank, size=size, rendezvous=names.rendezvous,
                          **fields, **_common(env))


def _check_not_a_bare_pet_worker(env: Mapping[str, str]) -> None:
    """A PyTorchJob asked for several workers per node (``PET_NPROC_PER_NODE``), but no agent
    started this process (torchrun and accordrun set ``LOCAL_RANK``): its ranks would wait for
    workers nobody starts. Refuse at once rather than hang in the rendezvous."""
    per_node = int_variable(env, "PET_NPROC_PER_NODE")
    if per_node is None or per_node <= 1 or env.get("LOCAL_RANK") or env.get("TORCHELASTIC_RUN_ID"):
        return
    raise ConfigError(with_hint(
        f"PET_NPROC_PER_NODE={per_node} asks for {per_node} workers on this node, but this process was "
        f"started directly, not by an agent (no LOCAL_RANK; RANK={env.get('RANK')}, "
        f"WORLD_SIZE={env.get('WORLD_SIZE')}): the job would wait for workers nobody starts",
        "make the container's command `accordrun python train.py` (it reads PET_* and starts "
        f"{per_node} workers per node; give it the job's secret, see docs/launcher.md) or "
        "`torchrun ... train.py`, or set nprocPerNode to 1"))


def _torchrun_extra(env: Mapping[str, str]) -> dict:
    _check_not_a_bare_pet_worker(env)
    return {
        "node_rank": int_variable(env, "GROUP_RANK"),
        "restart_count": int_variable(env, "TORCHELASTIC_RESTART_COUNT") or 0,
        # torchrun's agent hosts the TCPStore (torch >= 2.2); plain env:// jobs host it on rank 0.
        "agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true"),
    }


def _slurm_extra(env: Mapping[str, str]) -> dict:
    """Node list, node rank, and the local size of this node (SLURM has no local-size variable)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    nodes = tuple(expand_nodelist(nodelist)) if nodelist else ()
    node_rank = int_variable(env, "SLURM_NODEID")
    local_size = None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node and node_rank is not None:
        counts = expand_tasks_per_node(per_node)
        if node_rank < len(counts):
            local_size = counts[node_rank]
    # Without MASTER_ADDR/MASTER_PORT, rank 0's store runs on the first node of the step, on the
    # step's own port (every task computes the same one; steps running at once differ).
    return {"nodes": nodes, "node_rank": node_rank, "local_size": local_size,
            "store_addr": nodes[0] if nodes else None, "store_port": slurm_step_port(env)}


# torchrun / torch.distributed.launch, or any env:// job that sets RANK and WORLD_SIZE.
TORCHRUN = LauncherVariables("torchrun", TORCH_STORE, ("RANK", "WORLD_SIZE"),
                             ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), extra=_torchrun_extra)
# Open MPI's mpirun.
OPENMPI = LauncherVariables("openmpi", RANK0_STORE, ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                            ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))
# MPICH and Intel MPI (Hydra process manager, PMI).
MPICH = LauncherVariables("mpich", RANK0_STORE, ("PMI_RANK", "PMI_SIZE"),
                          ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"))
# A SLURM job step (srun).
SLURM = LauncherVariables("slurm", RANK0_STORE, ("SLURM_PROCID", "SLURM_NTASKS"),
                          ("SLURM_LOCALID", None), extra=_slurm_extra)


# One detector per table entry (the names DETECTORS and register_detector's `before` use).
detect_torchrun: Detector = functools.partial(detect_from, TORCHRUN)
detect_openmpi: Detector = functools.partial(detect_from, OPENMPI)
detect_mpich: Detector = functools.partial(detect_from, MPICH)
detect_slurm: Detector = functools.partial(detect_from, SLURM)


def detect_single(env: Mapping[str, str]) -> JobEnvironment:
    """No launcher: one process."""
    return JobEnvironment(source="single", rank=0, size=1, rendezvous=NO_STORE,
                          local_rank=0, local_size=1, cross_rank=0, cross_size=1, **_common(env))


DETECTORS: list[tuple[str, Detector]] = [
    ("accord", detect_accord),
    ("torchrun", detect_torchrun),
    ("openmpi", detect_openmpi),
    ("mpich", detect_mpich),
    ("slurm", detect_slurm),
]


def register_detector(name: str, detector: Detector, before: str | None = None, *,
                      override: bool = False) -> None:
    """Add a detector, at the end or just before the one named ``before``.

    With ``override=True`` a detector of the same name is replaced (in its place, unless
    ``before`` names another).

    Raises:
        ConfigError: ``name`` is taken and ``override`` is False, or ``before`` is unknown.
    """
    names = [n for n, _ in DETECTORS]
    if before is not None and before not in names:
        raise ConfigError(with_hint(f"unknown cluster environment {before!r}; known: {', '.join(names)}",
                                    "pass before= one of the known names, or None to add it last"))
    if name in names:
        if not override:
            raise ConfigError(with_hint(
                f"cluster environment {name!r} already has a detector ({DETECTORS[names.index(name)][1]!r})",
                "choose another name, or pass override=True to register_detector to replace it"))
        if before is None or before == name:
            DETECTORS[names.index(name)] = (name, detector)
            return
        del DETECTORS[names.index(name)]
        names.remove(name)
    index = names.index(before) if before is not None else len(DETECTORS)
    DETECTORS.insert(index, (name, detector))


def detect(environ: Mapping[str, str]) -> JobEnvironment:
    """Detect the launcher from ``environ`` (in the documented order) and validate its values.

    Raises:
        ConfigError: a variable is not an integer, or rank/size are out of range.
    """
    for name, detector in DETECTORS:
        found = detector(environ)
        if found is not None:
            _validate(found, name)
            return found
    return detect_single(environ)


def _validate(env: JobEnvironment, name: str) -> None:
    if env.size < 1 or not 0 <= env.rank < env.size:
        raise ConfigError(
            with_hint(
                f"the {name} environment gives rank {env.rank} of size {env.size}",
                "rank must be in [0, size) and size >= 1; fix the launcher's variables",
            )
        )
    if env.local_rank is not None and env.local_size is not None and not (
        0 <= env.local_rank < env.local_size <= env.size
    ):
        raise ConfigError(
            with_hint(
                f"the {name} environment gives local rank {env.local_rank} of local size "
                f"{env.local_size} (size {env.size})",
                "local rank must be in [0, local size) and local size <= size",
            )
        )
