"""Which actor gets which rank, and what each one's environment is.

Ranks fill Ray nodes in the order the nodes first appear among the actors (so the ranks of one
node are contiguous, as accordrun fills a host's slots), and the host name accord sees for a
rank is its node's IP address: two Ray nodes on one machine share it, and are one host to
accord (shared memory works between them), as they should be. Local and cross ranks follow
:mod:`accord.placement`, through :func:`accord.run.spec.assignment.slots_on`.

With GPUs, every worker of a node sees the GPUs Ray gave that node's workers, in local-rank
order (``CUDA_VISIBLE_DEVICES``), so ``torch.cuda.set_device(hvd.local_rank())`` picks the
worker's own GPU, as under accordrun and horovod.ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from accord.run.spec.assignment import Slot, slots_on
from accord.run.spec.worker_env import SECRET_VAR, JobEnv, contract_env


@dataclass(frozen=True)
class Placed:
    """One actor's place: its index among the actors started, and its slot."""

    actor: int
    slot: Slot


def rank_order(descriptions: Sequence[Mapping[str, Any]]) -> list[int]:
    """Actor indices in rank order: grouped by node (nodes in order of first appearance),
    start order within a node.

    Example: nodes ``[a, b, a]`` -> ``[0, 2, 1]``.
    """
    first: dict[str, int] = {}
    for d in descriptions:
        first.setdefault(d["node_id"], len(first))
    return sorted(range(len(descriptions)), key=lambda i: (first[descriptions[i]["node_id"]], i))


def place(descriptions: Sequence[Mapping[str, Any]]) -> list[Placed]:
    """Every actor's slot, in rank order."""
    order = rank_order(descriptions)
    slots = slots_on([descriptions[i]["ip"] for i in order])
    return [Placed(actor=i, slot=s) for i, s in zip(order, slots)]


def visible_devices(descriptions: Sequence[Mapping[str, Any]], placed: Sequence[Placed]) -> dict[int, str]:
    """``CUDA_VISIBLE_DEVICES`` per actor: its host's workers' GPUs in local-rank order."""
    per_host: dict[str, list[str]] = {}
    for p in sorted(placed, key=lambda p: p.slot.local_rank):
        per_host.setdefault(p.slot.hostname, []).extend(descriptions[p.actor]["gpu_ids"])
    return {p.actor: ",".join(dict.fromkeys(per_host[p.slot.hostname])) for p in placed}


def environment(slot: Slot, job: JobEnv, secret_hex: str, extra: Mapping[str, str]) -> dict[str, str]:
    """A worker's environment: the contract for ``slot``, ``extra`` (settings, the user's
    ``extra_env_vars``) and the secret."""
    env = contract_env(slot, job)
    env.update(extra)
    env[SECRET_VAR] = secret_hex
    return env
