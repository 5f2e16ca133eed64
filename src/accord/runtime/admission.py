"""A worker added to a running elastic job waits here, in ``init()``, until the job admits it.

accordrun starts such a worker with ``ACCORD_ELASTIC_JOIN=1`` and its member id
(``ACCORD_ELASTIC_ID``). :func:`join_if_new` registers the id as a joiner in the launcher's
store, tells the running workers that a host was added (they see ``HostsUpdatedInterrupt`` at
their next commit), and waits until a re-formation publishes a member list that holds it
(:mod:`accord.torch.elastic.reform` leads those). Its rank is then its place in that list; the
bootstrap that follows meets the running workers, who re-initialise at the same time.

The store keys are :mod:`accord.worker_contract`'s ``ELASTIC_*``.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from accord import config
from accord.errors import RendezvousError, with_hint
from accord.runtime.settings import ElasticSettings, joins_running_job
from accord.worker_contract import (
    ELASTIC_JOINER_KEY,
    ELASTIC_JOINERS_KEY,
    ELASTIC_LATEST_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)

log = logging.getLogger("accord.elastic")

_POLL_S = 0.05


@dataclass(frozen=True)
class Admission:
    """Where a joiner came in: the re-formation ``epoch``, its ``members`` (ids in rank order)
    and the host-update count that re-formation covered."""

    member_id: int
    epoch: int
    members: list[int]
    updates: int


_admitted: Admission | None = None


def admitted() -> Admission | None:
    """How this process was admitted to its elastic job, or None (it started with the job)."""
    return _admitted


def job_store(elastic: ElasticSettings, extra_timeout: float = 30.0) -> Any:
    """A client of the launcher's store, or None when the job has no store that outlives its
    ranks (torchrun, mpirun, a single process). Its requests may wait the elastic timeout plus
    ``extra_timeout`` seconds."""
    from accord.runtime import environments as envs
    from accord.runtime.bootstrap import load_secret
    from accord.runtime.store_client import StoreClient

    env = envs.detect(config.snapshot())
    if env.rendezvous != envs.ACCORD_STORE:
        return None
    secret = load_secret(env)
    if secret is None:
        return None
    return StoreClient(env.store_addr, env.store_port, secret, timeout=elastic.timeout + extra_timeout)


def notify_update(store: Any, kind: str) -> int:
    """Tell the job's workers that hosts changed (``kind``: "added" or "removed")."""
    n = int(store.add(ELASTIC_UPDATES_KEY, 1))
    store.set(ELASTIC_UPDATE_KEY.format(n=n), kind)
    return n


def published(store: Any, epoch: int) -> dict[str, Any]:
    """The record of re-formation ``epoch``: ``{"members": [...], "updates": n}``."""
    return json.loads(store.get(ELASTIC_MEMBERS_KEY.format(epoch=epoch)))


def join_if_new() -> None:
    """Wait to be admitted when this process was added to a running elastic job; no-op else.

    Raises:
        RendezvousError: no launcher store, or no admission within ACCORD_ELASTIC_TIMEOUT.
    """
    global _admitted
    if not joins_running_job():
        return
    elastic = ElasticSettings.from_config()
    member_id, timeout = elastic.member_id, elastic.timeout
    store = job_store(elastic)
    if store is None or member_id is None:
        raise RendezvousError(with_hint(
            "ACCORD_ELASTIC_JOIN is set but there is no launcher store or ACCORD_ELASTIC_ID",
            "only accordrun --host-discovery-script starts workers that join a running job"))
    try:
        n = int(store.add(ELASTIC_JOINERS_KEY, 1))
        store.set(ELASTIC_JOINER_KEY.format(n=n), str(member_id))
        notify_update(store, "added")
        _admitted = _wait(store, member_id, timeout)
    finally:
        store.close()
    log.warning("elastic: worker %d admitted as rank %d of %d", member_id,
                _admitted.members.index(member_id), len(_admitted.members))
    config.set_variables({"ACCORD_RANK": str(_admitted.members.index(member_id)),
                          "ACCORD_SIZE": str(len(_admitted.members)),
                          "ACCORD_LOCAL_RANK": None, "ACCORD_LOCAL_SIZE": None,
                          "ACCORD_CROSS_RANK": None, "ACCORD_CROSS_SIZE": None,
                          "ACCORD_ELASTIC_JOIN": None})


def _wait(store: Any, member_id: int, timeout: float) -> Admission:
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        if store.check([ELASTIC_LATEST_KEY]):
            latest = int(store.add(ELASTIC_LATEST_KEY, 0))
            for epoch in range(seen + 1, latest + 1):
                record = published(store, epoch)
                if member_id in record["members"]:
                    return Admission(member_id, epoch, list(record["members"]), int(record["updates"]))
            seen = max(seen, latest)
        time.sleep(_POLL_S)
    raise RendezvousError(with_hint(
        f"elastic worker {member_id} was not admitted to the running job within {timeout:g}s",
        "the running workers admit new ones at their next state.commit(): commit more often, "
        "or raise --elastic-timeout"))
