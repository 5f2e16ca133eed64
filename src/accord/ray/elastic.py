"""An elastic RayExecutor job (``min_workers``/``max_workers``): accord workers on Ray actors that
re-form, with ``hvd.elastic.run`` in the function, as Ray loses or gains nodes.

It is accordrun's elastic job (:mod:`accord.run.elastic.driver`) with Ray's nodes for hosts,
speaking the same store protocol (:mod:`accord.worker_contract`'s ``ELASTIC_*`` keys) to the
workers' re-formation (:mod:`accord.torch.elastic.reform`, :mod:`accord.runtime.admission`):

- **start**: each ``run()`` is a job of its own, with a fresh store and secret. It waits up to
  ``elastic_timeout`` for ``min_workers`` slots on Ray's live nodes (:mod:`accord.ray.discovery`),
  then starts a worker on every slot, up to ``max_workers``, each pinned to its node.
- **growth**: every second the job looks at Ray's nodes; free slots get new workers (marked
  launched in the store first, started with ``ACCORD_ELASTIC_JOIN=1``), which the running ones
  admit at their next ``state.commit()``.
- **loss**: a worker whose actor died (its node left, it was killed) or whose function raised
  past ``hvd.elastic.run`` is marked dead in the store, so the survivors re-form without waiting
  for its heartbeat to stop. A node whose worker failed while the node is still alive is
  blacklisted (``cooldown_range``), and its other workers are asked to leave (they end with
  Horovod's ``SystemExit(0)`` at the re-formation, or are ended after 30 s); a worker that raised
  is ended too, so its engine cannot hold the others' collectives.
- **limits**: more re-formations than ``reset_limit``, or fewer than ``min_workers`` workers for
  longer than ``elastic_timeout``, fail the job.
- **end**: once a worker returns, no more are started; ``run()`` returns the values of the
  workers that returned, in the rank order of the last re-formation. Workers still waiting to
  be admitted then are ended. When none returned, the first failure is raised
  (:class:`~accord.errors.WorkerFailedError`).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from accord.errors import ConfigError, WorkerFailedError, with_hint
from accord.ray import failures
from accord.ray.actor import ERROR, LEFT, OK, Worker
from accord.ray.discovery import Node, Nodes
from accord.ray.hosting import HostedStore, bind_address
from accord.ray.layout import environment
from accord.ray.requirement import need_ray
from accord.ray.settings import RaySettings
from accord.ray.static import check_driver, kill_all
from accord.run.processes.job_store import free_port
from accord.run.spec.assignment import Slot, slots_on
from accord.run.spec.worker_env import JobEnv, elastic_env
from accord.worker_contract import (
    ELASTIC_DEAD_KEY,
    ELASTIC_LATEST_KEY,
    ELASTIC_LAUNCH_KEY,
    ELASTIC_LAUNCHED_KEY,
    ELASTIC_LEAVING_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)

POLL_S = 0.2  # how often the driver looks at its workers' calls
DISCOVERY_S = 1.0  # how often it looks at Ray's nodes (Horovod's discovery interval)
LEAVE_GRACE_S = 30.0  # how long a worker asked to leave has to reach its next commit


@dataclass
class Member:
    """One worker of the running job, by its stable member id."""

    member_id: int
    actor: Any
    node: Node
    call: Any  # the ObjectRef of its function call; None once it ended
    described: Any  # the ObjectRef of its description (where it runs)
    started: float
    joining: bool
    description: dict[str, Any] | None = None
    leaving_since: float | None = None


class ElasticJob:
    """The elastic form of RayExecutor (see the module docstring)."""

    def __init__(self, settings: RaySettings, min_workers: int, max_workers: int | None, reset_limit: int | None,
                 cooldown_range: Sequence[float] | None, elastic_timeout: float, cpus_per_worker: float,
                 use_gpu: bool, gpus_per_worker: float) -> None:
        if min_workers < 1:
            raise ConfigError(with_hint(f"RayExecutor: min_workers must be >= 1, got {min_workers}",
                                        "pass min_workers=1"))
        if max_workers is not None and max_workers < min_workers:
            raise ConfigError(with_hint(f"RayExecutor: max_workers {max_workers} is below min_workers {min_workers}",
                                        "pass max_workers >= min_workers, or leave it out for no limit"))
        if reset_limit is not None and reset_limit < 0:
            raise ConfigError(with_hint(f"RayExecutor: reset_limit must be >= 0, got {reset_limit}",
                                        "pass reset_limit=N, or leave it out for no limit"))
        if not cpus_per_worker and not gpus_per_worker:
            raise ConfigError(with_hint("RayExecutor: each worker asks for no CPU and no GPU",
                                        "pass cpus_per_worker=1"))
        cooldown = None
        if cooldown_range is not None:
            low, high = (float(v) for v in cooldown_range)
            if not 0 < low <= high:
                raise ConfigError(with_hint(f"RayExecutor: cooldown_range {tuple(cooldown_range)} is not MIN <= MAX "
                                            "seconds above 0", "pass cooldown_range=(10, 300)"))
            cooldown = (low, high)
        self.settings = settings
        self.min_workers, self.max_workers = int(min_workers), max_workers
        self.reset_limit = reset_limit
        self.cooldown_range = cooldown
        self.elastic_timeout = float(elastic_timeout)
        self.cpus, self.gpus = cpus_per_worker, gpus_per_worker
        self.executable: tuple[Any, Any, Any] = (None, None, None)
        self.extra_env: dict[str, str] = {}

    def start(self, executable_cls: Callable[..., Any] | None, executable_args: Any, executable_kwargs: Any,
              extra_env_vars: dict[str, str] | None) -> None:
        """Check the driver and keep what each ``run()`` starts its workers with."""
        check_driver(need_ray())
        self.executable = (executable_cls, executable_args, executable_kwargs)
        self.extra_env = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}

    def call(self, fn: Callable[..., Any], args: Any, kwargs: Any, on_executable: bool,
             ranks: Sequence[int] | None = None) -> list[Any]:
        """Run one elastic job of ``fn``; the values of the workers that returned, in rank order."""
        if ranks is not None:
            raise NotImplementedError(with_hint("RayExecutor: execute_single is not supported by elastic jobs "
                                                "(as in Horovod): their workers come and go",
                                                "use execute() or run()"))
        ray = need_ray()
        check_driver(ray)
        return _Run(self, ray, (fn, args, kwargs, on_executable)).go()

    def call_remote(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> list[Any]:
        raise NotImplementedError(with_hint("RayExecutor: run_remote is not supported by elastic jobs (as in "
                                            "Horovod): their workers are ephemeral", "use run()"))

    def shutdown(self) -> None:
        """Nothing runs between two ``run()`` calls of an elastic job."""


class _Run:
    """One elastic job: from the first workers to the last one's end."""

    def __init__(self, job: ElasticJob, ray: Any, payload: tuple[Any, Any, Any, bool]) -> None:
        self.job, self.ray, self.payload = job, ray, payload
        self.nodes = Nodes(job.cpus, job.gpus, job.cooldown_range)
        self.members: dict[int, Member] = {}
        self.next_id = 0
        self.results: dict[int, Any] = {}
        self.lost: list[WorkerFailedError] = []
        self.finishing = False
        self.resets = 0
        self._reset_at: int | None = None
        self._below_since: float | None = None
        self._next_look = 0.0
        self.store: HostedStore | None = None
        self.conn: Any = None
        self.job_env: JobEnv | None = None
        self.remote = ray.remote(Worker)

    def say(self, text: str) -> None:
        if self.job.settings.verbose:
            print(f"accord.ray: {text}", file=sys.stderr, flush=True)

    # --- the job ----------------------------------------------------------------------------------
    def go(self) -> list[Any]:
        ray = self.ray
        iface = next(iter(self.job.settings.nics or ()), None)
        self.store = HostedStore(bind_address(ray.util.get_node_ip_address(), [], True, iface))
        try:
            self.conn = self.store.connection()
            first = self._wait_for_slots()
            self.job_env = JobEnv(job_id=self.store.job_id, master_addr=first[0].ip, master_port=free_port(),
                                  store_addr=self.store.address, store_port=self.store.port)
            for node, slot in zip(first, slots_on([n.ip for n in first])):
                self._add(node, slot, joining=False)
            while not self._turn():
                pass
            return self._outcome()
        finally:
            kill_all(ray, [m.actor for m in self.members.values()])
            self.store.close()

    def _wait_for_slots(self) -> list[Node]:
        """The nodes of the first workers, one entry per worker."""
        since = time.monotonic()
        while True:
            usable = self.nodes.usable(self.ray, time.monotonic())
            if sum(n.slots for n in usable) >= self.job.min_workers:
                room = self.job.max_workers
                picked = [n for n in usable for _ in range(n.slots)]
                return picked if room is None else picked[:room]
            if time.monotonic() - since > self.job.elastic_timeout:
                raise WorkerFailedError(with_hint(
                    f"RayExecutor: timed out after elastic_timeout={self.job.elastic_timeout:g}s waiting for the "
                    f"{self.job.min_workers} worker slots the job needs to start (min_workers); Ray's live nodes "
                    f"have {sum(n.slots for n in usable)}: {_nodes(usable)}",
                    "add nodes, lower min_workers or the resources per worker, or raise elastic_timeout"))
            time.sleep(DISCOVERY_S)

    def _add(self, node: Node, slot: Slot, joining: bool) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        assert self.store is not None and self.job_env is not None
        member_id, self.next_id = self.next_id, self.next_id + 1
        if joining:  # known before it can ask to join: a re-formation waits a little for it
            n = int(self.conn.add(ELASTIC_LAUNCHED_KEY, 1))
            self.conn.set(ELASTIC_LAUNCH_KEY.format(n=n), str(member_id))
        env = environment(slot, self.job_env, self.store.secret_hex,
                          {**self.job.settings.worker_variables(), **self.job.extra_env})
        env.update(elastic_env(member_id, joining, self.job.min_workers, self.job.elastic_timeout))
        actor = self.remote.options(
            num_cpus=self.job.cpus, num_gpus=self.job.gpus, max_restarts=0, max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
        described = actor.describe.remote()
        actor.set_env.remote(env)
        fn, args, kwargs, on_executable = self.payload
        if on_executable:
            actor.start_executable.remote(*self.job.executable)
        call = actor.call.remote(fn, args, kwargs, on_executable)
        self.members[member_id] = Member(member_id, actor, node, call, described, time.monotonic(), joining)

    def _running(self) -> list[Member]:
        return [m for m in self.members.values() if m.call is not None]

    def _staying(self) -> list[Member]:
        return [m for m in self._running() if m.leaving_since is None]

    # --- one turn of the watch ------------------------------------------------------------------
    def _turn(self) -> bool:
        """Reap, look at the nodes, re-plan; True once the job is over."""
        ray = self.ray
        running = self._running()
        by_ref = {m.call: m for m in running}
        ready = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=POLL_S)[0] if by_ref else []
        now = time.monotonic()
        for ref in ready:
            self._ended(by_ref[ref], now)
        self._check_started(now)
        if now >= self._next_look:
            self._next_look = now + DISCOVERY_S
            if not self.finishing:
                self._replan(now)
        self._stop_overdue(now)
        if self._limits(now):
            return True
        if not self._running():
            return True
        if self.finishing and all(m.joining and not self._admitted(m.member_id) for m in self._running()):
            for m in self._running():  # nobody is left to admit them
                m.leaving_since = m.leaving_since or now
                ray.kill(m.actor, no_restart=True)
        return False

    def _ended(self, m: Member, now: float) -> None:
        try:
            status, value = self.ray.get(m.call)
        except self.ray.exceptions.RayError as exc:  # the actor died, or its result could not be sent
            status, value = "died", exc
        m.call = None
        if m.leaving_since is not None:  # asked to leave: removed, not lost
            self._dead(m.member_id)
            return
        if status in (OK, LEFT):
            self._dead(m.member_id)
            self.results[m.member_id] = value
            self.finishing = True  # training is over: no more workers
            return
        self.ray.kill(m.actor, no_restart=True)  # a worker that raised still holds its engine
        where = failures.where(m.description or {"ip": m.node.ip})
        who = f"elastic worker {m.member_id}"
        if status == ERROR:
            error = failures.raised(who, m.member_id, value, where, then=failures.WENT_ON)
        elif isinstance(value, self.ray.exceptions.RayActorError):
            error = failures.died(who, m.member_id, where, value, then=failures.WENT_ON)
        else:
            error = failures.unsent(who, m.member_id, where, value)
        self.lost.append(error)
        self._count_reset()
        alive_node = any(n.node_id == m.node.node_id for n in self.nodes.live(self.ray))
        blacklisted = ""
        if alive_node:
            until = self.nodes.blacklist(m.node.node_id, now)
            blacklisted = "; blacklisting its node " + ("for the rest of the job" if until is None
                                                         else f"for {until - now:.0f}s")
            mates = [x for x in self._staying() if x.node.node_id == m.node.node_id]
            for x in mates:  # marked before the failed one is dead: the survivors re-form once
                x.leaving_since = now
                self._set(ELASTIC_LEAVING_KEY.format(member=x.member_id))
            if mates:
                self._announce("added" if self._waiting() else "removed")
        self.say(f"elastic: worker {m.member_id} on {m.node.ip} ended ({'raised' if status == ERROR else 'died'})"
                 f"{blacklisted}; {len(self._staying())} workers remain (min_workers {self.job.min_workers})")
        if not self.finishing:
            self._replan(now)
        self._dead(m.member_id)

    def _check_started(self, now: float) -> None:
        """Record where workers run; end one that Ray could not start within timeout_s."""
        for m in self._running():
            if m.description is not None:
                continue
            done, _ = self.ray.wait([m.described], timeout=0)
            if done:
                try:
                    m.description = self.ray.get(m.described)
                except self.ray.exceptions.RayError:
                    m.description = {"ip": m.node.ip}
            elif now - m.started > self.job.settings.timeout_s:
                self.ray.kill(m.actor, no_restart=True)  # its call ends as died: counted there
                self.say(f"warning: Ray could not start worker {m.member_id} on {m.node.ip} within "
                         f"timeout_s={self.job.settings.timeout_s:g}s; ending it")
                m.description = {"ip": m.node.ip}

    def _replan(self, now: float) -> None:
        """Start workers on free slots (up to max_workers); ask the newest to leave a node with
        fewer slots than workers."""
        usable = self.nodes.usable(self.ray, now)
        slots = {n.node_id: n.slots for n in usable}
        per_node: dict[str, list[Member]] = {}
        for m in sorted(self._staying(), key=lambda x: x.member_id):
            per_node.setdefault(m.node.node_id, []).append(m)
        leaving = [m for node_id, ms in per_node.items() if node_id in slots for m in ms[slots[node_id]:]]
        for m in leaving:
            m.leaving_since = now
            self._set(ELASTIC_LEAVING_KEY.format(member=m.member_id))
        room = None if self.job.max_workers is None else self.job.max_workers - len(self._staying())
        start = []
        for n in usable:
            free = n.slots - min(len(per_node.get(n.node_id, [])), n.slots)
            take = free if room is None else max(0, min(free, room - len(start)))
            start.extend([n] * take)
        if start or leaving:
            self._count_reset()
        for node in start:
            hosts = [m.node.ip for m in self._next_world()] + [node.ip]
            self._add(node, slots_on(hosts)[-1], joining=True)
            self.say(f"elastic: started worker {self.next_id - 1} on {node.ip} (rank {len(hosts) - 1} of "
                     f"{len(hosts)} once admitted)")
        if leaving:
            self.say(f"elastic: asking workers {[m.member_id for m in leaving]} to leave (their node has fewer slots)")
            self._announce("added" if self._waiting() else "removed")

    def _next_world(self) -> list[Member]:
        """The workers of the next re-formation, in the rank order it will give them: the last
        re-formation's members that stay, then the workers waiting to join, by id."""
        staying = {m.member_id: m for m in self._staying()}
        order = self._latest_members()
        if order is None:
            order = sorted(i for i, m in staying.items() if not m.joining)
        first = [staying[i] for i in order if i in staying]
        return first + [staying[i] for i in sorted(set(staying) - set(order))]

    def _waiting(self) -> list[Member]:
        order = set(self._latest_members() or [])
        return [m for m in self._staying() if m.joining and m.member_id not in order]

    def _stop_overdue(self, now: float) -> None:
        for m in self._running():
            if m.leaving_since is not None and now - m.leaving_since > LEAVE_GRACE_S:
                self.say(f"elastic: worker {m.member_id} did not leave within {LEAVE_GRACE_S:g}s; ending it")
                self.ray.kill(m.actor, no_restart=True)
                m.leaving_since = now  # its call ends as died: removed, not lost

    def _limits(self, now: float) -> bool:
        if self.job.reset_limit is not None and self.resets > self.job.reset_limit:
            raise WorkerFailedError(with_hint(
                f"RayExecutor: the job's workers changed {self.resets} times (re-formations), more than "
                f"reset_limit={self.job.reset_limit}",
                "raise reset_limit, or look at why nodes keep changing or failing"))
        if self.finishing:
            return False
        alive = len(self._staying())
        if alive >= self.job.min_workers:
            self._below_since = None
            return False
        if self._below_since is None:
            self._below_since = now
            self.say(f"elastic: {alive} workers, below min_workers {self.job.min_workers}; waiting up to "
                     f"elastic_timeout {self.job.elastic_timeout:g}s for nodes")
        elif now - self._below_since > self.job.elastic_timeout:
            raise WorkerFailedError(with_hint(
                f"RayExecutor: the job stayed below min_workers={self.job.min_workers} ({alive} workers) for "
                f"elastic_timeout={self.job.elastic_timeout:g}s; Ray's usable nodes: "
                f"{_nodes(self.nodes.usable(self.ray, now))}",
                "add nodes, lower min_workers, pass cooldown_range to let failed nodes back, or raise elastic_timeout"))
        return False

    def _outcome(self) -> list[Any]:
        if not self.results:
            if self.lost:
                raise self.lost[0]
            raise WorkerFailedError(with_hint("RayExecutor: every worker of the elastic job ended without a result",
                                              "look at the workers' output above"))
        order = self._latest_members() or []
        rank = {m: i for i, m in enumerate(order)}
        return [self.results[m] for m in sorted(self.results, key=lambda m: (rank.get(m, len(rank)), m))]

    # --- the store --------------------------------------------------------------------------------
    def _set(self, key: str) -> None:
        self.conn.set(key, "1")

    def _dead(self, member_id: int) -> None:
        self._set(ELASTIC_DEAD_KEY.format(member=member_id))

    def _announce(self, kind: str) -> None:
        n = int(self.conn.add(ELASTIC_UPDATES_KEY, 1))
        self.conn.set(ELASTIC_UPDATE_KEY.format(n=n), kind)

    def _latest_members(self) -> list[int] | None:
        if not self.conn.check([ELASTIC_LATEST_KEY]):
            return None
        epoch = int(self.conn.add(ELASTIC_LATEST_KEY, 0))
        if epoch < 1:  # the leader creates the counter, then raises it to its epoch
            return None
        record = json.loads(self.conn.get(ELASTIC_MEMBERS_KEY.format(epoch=epoch), timeout=5.0))
        return [int(m) for m in record["members"]]

    def _admitted(self, member_id: int) -> bool:
        return member_id in (self._latest_members() or [])

    def _count_reset(self) -> None:
        """A change of the workers counts once until they have re-formed for it."""
        reformations = int(self.conn.add(ELASTIC_LATEST_KEY, 0)) if self.conn.check([ELASTIC_LATEST_KEY]) else 0
        if self._reset_at is None or reformations > self._reset_at:
            self.resets += 1
            self._reset_at = reformations


def _nodes(nodes: Sequence[Node]) -> str:
    return ", ".join(f"{n.ip}:{n.slots}" for n in nodes) or "none"
