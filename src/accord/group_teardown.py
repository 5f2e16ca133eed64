"""Destroying torch.distributed process groups without torch < 2.8's Gloo teardown deadlock.

Before torch 2.8 (pytorch PR 154976) a Gloo group's destructor joins the group's worker threads
while holding the GIL. A worker that has just finished a collective drops its reference to the
work, and with it possibly the last reference to a tensor created in Python; freeing that tensor
takes the GIL. If the destructor runs in that window, each waits for the other forever (seen with
torch 2.4: about one 3-rank test run in three hung in ``destroy_process_group``). Sleeping a
moment first releases the GIL, so such a worker can finish before the join.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

# How long the GIL is let go before a group is destroyed on an affected torch: a worker needs it
# for microseconds; the margin is for a loaded machine that schedules the worker late.
LINGER_S = 0.05


def _destructor_releases_gil(version: str) -> bool:
    return TorchVersion(version) >= "2.8"


DESTRUCTOR_RELEASES_GIL = _destructor_releases_gil(torch.__version__)


def destroy_process_group(group: dist.ProcessGroup | None = None) -> None:
    """``dist.destroy_process_group(group)`` (every group when None), after letting Gloo's worker
    threads drop their finished work where the torch in use needs that."""
    if not DESTRUCTOR_RELEASES_GIL:
        time.sleep(LINGER_S)
    dist.destroy_process_group(group)


def release_group(group: dist.ProcessGroup | None) -> None:
    """Let a private library group go (one built directly, not through ``new_group``): shut it down
    where torch can, after the same pause as :func:`destroy_process_group` on an affected torch.
    The caller drops its last reference right after."""
    if group is None:
        return
    if not DESTRUCTOR_RELEASES_GIL:
        time.sleep(LINGER_S)
    shutdown = getattr(group, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except RuntimeError:  # backends of torch versions that do not implement it
            pass
