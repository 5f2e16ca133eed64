"""Re-forming the job when its members change (in-process elastic recovery).

While ``hvd.elastic.run`` is active, every rank bumps a heartbeat counter in the job's store
(thread "accord-elastic-heartbeat") and watches the host-update counter: when accordrun's
elastic driver (or a new worker) announces a host change, :attr:`Membership.on_update` is
called, so the state raises ``HostsUpdatedInterrupt`` at the next commit.

After a failure or that interrupt each rank shuts down and calls :meth:`Membership.regroup`.
The first to arrive leads: it waits until every member of the last generation has arrived, or
is known dead (the launcher marks ended workers) or its heartbeat has stopped (or
ACCORD_ELASTIC_TIMEOUT passes; a member that said it is ending with an error is waited for
until the elastic driver marks it dead, see :meth:`Membership._dead_after`), counts the host
changes announced so far, leaves out the members the launcher asked to leave (their host
went away), takes in the workers waiting to join (:mod:`accord.runtime.admission`), waits for
joiners while below ACCORD_ELASTIC_MIN_NP, and publishes the new member list. Each rank's new
rank is its index in that list: survivors first in their old order (so the new rank 0 is the
lowest surviving rank, whose state the others receive), then the joiners. A member the launcher
asked to leave gets :class:`MemberRemoved`. Then ``init()`` bootstraps the new job, and host
changes the re-formation did not count are announced again (:meth:`Membership.after_reset`).

This needs a store that outlives the ranks, i.e. the launcher's (accordrun / accord.spawn).
Elsewhere (torchrun, mpirun) a reset re-initializes the same ranks, which recovers from
transient errors but not from a lost rank.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta
from typing import Callable

from accord import config
from accord.errors import RankFailedError, with_hint
from accord.runtime import admission
from accord.runtime.rendezvous import reserve_new_generation
from accord.runtime.settings import ElasticSettings
from accord.torch import gateway
from accord.worker_contract import (
    ELASTIC_DEAD_KEY,
    ELASTIC_JOINER_KEY,
    ELASTIC_JOINERS_KEY,
    ELASTIC_LATEST_KEY,
    ELASTIC_LAUNCH_KEY,
    ELASTIC_LAUNCHED_KEY,
    ELASTIC_LEAVING_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)

log = logging.getLogger("accord.elastic")

_HEARTBEAT_S = 0.25
_DEAD_AFTER_S = 2.0  # a heartbeat counter that did not move for this long belongs to a dead rank
_SETTLE_S = 10.0  # how long a re-formation waits for added workers that have not asked to join
_EXIT_WAIT_S = 15.0  # how long a re-formation waits for accordrun to see a failing member's end


class MemberRemoved(SystemExit):
    """This worker's host left the elastic job: it ends with status 0 (raised by regroup).

    Args:
        member_id: the worker's stable member id in the job (:class:`Membership`).
    """

    def __init__(self, member_id: int) -> None:
        super().__init__(0)
        self.member_id = member_id


class Membership:
    """Who is in the job across resets: stable member ids in current rank order."""

    def __init__(self) -> None:
        joined = admission.admitted()
        elastic = ElasticSettings.from_config()
        self.member_id = elastic.member_id if elastic.member_id is not None else gateway.rank()
        self.members = joined.members if joined else list(range(gateway.size()))
        self.epoch = joined.epoch if joined else 0
        self.on_update: Callable[[str], None] | None = None
        self._notified = joined.updates if joined else 0
        self._covered = self._notified  # the host changes the last re-formation took in
        self._lock = threading.Lock()
        self._store = admission.job_store(elastic)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._store is not None:
            if self._store.check([self._key(f"exiting/{self.member_id}")]):  # caught and run again
                self._store.set(self._key(f"exiting/{self.member_id}"), b"0")
            self._thread = threading.Thread(target=self._beat, name="accord-elastic-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _key(self, what: str) -> str:
        return f"accord/elastic/{what}"

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(self._key(f"hb/{self.member_id}"), 1)
                self._watch_updates()
            except Exception as exc:  # the store went away: the job is over
                log.debug("elastic heartbeat stopped: %s", exc)
                return
            self._stop.wait(_HEARTBEAT_S)

    def _watch_updates(self) -> None:
        """Call on_update once for the host changes announced since the last look."""
        count = int(self._store.add(ELASTIC_UPDATES_KEY, 0))
        with self._lock:
            first, self._notified = self._notified + 1, max(self._notified, count)
        if count < first or self.on_update is None:
            return
        kinds = set()
        for n in range(first, count + 1):
            key = ELASTIC_UPDATE_KEY.format(n=n)
            kinds.add(self._store.get(key).decode() if self._store.check([key]) else "added")
        self.on_update("removed" if kinds == {"removed"} else "added")

    def after_reset(self) -> None:
        """Announce again the host changes the last re-formation did not take in.

        The state's reset drops the updates announced while the job re-formed; those it took in
        are done, but a later one (say, the removal of a failed worker's host-mates, announced
        after the survivors had re-formed without waiting for it) must still interrupt the next
        commit. The heartbeat thread delivers them again at its next look.
        """
        with self._lock:
            self._notified = self._covered

    def stop(self) -> None:
        """Stop the heartbeat and release the store connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._store is not None:
            self._store.close()

    def regroup(self) -> None:
        """Agree on the new members and set this rank's new place for the next init().

        Raises:
            MemberRemoved: the launcher asked this member to leave (its host went away).
            RankFailedError: this rank was left out (it arrived after the new group formed).
        """
        if self._store is None:
            return
        self.epoch += 1
        base = self._key(f"e{self.epoch}")
        store = self._store
        store.set(f"{base}/arrived/{self.member_id}", b"1")
        timeout = ElasticSettings.from_config().timeout  # each re-formation reads the environment anew
        if int(store.add(f"{base}/count", 1)) == 1:
            record = self._lead(base, timeout)
        else:
            store.wait([ELASTIC_MEMBERS_KEY.format(epoch=self.epoch)], timedelta(seconds=2 * timeout + 10))
            record = admission.published(store, self.epoch)
        members = record["members"]
        with self._lock:
            self._covered = int(record["updates"])
            self._notified = max(self._notified, self._covered)
        if self.member_id not in members:
            if store.check([ELASTIC_LEAVING_KEY.format(member=self.member_id)]):
                log.warning("elastic: worker %d leaves the job (its host was removed)", self.member_id)
                raise MemberRemoved(self.member_id)
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

    def _lead(self, base: str, timeout: float) -> dict:
        store = self._store
        elastic = ElasticSettings.from_config()
        deadline = time.monotonic() + timeout
        beats = {m: (self._count(f"hb/{m}"), time.monotonic()) for m in self.members}
        while True:
            arrived = [m for m in self.members if store.check([f"{base}/arrived/{m}"])]
            missing = [m for m in self.members if m not in arrived and not self._dead(m)]
            now = time.monotonic()
            for m in missing:
                count = self._count(f"hb/{m}")
                if count != beats[m][0]:
                    beats[m] = (count, now)
            given_up = all(now - beats[m][1] >= self._dead_after(m, elastic) for m in missing)
            if not missing or given_up or now > deadline:
                break
            time.sleep(0.05)
        # Read once everyone is here, before the leaving marks and the joiners: the launcher marks
        # leavers before it announces their removal, and a joiner registers before it announces
        # itself, so every change counted here is part of this re-formation. (Read earlier, a
        # removal announced while the ranks gathered, e.g. a failed worker's host-mates, would
        # make everyone re-form a second time for nothing.)
        updates = int(store.add(ELASTIC_UPDATES_KEY, 0))
        staying = [m for m in arrived if not store.check([ELASTIC_LEAVING_KEY.format(member=m)])]
        # Every joiner whose announcement is counted in ``updates`` is listed here; later ones
        # trigger another re-formation. Workers the launcher started but that have not asked to
        # join yet (a host with several slots starts several at once) are waited for a little, so
        # that one host is one re-formation.
        joiners = self._joiners(set(self.members))
        min_np = elastic.min_np
        settle = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline:
            pending = self._launched() - set(joiners) - set(self.members)
            pending = {m for m in pending if not self._dead(m)}
            if len(staying) + len(joiners) >= min_np and (not pending or time.monotonic() > settle):
                break
            time.sleep(0.1)
            updates = int(store.add(ELASTIC_UPDATES_KEY, 0))
            joiners = self._joiners(set(self.members))
        members = staying + joiners
        if len(members) < min_np:
            log.warning("elastic: re-forming with %d members, below ACCORD_ELASTIC_MIN_NP %d",
                        len(members), min_np)
        if members:  # the re-formed job bootstraps as a generation of its own
            reserve_new_generation(store, len(members))
        record = {"members": members, "updates": updates}
        store.set(ELASTIC_MEMBERS_KEY.format(epoch=self.epoch), json.dumps(record))
        latest = int(store.add(ELASTIC_LATEST_KEY, 0))
        store.add(ELASTIC_LATEST_KEY, self.epoch - latest)
        gone = [m for m in self.members if m not in staying]
        if gone:
            log.warning("elastic: continuing without members %s", gone)
        return record

    def mark_exiting(self) -> None:
        """Tell the others this member is ending with an error (its process is about to exit)."""
        if self._store is not None:
            try:
                self._store.set(self._key(f"exiting/{self.member_id}"), b"1")
            except Exception as exc:  # the store went away: nobody is left to tell
                log.debug("elastic: could not mark member %d exiting: %s", self.member_id, exc)

    def _dead_after(self, member: int, elastic: ElasticSettings) -> float:
        """Seconds without a heartbeat after which a missing member counts as gone.

        A member that said it is ending with an error is gone at once, unless accordrun's elastic
        driver runs the job (members have ACCORD_ELASTIC_ID): its process may take seconds to
        exit (torch's teardown), and the driver decides then which of its host-mates leave too
        (the failed host is blacklisted). Waiting for the driver's dead mark lets the survivors
        re-form once, without all of them, as Horovod's do.
        """
        key = self._key(f"exiting/{member}")
        if not self._store.check([key]) or self._store.get(key) != b"1":
            return _DEAD_AFTER_S
        return _EXIT_WAIT_S if elastic.member_id is not None else 0.0

    def _joiners(self, known: set[int]) -> list[int]:
        """Workers waiting to join (not dead, not members already), in id order."""
        store = self._store
        count = int(store.add(ELASTIC_JOINERS_KEY, 0))
        found = set()
        for n in range(1, count + 1):
            key = ELASTIC_JOINER_KEY.format(n=n)
            if store.check([key]):
                member = int(store.get(key))
                if member not in known and not self._dead(member):
                    found.add(member)
        return sorted(found)

    def _launched(self) -> set[int]:
        """The ids of every worker the launcher added to the running job."""
        store = self._store
        count = int(store.add(ELASTIC_LAUNCHED_KEY, 0))
        keys = [ELASTIC_LAUNCH_KEY.format(n=n) for n in range(1, count + 1)]
        return {int(store.get(k)) for k in keys if store.check([k])}

    def _dead(self, member: int) -> bool:
        return bool(self._store.check([ELASTIC_DEAD_KEY.format(member=member)]))

    def _count(self, what: str) -> int:
        return int(self._store.add(self._key(what), 0))
