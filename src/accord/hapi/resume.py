"""Resuming ``Model.fit`` from its last epoch checkpoint after a whole-job restart.

``fit(save_dir=...)`` writes ``save_dir/<epoch>.pt`` and ``.opt.pt`` (rank 0, atomically, the
optimizer's file last). After ``accordrun --max-restarts`` (or torchrun's) started the job again,
``ACCORD_RESTART_COUNT`` / ``TORCHELASTIC_RESTART_COUNT`` is above 0: fit then loads the latest
complete epoch checkpoint on every rank and goes on with the next epoch, whose data order is the
uninterrupted run's (shuffled by ``(seed, epoch)``).
"""
from __future__ import annotations

import os
import re
from typing import Any

from accord import config

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
