"""Checkpoint files of ``Model.save`` / ``Model.load``.

``<path>.pt`` holds the network's ``state_dict``; ``<path>.opt.pt`` the optimizer's (and the
loss scaler's) state and, under AMP O2, the float32 master weights (``master_weights``: by the
network's parameter names, as Paddle's optimizer ``state_dict`` keeps them), so training resumes
exactly: the ``.pt`` file alone holds the half-precision weights. Files are written to a
temporary name and renamed, so a reader never sees half a file, and read back with
``torch.load(weights_only=True)``: a checkpoint cannot run code.

Resuming ``Model.fit`` after a whole-job restart (:func:`resume_epoch`): ``fit(save_dir=...)``
writes ``save_dir/<epoch>.pt`` and ``.opt.pt`` (the optimizer's file last). When
``ACCORD_RESTART_COUNT`` / ``TORCHELASTIC_RESTART_COUNT`` is above 0 (``accordrun
--max-restarts``, torchrun), fit loads the latest complete epoch checkpoint on every rank and goes
on with the next epoch, whose data order is the uninterrupted run's (shuffled by ``(seed, epoch)``).
"""
from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch import nn

from accord import config
from accord.errors import with_hint
from accord.hapi.master_weights import MasterWeights
from accord.hapi.world import World

__all__ = ["latest_epoch", "load_checkpoint", "load_on_every_rank", "resume_epoch", "save_checkpoint",
           "should_resume"]


def _atomic_save(obj: Any, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(path: str, network: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler: Any = None, masters: MasterWeights | None = None,
                    optimizer_state: dict[str, Any] | None = None) -> None:
    """Write ``path.pt`` and, when an optimizer is given, ``path.opt.pt`` (with ``masters``).
    ``optimizer_state``: the optimizer's state dict when the caller has it already (a sharded
    optimizer's, consolidated on every rank)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _atomic_save(network.state_dict(), path + ".pt")
    if optimizer is not None:
        extra = {"optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state}
        if scaler is not None:
            extra["scaler"] = scaler.state_dict()
        if masters is not None:
            extra["master_weights"] = masters.named_masters()
        _atomic_save(extra, path + ".opt.pt")


def load_checkpoint(path: str, network: nn.Module, device: torch.device,
                    optimizer: torch.optim.Optimizer | None = None, scaler: Any = None,
                    skip_mismatch: bool = False, masters: MasterWeights | None = None) -> None:
    """Load ``path`` (or ``path.pt``) into ``network`` and, when given and saved, the optimizer.

    ``masters`` (AMP O2) follow the loaded parameters: the saved masters where ``path.opt.pt``
    has them (also when ``optimizer`` is None: they are weights, not optimizer state), else the
    loaded half values upcast.

    Raises:
        FileNotFoundError: ``path.pt`` does not exist.
    """
    base = path[:-3] if path.endswith(".pt") else path
    if not os.path.exists(base + ".pt"):
        raise FileNotFoundError(with_hint(f"no checkpoint at {base}.pt",
                                          "pass the path given to model.save() (without .pt)"))
    state = torch.load(base + ".pt", map_location=device, weights_only=True)
    if skip_mismatch:
        own = network.state_dict()
        state = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    network.load_state_dict(state, strict=not skip_mismatch)
    extra = {}
    if (optimizer is not None or masters is not None) and os.path.exists(base + ".opt.pt"):
        extra = torch.load(base + ".opt.pt", map_location=device, weights_only=True)
    if optimizer is not None and "optimizer" in extra:
        optimizer.load_state_dict(extra["optimizer"])
        if scaler is not None and "scaler" in extra:
            scaler.load_state_dict(extra["scaler"])
    if masters is not None:
        masters.load_named(extra.get("master_weights"), state)


def load_on_every_rank(world: World, path: str, network: nn.Module, device: torch.device,
                       optimizer: torch.optim.Optimizer | None = None, scaler: Any = None,
                       skip_mismatch: bool = False, masters: MasterWeights | None = None) -> None:
    """Rank 0 loads (see :func:`load_checkpoint`) and broadcasts what it loaded to every rank.

    The other ranks never open the files: they need not see them, nor can they read a stale
    copy. Rank 0 tells everyone whether it succeeded before anything else, so a missing file
    fails on every rank instead of leaving the others waiting.

    Raises:
        FileNotFoundError: on rank 0, the checkpoint is missing. RuntimeError: on the other
            ranks, rank 0 could not load it.
    """
    error: BaseException | None = None
    if world.rank == 0:
        try:
            load_checkpoint(path, network, device, optimizer, scaler, skip_mismatch, masters)
        except BaseException as exc:  # told to the other ranks first, then re-raised
            error = exc
    if world.distributed:
        if world.agree(error is None, "accord.hapi.load"):
            world.broadcast_state(network, optimizer, scaler=scaler, masters=masters)
        elif error is None:
            raise RuntimeError(with_hint(f"rank 0 could not load the checkpoint {path!r}",
                                         "see rank 0's error; the files must exist where rank 0 runs"))
    if error is not None:
        raise error


_EPOCH_FILE = re.compile(r"^(\d+)\.opt\.pt$")


def latest_epoch(save_dir: str) -> int | None:
    """The last epoch with a complete checkpoint in ``save_dir`` (its ``.opt.pt`` is written
    after its ``.pt``), or None."""
    try:
        names = os.listdir(save_dir)
    except OSError:
        return None
    epochs = [int(m.group(1)) for m in map(_EPOCH_FILE.match, names) if m]
    epochs = [e for e in epochs if os.path.exists(os.path.join(save_dir, f"{e}.pt"))]
    return max(epochs) if epochs else None


def should_resume(resume: bool | None) -> bool:
    """``resume`` as given, or (None) whether this is a restarted attempt of the job."""
    return bool(config.get("ACCORD_RESTART_COUNT")) if resume is None else resume


def resume_epoch(model: Any, save_dir: str | None, resume: bool | None) -> int:
    """Load ``model``'s latest epoch checkpoint in ``save_dir`` when resuming (rank 0 looks, every
    rank loads); return the epoch to start at (0 when there is nothing to resume from).
    Call it on every rank."""
    if not save_dir or not should_resume(resume):
        return 0
    epoch = model.world.broadcast_object(latest_epoch(save_dir) if model.rank == 0 else None,
                                         "accord.hapi.resume.epoch")
    if epoch is None:
        return 0
    model.load(os.path.join(save_dir, str(epoch)))
    return int(epoch) + 1
