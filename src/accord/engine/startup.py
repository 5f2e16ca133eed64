"""What ``session.init()`` builds once the ranks have met: the backends, the global set's
communicators, agreed engine settings and the engine itself."""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch

from accord.comm.groups import GroupContext
from accord.engine.engine import Engine
from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import ConfigError, with_hint
from accord.runtime.topology import Topology, topology_from_hostnames

log = logging.getLogger("accord.engine")


class GroupContexts:
    """Makes the :class:`~accord.comm.groups.GroupContext` each new communicator of this job is built
    from: the job's store, this rank, every rank's host, and the collective timeout."""

    def __init__(self, topology: Topology, store: Any, timeout: float) -> None:
        self.topology, self.store, self.timeout = topology, store, timeout

    def make(self, members: Sequence[int], key: str, timeout: float | None = None) -> GroupContext:
        """The context of communicator ``key`` over ``members`` (this rank among them)."""
        return GroupContext(self.store, key, tuple(members), self.topology.rank, tuple(self.topology.hostnames),
                            self.timeout if timeout is None else timeout)


def set_key(set_id: int, device: str) -> str:
    """The key of a set's communicator for one device kind (the same on every member)."""
    return f"set{set_id}/{device}"


def build_engine(topology: Topology, store: Any, settings: EngineSettings | None,
                 overrides: Mapping[str, Any] | None = None
                 ) -> tuple[dict[str, Any], ProcessSetRegistry, Engine, GroupContexts]:
    """Backends by device kind, the set registry (global set wired), the (unstarted) engine and
    the contexts later sets are built from. ``overrides`` win over accord.config's settings
    (when ``settings`` is None); their ``collective_timeout`` also bounds the communicators.

    Collective over every rank: each creates the global set's communicators. ``store`` (the
    job's) carries what each rank sees of its GPUs (:mod:`accord.comm.devices`) and is where
    the members of each communicator meet.
    """
    from accord.comm.devices import device_backends
    from accord.comm.settings import CommSettings

    size = topology.size
    single_host = size > 1 and len(set(topology.hostnames)) == 1
    backends = device_backends(store, topology.rank, topology.hostnames, single_host)
    check_devices(backends)
    overrides = dict(overrides or {})
    timeout = overrides.get("collective_timeout", CommSettings.from_config().collective_timeout)
    contexts = GroupContexts(topology, store, timeout)
    registry = ProcessSetRegistry(size)
    everyone = list(range(size))
    for device, backend in backends.items():
        comm = backend.create(contexts.make(everyone, set_key(GLOBAL_ID, device)))
        registry.set_communicator(GLOBAL_ID, device, comm)
    cpu = registry.communicator(GLOBAL_ID, "cpu")
    settings = settings or EngineSettings.from_config(cpu_backend=backends["cpu"].name, **overrides)
    check_settings_agree(settings, cpu)
    if (settings.hierarchical_allreduce or settings.hierarchical_auto) and size > 1:
        context = contexts.make(everyone, set_key(GLOBAL_ID, "cpu"))
        registry.set_communicator(GLOBAL_ID, "cpu", hierarchical(topology, cpu, settings, context))
    # The engine negotiates on the global CPU communicator: its own process group, not the
    # default one, so collectives a frontend runs directly never interleave with it.
    return backends, registry, Engine(topology.rank, size, cpu, registry, settings), contexts


def check_devices(backends: dict[str, Any]) -> None:
    """Refuse a backend named for tensors it cannot move (e.g. ACCORD_CPU_BACKEND=nccl)."""
    for device, backend in backends.items():
        kinds = getattr(backend, "device_types", None)
        if kinds is not None and device not in kinds:
            variable = "ACCORD_CPU_BACKEND" if device == "cpu" else "ACCORD_GPU_BACKEND"
            raise ConfigError(with_hint(
                f"{variable} names backend {backend.name!r}, which moves {', '.join(sorted(kinds))} "
                f"tensors, not {device} ones",
                "use gloo, shm or mpi for CPU tensors and nccl for CUDA tensors"))


