"""The launcher's side of an elastic job with host discovery (Horovod's elastic driver).

While the job runs, :class:`ElasticDriver` runs the discovery script every
``--discovery-interval`` (:mod:`accord.run.elastic.discovery`) and keeps the workers in line with the
hosts it prints (:func:`accord.run.elastic.plan.plan_changes`):

- **start**: the first workers start on every usable slot, up to ``--max-np``. When the hosts
  have fewer than ``-np`` slots (``ElasticConfig.start_np``; the script's first run may even
  have printed no host, then ``cfg.slots`` is empty), none start yet: the driver says
  so once, runs the script every interval and starts them once enough slots are usable, or
  fails the job after ``--elastic-timeout`` (:mod:`accord.run.elastic.start`; horovodrun's
  ``wait_for_available_slots(num_proc)``). Those slots get the command line's ``--gpus`` check
  before any worker starts (too few devices for a host's workers: ConfigError, exit 2).
- **growth**: free slots on usable hosts get new workers (up to ``--max-np``; with ``--gpus``,
  at most one worker per device listed on each host, said once for a host with more slots). A new worker
  starts with ``ACCORD_ELASTIC_JOIN=1``; its ``init()`` registers it in the store and tells the
  running workers (:mod:`accord.runtime.admission`), who see ``HostsUpdatedInterrupt`` at their
  next ``state.commit()`` and re-form with it (:mod:`accord.torch.elastic.reform`). Its
  environment carries the place that re-formation will give it (``HOROVOD_RANK``/``SIZE``/
  ``LOCAL_RANK``/... as horovodrun sets them for a worker it adds), worked out as the
  re-formation works it out (:meth:`ElasticDriver._world`): the members of the last
  re-formation that still run and are not leaving, in their order, then the workers waiting to
  join, by id. Its ``init()`` takes the rank the re-formation actually publishes, which differs
  only when the job changes again before it is admitted (another worker fails or joins first).
- **shrink**: the workers of a host that disappeared are marked *leaving* in the store and the
  workers told; at the re-formation the leaving ones exit with status 0. One that has not
  ended after the grace period of ``_LEAVE_GRACE`` seconds is stopped (TERM, grace, KILL).
- **failure**: a worker that exits non-zero gets its host blacklisted (:mod:`accord.run.elastic.blacklist`,
  ``--blacklist-cooldown-range``) and is marked dead in the store, so the survivors re-form
  without waiting for its heartbeat to stop (a worker added later that could not be started is
  marked dead too). The host's other workers leave (as horovodrun's), unless the job needs
  them to run ``--min-np`` workers: then they stay (a job on one machine goes on), and the
  blacklist only keeps new workers off the host. The job goes on while ``--min-np`` workers remain; below
  that it waits up to ``--elastic-timeout`` for discovery to bring hosts, then fails. Once
  failures have blacklisted every host discovered and no worker is left, the job fails at once
  with them (as horovodrun); so repeated failures on the only host end the job when its last
  worker fails (with ``--blacklist-cooldown-range``, a host whose cooldown ended first gets new
  workers again, each failure keeping it out twice as long, within ``--reset-limit``).

With ``--sync-dst-dir`` a host gets its first worker only once the working folder has been
copied there (:mod:`accord.run.elastic.sync`; the first hosts were copied at the launch): the
copy runs in the background while the driver keeps watching; a failed one is handled as a
worker that could not be started there (while waiting for the first slots: the job fails).

A discovery script that fails, hangs or prints garbage is warned about (naming the script and
what it did) and the job keeps its hosts. Without a script (``-H`` naming two or more hosts, with
``--min-np``: horovodrun's elastic job on fixed hosts) the hosts never change; failures still
blacklist theirs. ``--reset-limit`` caps the number of re-formations: changes the driver makes
before the workers have re-formed for the previous one count once, as they re-form once (a
failure, then the removal of the other workers on its host, is one reset, as in Horovod).
The job ends when every worker has ended: successfully when one finished its training (exit 0
without being asked to leave); workers still waiting to be admitted then are stopped. What the
driver reads and writes in the job's store is :mod:`accord.run.elastic.store`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from accord.errors import LaunchError, with_hint
from accord.run.elastic.blacklist import Blacklist
from accord.run.elastic.config import ElasticConfig
from accord.run.elastic.discovery import DiscoveryPoller, run_discovery
from accord.run.elastic.limits import JobLimits
from accord.run.elastic.plan import plan_changes, planned_slots, usable_hosts
from accord.run.elastic.start import StartWait
from accord.run.elastic.store import ElasticStore
from accord.run.elastic.sync import HostCopies
from accord.run.processes.failures import describe_returncode
from accord.run.processes.supervisor import Member, Supervisor
from accord.run.spec.assignment import Slot
from accord.run.spec.hosts import HostSlots
from accord.run.spec.worker_env import check_devices

_LEAVE_GRACE = 30.0  # seconds a leaving worker has to reach its next commit and exit
_WARN_EVERY = 30.0  # the same discovery error is repeated at most this often


@dataclass
class Worker:
    """One worker of the elastic job, by member id."""

    member: Member
    joining: bool  # started after the job began: admitted at a re-formation
    leaving_since: float | None = None  # when the launcher asked it to leave
    killed: bool = False


@dataclass
class Outcome:
    """How the job ended: ``failures`` (the root cause first) or ``error`` make it fail."""

    succeeded: list[int] = field(default_factory=list)
    lost: list[Any] = field(default_factory=list)  # Failure of workers the job went on without
    removed: list[int] = field(default_factory=list)
    failures: list[Any] = field(default_factory=list)
    error: str | None = None


class ElasticDriver:
    """Watches an elastic job (see the module docstring).

    Args:
        start_worker: ``start_worker(member_id, slot, joining)`` starts one worker on
            ``slot.hostname`` with the coordinates of ``slot`` (a first worker's, or the place a
            joining one will have once admitted) and returns its supervisor member; raises
            LaunchError when it cannot.
        failure: turns an ended member into a :class:`~accord.run.processes.failures.Failure`.
        store: a connection to the job's store (``set``/``add``/``get``/``check``/``closed``,
            :class:`~accord.store.connection.StoreConnection`).
        copies: with ``--sync-dst-dir``, the hosts holding the copy of the working folder and
            the copies running; None without.
    """

    def __init__(self, cfg: Any, elastic: ElasticConfig, supervisor: Supervisor, store: Any,
                 start_worker: Callable[[int, Slot, bool], Member], failure: Callable[[Member], Any],
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 copies: HostCopies | None = None) -> None:
        self.cfg = cfg
        self.elastic = elastic
        self.supervisor = supervisor
        self.store = ElasticStore(store, say)
        self._start_worker = start_worker
        self._failure = failure
        self._say = say
        self._clock = clock
        self.copies = copies
        self.blacklist = Blacklist(elastic.cooldown_range)
        self.discovered: list[HostSlots] = list(cfg.hosts)
        self.workers: dict[int, Worker] = {}
        self.next_id = 0
        self.limits = JobLimits(elastic, cfg.min_np or 1, say)
        self.outcome = Outcome()
        self._finishing = False
        self._wait: StartWait | None = None  # while waiting for -np slots to start on
        self._warned: dict[str, float] = {}
        self._capped: set[str] = set()  # hosts said to have more slots than --gpus devices
        # workers kept on a blacklisted host because without them fewer than --min-np would run
        self._kept: set[int] = set()
        script = elastic.discovery_script
        self._poller = None if script is None else DiscoveryPoller(
            lambda: run_discovery(script, elastic.slots_per_host, elastic.script_timeout, cwd=cfg.cwd),
            elastic.discovery_interval)

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the first workers (ranks of ``cfg.slots``) and the discovery thread; when the
        hosts have fewer than ``-np`` slots, start no worker yet: :meth:`poll` waits for them.

        Raises:
            LaunchError: a first worker could not be started.
        """
        now = self._clock()
        usable = usable_hosts(self.discovered, self.blacklist.blocked(now))
        wait = StartWait(self.elastic, since=now)
        if wait.slots(usable) is not None:
            for slot in self.cfg.slots:
                self._add(slot, joining=False)
        else:
            self._wait = wait
            self._say(wait.waiting(usable, self.discovered))
        if self._poller is not None:
            self._poller.start()

    def close(self) -> None:
        """Stop the discovery thread and the copies still running."""
        if self._poller is not None:
            self._poller.stop()
        if self.copies is not None:
            self.copies.close()

    def _add(self, slot: Slot, joining: bool) -> None:
        member_id = self.next_id
        self.next_id += 1
        if joining:  # known before it can ask to join: a re-formation waits a little for it
            self.store.launched(member_id)
        try:
            member = self._start_worker(member_id, slot, joining)
        except LaunchError:
            if joining:  # counted as launched above: the next re-formation would wait for it
                self.store.dead(member_id)
            raise
        self.workers[member_id] = Worker(member, joining)

    def _wait_for_slots(self, now: float) -> bool:
        """Before the first workers: start them once the usable hosts have ``-np`` slots;
        return True (the job is over, :attr:`outcome` says why) when the wait expired.

        Raises:
            LaunchError: a first worker could not be started.
        """
        assert self._wait is not None
        self._rediscover(now)
        usable = usable_hosts(self.discovered, self.blacklist.blocked(now))
        slots = self._wait.slots(usable)
        if slots is not None:
            # The command line's check of --gpus against the first workers' hosts, which the
            # script's first run did not print: nothing has started, so it is still exit 2.
            check_devices(self.cfg.devices, slots)
            hosts = [s.hostname for s in slots]
            if self.copies is not None and not self.copies.first_hosts_ready(hosts, self._announce_copies):
                return False  # the wait is over: no timeout while the copies run
            self._say(self._wait.starting(now, slots, self.discovered))
            self._wait = None
            for slot in slots:
                self._add(slot, joining=False)
            return False
        if self._wait.expired(now):
            self.outcome.error = self._wait.error(usable, self.discovered)
            return True
        return False

    # --- --sync-dst-dir: a host's first worker waits for the copy of the working folder ------------
    def _announce_copies(self, begun: list[str]) -> None:
        if begun and self.cfg.verbose:
            self._say(f"elastic: copying the working folder to {', '.join(begun)} (--sync-dst-dir) "
                      "before starting workers there")

    def _cannot_start(self, host: str, exc: LaunchError, now: float) -> None:
        """A worker could not be started on ``host`` (or the copy there failed): warn, blacklist it."""
        until = self.blacklist.add(host, now)
        self._say(f"warning: could not start a worker on {host}: {exc}; blacklisting it"
                  + ("" if until is None else f" for {until - now:.0f}s"))
        self._keep_if_needed(host)

    # --- one turn of the watch loop -------------------------------------------------------------
    def poll(self) -> bool:
        """Reap, rediscover, re-plan; return True when the job is over (see :attr:`outcome`)."""
        now = self._clock()
        if self._wait is not None:
            return self._wait_for_slots(now)
        for m in self.supervisor.reap():
            if m.kind == "worker":
                self._ended(self.workers[m.index], now)
        if self.outcome.failures or self.outcome.error:
            return True
        self._rediscover(now)
        if not self._finishing:
            self._replan(now)
        self._stop_overdue(now)
        if self._check_limits(now):
            return True
        running = [w for w in self.workers.values() if w.member.returncode is None]
        if not running:
            if not self.outcome.succeeded and not self.outcome.error:
                self.outcome.failures = list(self.outcome.lost)
                self.outcome.lost = []
            return True
        if self._finishing and all(w.joining and not self.store.admitted(i) for i, w in self._running()):
            for _, w in self._running():  # nobody is left to admit them
                self.supervisor.ask_to_stop(w.member)
                w.leaving_since = now
        return False

    def _every_host_blacklisted(self, now: float) -> bool:
        """True when every discovered host is blacklisted and no worker stays: none runs on a
        host that is not, and none is kept on a blacklisted one (a failed host's other workers
        are leaving, unless the job needed them for --min-np)."""
        blocked = self.blacklist.blocked(now)
        if any(h.hostname not in blocked for h in self.discovered):
            return False
        return not any(w.leaving_since is None and (w.member.host not in blocked or i in self._kept)
                       for i, w in self._running())

    def _running(self) -> list[tuple[int, Worker]]:
        return [(i, w) for i, w in self.workers.items() if w.member.returncode is None]

    def _ended(self, w: Worker, now: float) -> None:
        m = w.member
        if w.leaving_since is not None:
            self.store.dead(m.index)
            self.outcome.removed.append(m.index)
            return
        if m.returncode == 0:
            self.store.dead(m.index)
            self.outcome.succeeded.append(m.index)
            self._finishing = True  # training is over: no more workers
            return
        failure = self._failure(m)
        self._kept.discard(m.index)
        until = self.blacklist.add(m.host, now)
        self.limits.count_reset(self.store.reformations())
        alive = len([1 for _, x in self._running() if x.leaving_since is None])
        self._say(f"elastic: worker {m.index} on {m.host} ended ({describe_returncode(m.returncode)}); "
                  f"blacklisting {m.host} " + ("for the rest of the job" if until is None else
                                                 f"for {until - now:.0f}s")
                  + f"; {alive} workers remain (--min-np {self.cfg.min_np})")
        self._keep_if_needed(m.host)
        self.outcome.lost.append(failure)
        if not self._finishing:
            # Its host's other workers are marked to leave (and the change announced) before it
            # is marked dead: the survivors' re-formation waits for that mark, so it leaves them
            # out at once instead of re-forming a second time for them.
            self._replan(now)
        self.store.dead(m.index)

    def _keep_if_needed(self, host: str) -> None:
        """After ``host`` was blacklisted: keep its running workers when the job needs them to
        run --min-np workers (the job on one machine, or on hosts too few). Blacklisting then
        only keeps new workers off the host. Otherwise they leave, as in horovodrun: the job
        has enough workers elsewhere, or stays below --min-np even with them."""
        staying = [(i, w) for i, w in self._running() if w.leaving_since is None]
        on_host = sorted(i for i, w in staying if w.member.host == host and i not in self._kept)
        if not on_host:
            return
        blocked = self.blacklist.blocked(self._clock())
        elsewhere = [i for i, w in staying if i in self._kept or w.member.host not in blocked]
        min_np = self.cfg.min_np or 1
        if not len(elsewhere) < min_np <= len(elsewhere) + len(on_host):
            return
        self._kept.update(on_host)
        self._say(f"elastic: keeping workers {on_host} on {host} although it is blacklisted: without "
                  f"them {len(elsewhere)} workers would run, fewer than --min-np {min_np}; no new "
                  f"worker starts there while it is blacklisted")

    def _kept_per_host(self, now: float) -> dict[str, int]:
        """Running workers the job keeps on each blacklisted host (see :meth:`_keep_if_needed`)."""
        blocked = self.blacklist.blocked(now)
        self._kept = {i for i in self._kept if self.workers[i].member.returncode is None
                      and self.workers[i].member.host in blocked}  # a host back in use needs none
        per_host: dict[str, int] = {}
        for i in self._kept:
            host = self.workers[i].member.host
            per_host[host] = per_host.get(host, 0) + 1
        return per_host

    def _rediscover(self, now: float) -> None:
        """Take the script's answers since the last turn (a failed run is warned about)."""
        for result in self._poller.results() if self._poller is not None else []:
            if result.error is not None:
                self._warn_discovery(str(result.error), now)
            else:
                self.discovered = result.hosts or []

    def _warn_discovery(self, text: str, now: float) -> None:
        if now - self._warned.get(text, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[text] = now
            self._say(f"warning: {text}; keeping the current hosts "
                      f"({', '.join(f'{h.hostname}:{h.slots}' for h in self.discovered) or 'none'})")

    def _replan(self, now: float) -> None:
        usable = self._within_devices(usable_hosts(self.discovered, self.blacklist.blocked(now),
                                                   self._kept_per_host(now)))
        active = [(i, w.member.host) for i, w in self._running() if w.leaving_since is None]
        if self.copies is not None:
            usable = self.copies.hosts_ready(usable, active, self.elastic.max_np,
                                             failed=lambda host, exc: self._cannot_start(host, exc, now),
                                             blocked=lambda: self.blacklist.blocked(now),
                                             announce=self._announce_copies)
        plan = plan_changes(usable, active, self.elastic.max_np)
        if plan.empty:
            return
        self.limits.count_reset(self.store.reformations())
        if plan.remove:
            self._say(f"elastic: hosts left the job: stopping workers {plan.remove} on "
                      f"{sorted({self.workers[i].member.host for i in plan.remove})}")
            for i in plan.remove:
                self.workers[i].leaving_since = now
                self.store.leaving(i)
        staying, waiting = self._world() if plan.start else ([], [])
        hosts = [self.workers[i].member.host for i in staying + waiting]
        for host, slot in zip(plan.start, planned_slots(hosts + plan.start)[len(hosts):]):
            try:
                self._add(slot, joining=True)
            except LaunchError as exc:
                self._cannot_start(host, exc, now)
                continue
            self._say(f"elastic: started worker {self.next_id - 1} on {host} (rank {slot.rank} of "
                      f"{slot.size} once admitted)")
        if plan.remove:  # announced once the workers this change starts are known in the store
            self.store.announce(self._removal_kind())

    def _within_devices(self, usable: list[HostSlots]) -> list[HostSlots]:
        """With --gpus, a host runs at most one worker per device listed: a host that shows more
        slots once the job runs is used up to that (said once per host), where a worker without
        a device could not be started."""
        devices = self.cfg.devices
        if devices is None:
            return usable
        for h in usable:
            if h.slots > len(devices) and h.hostname not in self._capped:
                self._capped.add(h.hostname)
                self._say(with_hint(
                    f"warning: {h.hostname} has {h.slots} slots but --gpus/--devices lists "
                    f"{len(devices)} device(s): using {len(devices)} of them",
                    "list a device for every slot with --gpus, or print fewer slots for that host"))
        return [HostSlots(h.hostname, min(h.slots, len(devices))) for h in usable]

    def _removal_kind(self) -> str:
        """How to announce a removal: "added" when the re-formation it triggers takes in new
        workers too (Horovod's added|removed), as a worker told of a removal only skips the
        state's sync, which a new worker waits in; else "removed"."""
        return "added" if self._world()[1] else "removed"

    def _world(self) -> tuple[list[int], list[int]]:
        """The workers the next re-formation will hold, in the rank order it will give them, as
        :meth:`accord.torch.elastic.reform.Membership._lead` orders them: ``staying``, the
        members of the last re-formation (before any: the first workers, by rank) that still run
        and are not leaving, in their order; then ``waiting``, the workers added since, by id."""
        order = self.store.latest_members()
        if order is None:
            order = sorted(i for i, w in self.workers.items() if not w.joining)
        alive = {i for i, w in self._running() if w.leaving_since is None}
        waiting = sorted(i for i in alive - set(order) if self.workers[i].joining)
        return [m for m in order if m in alive], waiting

    def _stop_overdue(self, now: float) -> None:
        for _, w in self._running():
            if w.leaving_since is None:
                continue
            if not w.member.stopped and now - w.leaving_since > _LEAVE_GRACE:
                self._say(f"elastic: worker {w.member.index} did not leave within {_LEAVE_GRACE:g}s; stopping it")
                self.supervisor.ask_to_stop(w.member)
            elif (w.member.stopped and not w.killed
                  and now - w.leaving_since > _LEAVE_GRACE + self.supervisor.grace + 10):
                w.killed = True
                self.supervisor.kill_one(w.member)

    def _check_limits(self, now: float) -> bool:
        self.outcome.error = self.limits.reset_error()
        if self.outcome.error is not None:
            return True
        if self.outcome.lost and not self._finishing and self._every_host_blacklisted(now):
            # horovodrun stops the job once failures have blacklisted every host it has: no
            # worker can go on and nothing could be started instead
            self._say("elastic: every host of the job is blacklisted after failures; stopping it")
            self.outcome.failures, self.outcome.lost = list(self.outcome.lost), []
            return True
        if self._finishing:
            return False
        alive = len([1 for _, w in self._running() if w.leaving_since is None])
        self.outcome.error = self.limits.size_error(alive, now, self.discovered,
                                                    sorted(self.blacklist.blocked(now)))
        return self.outcome.error is not None
