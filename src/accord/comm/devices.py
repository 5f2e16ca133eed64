"""Which backend moves each kind of tensor in a job: the choice made once at init.

CPU tensors: :func:`accord.comm.backend_name_for` (shm on one host, else Gloo, unless
ACCORD_CPU_BACKEND names one). CUDA tensors (only where torch sees a GPU), by
ACCORD_GPU_BACKEND:

- ``auto`` (the default): NCCL, unless it cannot work for this job, then ``host`` (CUDA tensors
  staged through host memory over the CPU backend, :mod:`accord.comm.host_staged`), logged
  once with the reason. NCCL cannot work when a host has more ranks than distinct GPUs (NCCL
  refuses two ranks on one device, e.g. 2 ranks on a machine with 1 GPU) or when a rank's torch
  was built without NCCL. A CUDA host without NCCL therefore still runs CPU work, and CUDA work
  slowly, instead of failing at init.
- ``nccl``: NCCL, and a clear error at init when it cannot work (the shared GPU is named).
- ``host``, or any registered name: that backend.

Ranks decide alike: each publishes what it sees (NCCL built in, the ids of its visible GPUs)
under one store key and every rank applies the same rule to the whole table.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import torch

from accord.comm import backend_name_for
from accord.comm.backend import Backend, get_backend
from accord.comm.host_staged import HostStagedBackend
from accord.comm.settings import CommSettings
from accord.errors import ConfigError, RendezvousError, with_hint

log = logging.getLogger("accord.comm")

AUTO, NCCL, HOST = "auto", "nccl", "host"
_KEY = "accord/gpus/"


@dataclass(frozen=True)
class GpuView:
    """What one rank sees: whether its torch has NCCL, and the ids of its visible GPUs."""

    nccl: bool
    devices: tuple[str, ...]

    def encode(self) -> str:
        return ("1" if self.nccl else "0") + "|" + ",".join(self.devices)

    @classmethod
    def decode(cls, text: str) -> "GpuView":
        flag, _, devices = text.partition("|")
        return cls(flag == "1", tuple(d for d in devices.split(",") if d))


def _device_id(index: int) -> str:
    """A GPU's physical identity (its UUID), so ranks that each see "cuda:0" through their own
    CUDA_VISIBLE_DEVICES are told apart; the index where torch reports no UUID."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except (RuntimeError, AssertionError):
        uuid = None
    return str(uuid) if uuid else f"cuda:{index}"


def local_view() -> GpuView:
    """This rank's :class:`GpuView` (call only where ``torch.cuda.is_available()``)."""
    import torch.distributed as dist

    nccl = bool(dist.is_available() and dist.is_nccl_available())
    return GpuView(nccl, tuple(_device_id(i) for i in range(torch.cuda.device_count())))


def nccl_problem(hostnames: Sequence[str], views: Sequence[GpuView]) -> str | None:
    """Why NCCL cannot carry this job's CUDA tensors, or None when it can (the same answer on
    every rank: it reads only the job-wide table)."""
    no_nccl = [r for r, v in enumerate(views) if not v.nccl]
    if no_nccl:
        return f"torch on rank(s) {no_nccl} was built without NCCL"
    for host in dict.fromkeys(hostnames):
        ranks = [r for r, h in enumerate(hostnames) if h == host]
        gpus = sorted({d for r in ranks for d in views[r].devices})
        if len(gpus) < len(ranks):
            shown = ", ".join(gpus) or "none"
            return (f"{len(ranks)} ranks on host {host!r} (ranks {ranks}) share {len(gpus)} GPU(s) "
                    f"({shown}), and NCCL needs a GPU of its own per rank")
    return None


def choose_gpu_backend(requested: str, hostnames: Sequence[str], views: Sequence[GpuView]) -> str:
    """The GPU backend's name for ``requested`` (ACCORD_GPU_BACKEND) and the job's table.

    Raises:
        ConfigError: ``requested`` is nccl and NCCL cannot work (the message says why).
    """
    name = requested.strip().lower()
    if name not in (AUTO, NCCL):
        return requested.strip()
    problem = nccl_problem(hostnames, views)
    if problem is None:
        return NCCL
    if name == NCCL:
        raise ConfigError(with_hint(
            f"ACCORD_GPU_BACKEND=nccl, but NCCL cannot carry this job's CUDA tensors: {problem}",
            "give every rank its own GPU (torch.cuda.set_device(hvd.local_rank()) with as many "
            "GPUs as ranks per host), or set ACCORD_GPU_BACKEND=auto (or host) to move CUDA "
            "tensors through host memory instead (slower, but the job runs)"))
    return HOST


def _exchange(store: Any, rank: int, size: int, mine: GpuView, timeout: float) -> list[GpuView]:
    """Every rank's view, through the job's store (one key per rank)."""
    store.set(f"{_KEY}{rank}", mine.encode())
    keys = [f"{_KEY}{r}" for r in range(size)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except RuntimeError as exc:
        missing = [r for r in range(size) if not store.check([keys[r]])]
        raise RendezvousError(with_hint(
            f"rank {rank} sees CUDA, but rank(s) {missing} did not report their GPUs within "
            f"{timeout:.0f}s (a rank whose torch sees no GPU skips this step)",
            "run the job on hosts that all see a GPU, or hide the GPUs from every rank "
            "(CUDA_VISIBLE_DEVICES=) to run on the CPU")) from exc
    return [GpuView.decode(v.decode("utf-8", "replace")) for v in store.multi_get(keys)]


def device_backends(store: Any, rank: int, hostnames: Sequence[str], single_host: bool) -> dict[str, Backend]:
    """The job's backend per device type: ``{"cpu": ...}``, plus ``"cuda"`` where torch sees a
    GPU. Collective over every rank when CUDA is available (one store exchange).

    Raises:
        ConfigError: ACCORD_GPU_BACKEND=nccl and NCCL cannot work. BackendError: an unknown
        backend name. RendezvousError: some ranks see CUDA and others do not.
    """
    cpu_name = backend_name_for("cpu", single_host)
    backends: dict[str, Backend] = {"cpu": get_backend(cpu_name)}
    if not torch.cuda.is_available():
        return backends
    settings = CommSettings.from_config()
    requested = str(settings.gpu_backend)
    views = _exchange(store, rank, len(hostnames), local_view(), settings.start_timeout)
    name = choose_gpu_backend(requested, hostnames, views)
    if name == HOST:
        if rank == 0 and requested.strip().lower() == AUTO:
            log.warning("CUDA tensors will move through host memory over the %s backend, not NCCL: %s "
                        "(set ACCORD_GPU_BACKEND=nccl to make this an error)",
                        cpu_name, nccl_problem(hostnames, views))
        backends["cuda"] = HostStagedBackend(get_backend(cpu_name))
    else:
        backends["cuda"] = get_backend(name)
    return backends
