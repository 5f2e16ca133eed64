"""Re-forming the job from the ranks still alive after a failure (in-process elastic recovery).

While ``hvd.elastic.run`` is active, every rank bumps a heartbeat counter in the job's store
(thread "accord-elastic-heartbeat"). After a failure each survivor shuts down and calls
:meth:`Membership.regroup`: the first to arrive leads, waits until every member of the last
generation has arrived or every missing one's heartbeat has stopped (or ACCORD_ELASTIC_TIMEOUT
passes), and publishes the new member list. Each rank's new rank is its index in that list;
members keep their first rank as a stable id. Then ``init()`` bootstraps the smaller job.

This needs a store that outlives the ranks, i.e. the launcher's (accordrun / accord.spawn).
Elsewhere (torchrun, mpirun) a reset re-initializes the same ranks, which recovers from
transient errors but not from a lost rank.
"""
from __future__ import annotations

import json
import logging
import threading
import time

from accord import config
from accord.errors import RankFailedError, with_hint
from accord.torch import gateway

log = logging.getLogger("accord.elastic")

_HEARTBEAT_S = 0.5
_DEAD_AFTER_S = 2.0  # a heartbeat counter that did not move for this long belongs to a dead rank
_BOOTSTRAPS_KEY = "accord/bootstraps"  # accord.runtime.rendezvous's generation counter


class Membership:
    """Who is in the job across resets: stable member ids (first ranks) in current rank order."""

    def __init__(self) -> None:
        self.member_id = gateway.rank()
        self.members = list(range(gateway.size()))
        self.epoch = 0
        self._store = _job_store()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._store is not None:
            self._thread = threading.Thread(target=self._beat, name="accord-elastic-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _key(self, what: str) -> str:
        return f"accord/elastic/{what}"

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(self._key(f"hb/{self.member_id}"), 1)
            except Exception as exc:  # the store went away: the job is over
                log.debug("elastic heartbeat stopped: %s", exc)
                return
            self._stop.wait(_HEARTBEAT_S)

    def stop(self) -> None:
        """Stop the heartbeat and release the store connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._store is not None:
            self._store.close()

    def regroup(self) -> None:
        """Agree on the surviving members and set this rank's new place for the next init().

        Raises:
            RankFailedError: this rank was left out (it arrived after the new group formed).
        """
        if self._store is None:
            return
        self.epoch += 1
        base = self._key(f"e{self.epoch}")
        store = self._store
        store.set(f"{base}/arrived/{self.member_id}", b"1")
        timeout = float(config.get("ACCORD_ELASTIC_TIMEOUT"))
        if int(store.add(f"{base}/count", 1)) == 1:
            members = self._lead(base, timeout)
        else:
            store.wait([f"{base}/members"], _seconds(timeout + 10))
            members = json.loads(store.get(f"{base}/members"))
        if self.member_id not in members:
            raise RankFailedError(with_hint(
                f"member {self.member_id} reached the elastic regroup after the surviving ranks "
                f"had formed a new job without it ({members})",
                f"raise ACCORD_ELASTIC_TIMEOUT (now {timeout:g}s) if ranks are slow to notice failures"))
        self.members = members
        rank, size = members.index(self.member_id), len(members)
        log.warning("elastic: regrouped as rank %d of %d (members %s)", rank, size, members)
        config.set_variables({"ACCORD_RANK": str(rank), "ACCORD_SIZE": str(size),
                              "ACCORD_LOCAL_RANK": None, "ACCORD_LOCAL_SIZE": None,
                              "ACCORD_CROSS_RANK": None, "ACCORD_CROSS_SIZE": None})

    def _lead(self, base: str, timeout: float) -> list[int]:
        store = self._store
        deadline = time.monotonic() + timeout
        beats = {m: (self._count(f"hb/{m}"), time.monotonic()) for m in self.members}
        while True:
            arrived = [m for m in self.members if store.check([f"{base}/arrived/{m}"])]
            missing = [m for m in self.members if m not in arrived]
            now = time.monotonic()
            for m in missing:
                count = self._count(f"hb/{m}")
                if count != beats[m][0]:
                    beats[m] = (count, now)
            if not missing or all(now - beats[m][1] >= _DEAD_AFTER_S for m in missing) or now > deadline:
                break
            time.sleep(0.1)
        # The runtime numbers bootstraps as counter // size: start the new size on a multiple.
        count = int(store.add(_BOOTSTRAPS_KEY, 0))
        if count % len(arrived):
            store.add(_BOOTSTRAPS_KEY, len(arrived) - count % len(arrived))
        store.set(f"{base}/members", json.dumps(arrived))
        if missing:
            log.warning("elastic: continuing without members %s", missing)
        return arrived

    def _count(self, what: str) -> int:
        return int(self._store.add(self._key(what), 0))


def _seconds(value: float):
    from datetime import timedelta

    return timedelta(seconds=value)


def _job_store():
    """A client of the launcher's store, or None when the job has no store that outlives ranks."""
    from accord.runtime import environments as envs
    from accord.runtime.bootstrap import load_secret
    from accord.runtime.store_client import StoreClient

    env = envs.detect(config.snapshot())
    if env.rendezvous != envs.ACCORD_STORE:
        return None
    secret = load_secret(env)
    if secret is None:
        return None
    timeout = float(config.get("ACCORD_ELASTIC_TIMEOUT")) + 30
    return StoreClient(env.store_addr, env.store_port, secret, timeout=timeout)
