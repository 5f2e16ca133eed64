"""Where a ``Model`` runs: one process, or one rank of an accord job, and the few collectives
it needs (sum a vector, gather rows, broadcast one rank's state, agree on one rank's flag,
join when out of data).

The same script runs unchanged alone or under a launcher: when the script already called
``accord.torch.init()`` the job is used as is; when accordrun, accord.spawn, torchrun or mpirun
started more than one process, :func:`resolve_world` initialises accord itself (Horovod-style:
left running until the script exits); otherwise there is nothing to communicate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from accord import config
from accord.errors import with_hint
from accord.runtime import environments

__all__ = ["World", "resolve_world"]


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    Attributes:
        size, rank, local_rank: as in Horovod.
        initialised_here: True when :func:`resolve_world` called ``accord.torch.init()``.
    """

    size: int = 1
    rank: int = 0
    local_rank: int = 0
    initialised_here: bool = False

    @property
    def distributed(self) -> bool:
        """True when there are other ranks to talk to."""
        return self.size > 1

    def default_device(self) -> torch.device:
        """``cuda:<local_rank>`` when a GPU is visible, else the CPU."""
        return self.placement("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def placement(self, device: str | torch.device | None) -> torch.device:
        """Where ``Model(device=...)`` puts the network: :meth:`default_device` for None, and
        this rank's GPU (``cuda:<local_rank>``) for a bare ``"cuda"``, as ranks sharing a host
        must not all land on GPU 0; anything else as given."""
        if device is None:
            return self.default_device()
        place = torch.device(device)
        if place.type == "cuda" and place.index is None:
            count = torch.cuda.device_count()
            if count == 0:
                raise RuntimeError(with_hint(f"Model(device={str(device)!r}): torch sees no CUDA device",
                                             "leave device unset (the CPU is used when no GPU is visible)"))
            place = torch.device("cuda", self.local_rank % count)
        return place

    # --- collectives (every rank must call them in the same order) -----------------------------

    def allreduce_sum(self, vector: torch.Tensor, name: str) -> torch.Tensor:
        """Elementwise sum over ranks of a CPU vector (a copy when alone)."""
        if not self.distributed:
            return vector.clone()
        import accord.torch as hvd

        return hvd.allreduce(vector, name=name, op=hvd.Sum)

    def allgather_rows(self, outputs: list[torch.Tensor] | None, name: str) -> list[torch.Tensor] | None:
        """For each output, every rank's rows concatenated in rank order.

        A rank that saw no data passes None (it cannot know how many outputs there are, nor
        their shapes). Returns None only when every rank passed None.

        Raises:
            ValueError: ranks disagree on the number, trailing shapes or dtypes of the outputs.
        """
        if not self.distributed:
            return outputs
        import accord.torch as hvd

        meta = None if outputs is None else [
            (tuple(t.shape[1:]), str(t.dtype).replace("torch.", "")) for t in outputs]
        metas = hvd.allgather_object(meta, name=f"{name}.meta")
        known = [m for m in metas if m is not None]
        if not known:
            return None
        if any(m != known[0] for m in known):
            seen = ", ".join(f"rank {r}: {m}" for r, m in enumerate(metas) if m is not None)
            raise ValueError(with_hint(f"outputs differ in number, trailing shape or dtype between ranks ({seen})",
                                       "make the network return the same shapes and dtypes for every batch"))
        if outputs is None:
            outputs = [torch.empty((0, *shape), dtype=getattr(torch, dtype)) for shape, dtype in known[0]]
        return [hvd.allgather(t.detach().cpu().contiguous(), name=f"{name}.{i}")
                for i, t in enumerate(outputs)]

    def agree(self, flag: bool, name: str, root: int = 0) -> bool:
        """Rank ``root``'s ``flag``, on every rank."""
        if not self.distributed:
            return flag
        import accord.torch as hvd

        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        hvd.broadcast_(value, root_rank=root, name=name)
        return bool(value.item())

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        """Rank ``root``'s ``obj`` (small, picklable), on every rank."""
        if not self.distributed:
            return obj
        import accord.torch as hvd

        return hvd.broadcast_object(obj, root_rank=root, name=name)

    def broadcast_state(self, network: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                        scaler: Any = None, root: int = 0, masters: torch.nn.Module | None = None) -> None:
        """Give every rank rank ``root``'s parameters and buffers, its AMP O2 master weights
        (``masters``), and its optimizer (and loss scaler) state when it has one.

        A fresh optimizer (no state yet) is identical everywhere already; broadcasting it would
        create state with a zero step (Horovod's way), which shifts Adam's bias correction.
        """
        if not self.distributed:
            return
        import accord.torch as hvd

        tensors = dict(network.state_dict())
        if masters is not None:  # one broadcast_parameters call: the engine can fuse them all
            tensors.update((f"accord.hapi.masters.{k}", v) for k, v in masters.state_dict().items())
        hvd.broadcast_parameters(tensors, root_rank=root)
        if getattr(optimizer, "shard_optimizer_state", False):  # (see state.is_sharded_optimizer)
            # Its state_dict() is a collective over shards that only root may have loaded; its
            # broadcast sends root's loaded state, if any, and never creates zero-step state.
            hvd.broadcast_optimizer_state(optimizer, root_rank=root)
        elif optimizer is not None and self.agree(bool(optimizer.state_dict()["state"]),
                                                  "accord.hapi.optimizer_has_state", root):
            hvd.broadcast_optimizer_state(optimizer, root_rank=root)
        if scaler is not None:  # a few floats: the object broadcast is simplest
            scaler.load_state_dict(self.broadcast_object(scaler.state_dict(), "accord.hapi.scaler", root))

    def join(self) -> int:
        """``accord.torch.join()``: this rank is out of data; serve the others' collectives (with
        zeros) until every rank has joined. Returns the rank that joined last."""
        if not self.distributed:
            return self.rank
        import accord.torch as hvd

        return int(hvd.join())


def _environment_size() -> int:
    """How many processes the launcher (accordrun, spawn, torchrun, mpirun, SLURM) started.

    Raises:
        ConfigError: the launcher's variables are malformed or contradict each other.
    """
    return environments.detect(config.snapshot()).size


def resolve_world() -> World:
    """Find (or start) the job this process belongs to.

    Raises:
        RendezvousError: the launcher says there are other ranks, but they could not be reached.
    """
    import accord.torch as hvd

    initialised_here = False
    if not hvd.is_initialized():
        if _environment_size() <= 1:
            return World()
        hvd.init()
        initialised_here = True
    return World(size=hvd.size(), rank=hvd.rank(), local_rank=hvd.local_rank(),
                 initialised_here=initialised_here)
