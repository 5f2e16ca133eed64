"""What ``session.init()`` builds once the ranks have met: the backends, the global set's
communicators, agreed engine settings and the engine itself."""
from __future__ import annotations

import logging
from typing import Any

import torch

from accord.engine.engine import Engine
from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import ConfigError, with_hint
from accord.runtime.topology import Topology

log = logging.getLogger("accord.engine")


def build_engine(topology: Topology, store: Any, settings: EngineSettings | None
                 ) -> tuple[dict[str, Any], ProcessSetRegistry, Engine]:
    """Backends by device kind, the set registry (global set wired) and the (unstarted) engine.

    Collective over every rank: each creates the same communicators in the same order. ``store``
    (the job's) carries what each rank sees of its GPUs (:mod:`accord.comm.devices`).
    """
    from accord.comm.devices import device_backends

    size = topology.size
    single_host = size > 1 and len(set(topology.hostnames)) == 1
    backends = device_backends(store, topology.rank, topology.hostnames, single_host)
    check_devices(backends)
    registry = ProcessSetRegistry(size)
    for device, backend in backends.items():
        registry.set_communicator(GLOBAL_ID, device, backend.create(list(range(size))))
    cpu = registry.communicator(GLOBAL_ID, "cpu")
    settings = settings or EngineSettings.from_config(cpu_backend=backends["cpu"].name)
    check_settings_agree(settings, cpu)
    if (settings.hierarchical_allreduce or settings.hierarchical_auto) and size > 1:
        registry.set_communicator(GLOBAL_ID, "cpu", hierarchical(topology, cpu, settings))
    # The engine negotiates on the global CPU communicator: its own process group, not the
    # default one, so collectives a frontend runs directly never interleave with it.
    return backends, registry, Engine(topology.rank, size, cpu, registry, settings)


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


def hierarchical(topology: Topology, flat: Any, settings: EngineSettings) -> Any:
    """The global CPU communicator under ACCORD_HIERARCHICAL_ALLREDUCE (forced, or chosen
    automatically when unset): allreduce within each host (the one-host CPU backend, shm by
    default), then across hosts (the multi-host one, gloo by default). ``flat`` when the layout
    does not allow it (logged once, on rank 0, when forced) or, automatically, does not gain."""
    from accord.comm import backend_name_for
    from accord.comm.backend import get_backend
    from accord.comm.hierarchical import HierarchicalCommunicator, auto_hierarchy, hierarchy_problem
    from accord.runtime.groups import cross_sets, local_sets

    hosts = local_sets(topology)
    auto = not settings.hierarchical_allreduce
    problem = auto_hierarchy(hosts, flat.backend_name) if auto else hierarchy_problem(hosts)
    if problem is not None:
        if topology.rank == 0 and not auto:
            log.warning("ACCORD_HIERARCHICAL_ALLREDUCE is set, but allreduce stays flat: %s", problem)
        return flat
    # create() is collective over every rank: all ranks create every host's and every local
    # rank's communicator, in the same order, and keep the one they belong to.
    local_backend = get_backend(backend_name_for("cpu", single_host=True))
    local = [c for c in (local_backend.create(r) for r in hosts) if c is not None]
    cross_backend = get_backend(backend_name_for("cpu", single_host=False))
    cross = [c for c in (cross_backend.create(r) for r in cross_sets(topology)) if c is not None]
    if auto and topology.rank == 0:
        log.info("allreduce may be hierarchical (%d hosts x %d ranks, from %d bytes, if faster on "
                 "the first ones); HOROVOD_HIERARCHICAL_ALLREDUCE=0|1 decides instead", len(hosts),
                 len(hosts[0]), settings.hierarchical_min_bytes)
    return HierarchicalCommunicator(flat, local[0], cross[0],
                                    min_bytes=settings.hierarchical_min_bytes if auto else 0, measure=auto)


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