def hierarchical(topology: Topology, flat: Any, settings: EngineSettings, context: GroupContext,
                 members: Sequence[int] | None = None) -> Any:
    """A set's CPU communicator under ACCORD_HIERARCHICAL_ALLREDUCE (forced, or chosen
    automatically when unset): allreduce within each host (the one-host CPU backend, shm by
    default), then across hosts (the multi-host one, gloo by default). ``flat`` when the layout
    does not allow it (logged once, on the set's first rank, when forced) or, automatically,
    does not gain. ``topology`` numbers the set's ranks (the job's, for the global set); a
    process set passes its global ``members``, which its communicators' contexts are made of."""
    from accord.comm import backend_name_for
    from accord.comm.backend import get_backend
    from accord.comm.hierarchical import HierarchicalCommunicator, auto_hierarchy, hierarchy_problem, shard_slots
    from accord.runtime.groups import cross_sets, local_sets

    hosts = local_sets(topology)
    auto = not settings.hierarchical_allreduce
    problem = auto_hierarchy(hosts, flat.backend_name) if auto else hierarchy_problem(hosts)
    if problem is not None:
        if topology.rank == 0 and not auto:
            log.warning("ACCORD_HIERARCHICAL_ALLREDUCE is set, but allreduce stays flat: %s", problem)
        return flat
    # Each rank builds the two communicators it belongs to: its host's and its local rank's.
    me = topology.rank
    local_index, mine = next((i, r) for i, r in enumerate(hosts) if me in r)
    def job_ranks(ranks: Sequence[int]) -> list[int]:
        return list(ranks) if members is None else [members[r] for r in ranks]

    local = get_backend(backend_name_for("cpu", single_host=True)).create(
        context.sub(job_ranks(mine), f"local{local_index}"))
    cross_index, across = next((i, r) for i, r in enumerate(cross_sets(topology)) if me in r)
    cross = get_backend(backend_name_for("cpu", single_host=False)).create(
        context.sub(job_ranks(across), f"cross{cross_index}"))
    if auto and topology.rank == 0:
        log.info("allreduce may be hierarchical (%d hosts x %d ranks, from %d bytes, if faster on "
                 "the first ones); HOROVOD_HIERARCHICAL_ALLREDUCE=0|1 decides instead", len(hosts),
                 len(hosts[0]), settings.hierarchical_min_bytes)
    return HierarchicalCommunicator(flat, local, cross,
                                    min_bytes=settings.hierarchical_min_bytes if auto else 0, measure=auto,
                                    slots=shard_slots(hosts, cross_sets(topology)))


def set_cpu_communicator(topology: Topology, ranks: Sequence[int], flat: Any, settings: EngineSettings,
                         context: GroupContext) -> Any:
    """A process set's CPU communicator: ``flat``, or host-first (:func:`hierarchical`) when the
    set spans several hosts and the hierarchy is forced or automatic, as for the global set.
    Collective over the set's members (this rank among ``ranks``)."""
    if not (settings.hierarchical_allreduce or settings.hierarchical_auto) or len(ranks) < 2:
        return flat
    hostnames = [topology.hostnames[r] for r in ranks]
    if len(set(hostnames)) < 2:
        return flat
    view = topology_from_hostnames(list(ranks).index(topology.rank), hostnames)
    return hierarchical(view, flat, settings, context, members=list(ranks))


def check_settings_agree(settings: EngineSettings, comm: Any) -> None:
    """Every rank must fuse and time out stalls alike, or their collectives would not line up."""
    fields = ("fusion_threshold", "cache_capacity", "stall_check_disable", "stall_check_time",
              "stall_shutdown_time", "hierarchical_allreduce", "hierarchical_auto")
    mine = torch.tensor([float(getattr(settings, f)) for f in fields], dtype=torch.float64)
    table = comm.allgather(mine.unsqueeze(0)).tolist()
    for j, name in enumerate(fields):
        values = [row[j] for row in table]
        if len(set(values)) > 1:
            seen = ", ".join(f"rank {r} has {v:g}" for r, v in enumerate(values))
            raise ConfigError(with_hint(f"engine setting {name} differs between ranks: {seen}",
                                        "give every rank the same ACCORD_* engine variables "
                                        "(accordrun passes the launcher's environment to all)"))
