"""One node's agent: meet the others, start this node's workers, stop together, restart together.

The life of an agent (``accordrun --nnodes N --node-rank R --nproc-per-node P --rdzv-endpoint
HOST:PORT cmd``): open the endpoint (:mod:`accord.run.agent.meeting`), join the attempt, start
this node's ``P`` workers with the usual environment contract (:mod:`accord.run.spec.worker_env`;
global ranks ``R*P + local``) plus the restart counts, multiplex their output with ``[rank]``
prefixes, and watch them, the other agents' heartbeats and the attempt's stop key. The first
failure anywhere stops every node's workers: the agent that saw it publishes its root-cause
entries and the stop; every agent stops its workers and prints the same root cause. With
``--max-restarts N`` the agents then start the next attempt (at most N times), and the workers
read ``TORCHELASTIC_RESTART_COUNT`` / ``ACCORD_RESTART_COUNT`` to resume from their checkpoint.

With ``--nnodes MIN:MAX`` the workers are elastic workers and a failure does not stop the job
while MIN nodes remain (:meth:`NodeAgent._watch_elastic`, :mod:`accord.run.agent.membership`):
the failed worker's node leaves, a lost node is dropped, an agent that arrives is admitted, and
the other nodes' workers re-form in memory under ``hvd.elastic.run``.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from types import FrameType
from typing import Any, BinaryIO, TextIO

from accord import config, worker_contract
from accord.errors import with_hint
from accord.run.agent.cluster_vars import AgentSpec
from accord.run.agent.meeting import LOST_AFTER_S, AgentError, Meeting, World
from accord.run.agent.membership import ElasticNode, ask_to_join, left_key
from accord.run.config.launch_config import LaunchConfig
from accord.run.processes.failures import Failure, exit_status, format_root_cause, pick_root_cause, signal_name
from accord.run.processes.output import OutputMux
from accord.run.processes.runners import StartOptions
from accord.run.processes.supervisor import Member, Supervisor
from accord.run.spec.assignment import Slot, slots_on
from accord.run.spec.worker_env import JobEnv, omp_threads, worker_env

_POLL = 0.05
_STORE_POLL = 0.2
# Longer than LOST_AFTER_S: a worker that failed because a peer's node went away waits until
# that node is seen lost, which is then the root cause.
_SETTLE_S = LOST_AFTER_S + 1.0
# How long the agents that report a failure wait for every node's entry (each stopped node
# writes one, empty if its workers were only stopped; a lost node writes none).
_REPORTS_WAIT_S = 2.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TRACEBACK_CHARS = 16000


def restart_env(attempt: int, max_restarts: int) -> dict[str, str]:
    """What a worker of ``attempt`` (0 first, then one more per restart) gets: torchrun's names and accord's."""
    return {"TORCHELASTIC_RESTART_COUNT": str(attempt), "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "ACCORD_RESTART_COUNT": str(attempt)}


def node_labels(world: World) -> list[str]:
    """Each node's host name for the workers' topology: the agents' host names, made distinct
    (``host-node1``) where several agents run on one host."""
    hosts = [n.host for n in world.nodes]
    return [h if hosts.count(h) == 1 else f"{h}-node{n.node_rank}" for h, n in zip(hosts, world.nodes)]


def world_slots(world: World) -> list[Slot]:
    """Every worker's slot: node r's workers are ranks r*P .. r*P+P-1."""
    return slots_on([label for label in node_labels(world) for _ in range(world.nproc)])


def failure_record(f: Failure) -> dict[str, Any]:
    """A failure as JSON for the other agents (the traceback shortened)."""
    data = asdict(f)
    data["stderr_tail"] = list(f.stderr_tail)[-20:]
    data["silent_to"] = list(f.silent_to)
    if f.error:
        data["error"] = {k: (str(v)[-_TRACEBACK_CHARS:] if k == "traceback" else v) for k, v in f.error.items()}
    return data


def failure_from_record(data: dict[str, Any]) -> Failure:
    """The other direction of :func:`failure_record`."""
    fields = {k: v for k, v in data.items() if k in Failure.__dataclass_fields__}
    fields["silent_to"] = tuple(fields.get("silent_to", ()))
    return Failure(**fields)


@dataclass
class _Outcome:
    code: int
    restartable: bool = False


class NodeAgent:
    """The agent of one node (see the module docstring).

    Args:
        spec: its place in the job.
        cfg: what its workers run and how (command, tuning, grace, output, devices).
    """

    def __init__(self, spec: AgentSpec, cfg: LaunchConfig, out: BinaryIO, err: BinaryIO, log: TextIO,
                 ranks_filter: frozenset[int] | None = None) -> None:
        self.spec, self.cfg = spec, cfg
        self._out, self._err, self._log = out, err, log
        self._ranks_filter = ranks_filter
        self._signals: list[int] = []
        self._previous: dict[int, Any] = {}
        self._meeting = Meeting(spec, cfg.interface_ip, self._say)
        self._node = spec.node_rank

    def _say(self, text: str) -> None:
        where = f"node {self._node}" if self._node is not None else "agent"
        self._log.write(f"accordrun ({where}): {text}\n")
        self._log.flush()

    def _signalled(self) -> int:
        """The first signal this agent received, 0 if none."""
        return self._signals[0] if self._signals else 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def run(self) -> int:
        """Run this node's part of the job to its end; return the agent's exit code."""
        for sig in _FORWARDED:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        meeting = self._meeting
        try:
            meeting.open()
            if not self.spec.authenticated:
                self._say("warning: --no-job-secret: anyone who reaches the endpoint "
                          f"{self.spec.endpoint} can join or stop this job")
            attempt = meeting.current_attempt()
            while True:
                world, joining = None, None
                if not (self.spec.elastic and meeting.serving is None and meeting.running(attempt)):
                    world = meeting.join(attempt, self._signalled)
                if world is None:  # --nnodes MIN:MAX and the attempt runs: this node joins it
                    world, joining = ask_to_join(meeting, self.spec, attempt, self._signalled)
                self._node = next(n.node_rank for n in world.nodes if n.agent_id == meeting.agent_id)
                if joining is not None:
                    self._say(f"joined the running job as node {self._node} (--nnodes {self.spec.nnodes_text}); "
                              "its workers are admitted at the next re-formation")
                if self.cfg.verbose:
                    self._say(f"attempt {attempt}: {len(world.nodes)} nodes x {world.nproc} workers; "
                              f"workers' store {world.store_addr}:{world.store_port}")
                outcome = self._attempt(world, joining)
                if not outcome.restartable:
                    return outcome.code
                if attempt >= self.spec.max_restarts:
                    if self.spec.max_restarts:
                        self._say(f"no restart left (--max-restarts {self.spec.max_restarts}); the job failed")
                    return outcome.code
                attempt += 1
                self._say(f"restarting every node's workers (restart {attempt} of {self.spec.max_restarts})")
        except AgentError as exc:
            self._say(f"error: {exc}")
            return exc.code
        finally:
            meeting.leave()
            meeting.close()
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    # --- one attempt -------------------------------------------------------------------------
    def _attempt(self, world: World, joining: tuple[int, ...] | None = None) -> _Outcome:
        cfg = self.cfg
        environ = config.snapshot()
        elastic = ElasticNode.open(self._meeting, self.spec, world, joining, self._say) if self.spec.elastic else None
        jobdir = tempfile.mkdtemp(prefix=f"accord-{world.job_id}-n{self._node}-")
        supervisor = Supervisor(cfg.grace_period)
        supervisor.guardian.remove_on_death(jobdir)
        mux = OutputMux(self._out, self._err, prefix=cfg.prefix, timestamps=cfg.prefix_timestamp,
                        ranks_filter=self._ranks_filter, output_dir=cfg.output_dir, size=world.size)
        try:
            try:
                self._start_workers(world, supervisor, mux, jobdir, environ, elastic)
            except AgentError as exc:  # the others stop too, with this as the cause
                self._meeting.set_first(f"agents/a{world.attempt}/stop", {
                    "reason": "start", "node": self._node, "text": f"node {self._node} could not start its "
                                                                  f"workers: {exc}"})
                raise
            mux.start()
            if elastic is not None:
                return self._watch_elastic(world, supervisor, mux, elastic)
            return self._watch(world, supervisor, mux)
        finally:
            supervisor.kill()
            mux.close(timeout=0.5)
            supervisor.close()
            if elastic is not None:
                elastic.close()
            shutil.rmtree(jobdir, ignore_errors=True)

    def _start_workers(self, world: World, supervisor: Supervisor, mux: OutputMux, jobdir: str,
                       environ: dict[str, str], elastic: ElasticNode | None = None) -> None:
        cfg = self.cfg
        job = JobEnv(job_id=world.job_id, master_addr=world.master_addr, master_port=world.master_port,
                     store_addr=world.store_addr, store_port=world.store_port)
        cpus = os.cpu_count() or 1
        if "OMP_NUM_THREADS" not in environ and world.attempt == 0:
            self._say(f"OMP_NUM_THREADS is not set: each worker gets max(1, {cpus} cores // {world.nproc} "
                      f"workers per node) = {omp_threads(cpus, world.nproc)} thread(s); set OMP_NUM_THREADS to choose")
        index = [n.node_rank for n in world.nodes].index(self._node)
        mine = [s for s in world_slots(world) if s.host_index == index]
        if elastic is not None:
            elastic.take_slots([s.rank for s in mine])
        options = StartOptions(cwd=cfg.cwd, worker_cwd=cfg.worker_cwd, grace=cfg.grace_period, ssh=cfg.ssh,
                               secret_hex=self.spec.secret.hex())
        for slot in mine:
            err_path = os.path.join(jobdir, f"rank.{slot.rank}.error.json")
            added = worker_env(slot, job, tuning=cfg.tuning, user_env=environ, cpu_count=cpus,
                               devices=cfg.devices, error_file=err_path)
            added.update(restart_env(world.attempt, self.spec.max_restarts))
            if elastic is not None:
                added.update(elastic.worker_env(slot.rank))
            files = mux.open_files(slot.rank)
            try:
                member = supervisor.start("worker", slot.rank, slot.rank, "localhost", cfg.worker_command,
                                          environ, added, options, err_path)
            except OSError as exc:
                for f in files.values():
                    f.close()
                raise AgentError(with_hint(f"could not start rank {slot.rank} ({cfg.command[0]}): {exc}",
                                           "check that the program exists and is executable on every node")) from None
            mux.add(slot.rank, member.proc.stdout, member.proc.stderr, files=files)

    def _failure(self, m: Member, host: str) -> Failure:
        assert m.returncode is not None
        error = worker_contract.read_error_file(m.error_file) if m.error_file else None
        return Failure(rank=m.index, host=host, pid=m.proc.pid, returncode=m.returncode, error=error,
                       local_rank=m.index % self.spec.nproc)

    def _label(self, world: World) -> str:
        """This node's host label in ``world``'s output."""
        return node_labels(world)[[n.node_rank for n in world.nodes].index(self._node)]

    def _abandon(self, supervisor: Supervisor, mux: OutputMux, message: str) -> _Outcome:
        """Stop this node's workers, say ``message``; the agent exits 1."""
        self._stop(supervisor)
        mux.close(timeout=2.0)
        self._say(message)
        return _Outcome(1)

    def _watch(self, world: World, supervisor: Supervisor, mux: OutputMux) -> _Outcome:
        meeting, attempt = self._meeting, world.attempt
        host = self._label(world)
        failures: list[Failure] = []
        settle_until: float | None = None
        published = done = False
        next_poll = 0.0
        reason: dict[str, Any] | None = None
        try:
            while reason is None:
                if self._signals:
                    reason = self._signal_stop(attempt, host)
                    break
                for m in supervisor.reap():
                    if m.returncode != 0:
                        failures.append(self._failure(m, host))
                if failures and not published:
                    settle_until = settle_until or time.monotonic() + _SETTLE_S
                    if not all(f.peer_caused for f in failures) or time.monotonic() >= settle_until:
                        for f in failures:
                            f.stderr_tail = mux.stderr_tail(f.rank)[-20:]
                        meeting.set_json(f"agents/a{attempt}/fail/{self._node}", [failure_record(f) for f in failures])
                        meeting.set_first(f"agents/a{attempt}/stop", {"reason": "failure", "node": self._node,
                                                                      "host": host})
                        published = True
                workers = supervisor.of_kind("worker")
                if not done and all(w.returncode == 0 for w in workers):
                    meeting.set_json(f"agents/a{attempt}/done/{self._node}", 1)
                    done = True
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + _STORE_POLL
                    meeting.beat()
                    reason = meeting.stop_reason(attempt)
                    if reason is None and done and all(
                            meeting.get(f"agents/a{attempt}/done/{n.node_rank}") is not None for n in world.nodes):
                        mux.close(timeout=2.0)
                        return _Outcome(0)
                    lost = meeting.lost(world) if reason is None else []
                    if lost:
                        node = lost[0]
                        meeting.set_first(f"agents/a{attempt}/stop", {
                            "reason": "lost", "node": node.node_rank, "host": node.host,
                            "text": f"the agent of node {node.node_rank} on {node.host} stopped answering for "
                                    f"{LOST_AFTER_S:g}s (killed, or its host went away?)"})
                time.sleep(_POLL)
        except AgentError as exc:
            return self._abandon(supervisor, mux, f"error: {exc}; stopped this node's workers")
        assert reason is not None
        return self._stopped(world, supervisor, mux, failures, published, reason, host)

    def _watch_elastic(self, world: World, supervisor: Supervisor, mux: OutputMux, elastic: ElasticNode) -> _Outcome:
        """:meth:`_watch` with ``--nnodes MIN:MAX``: nodes leave and join the running attempt
        (:mod:`accord.run.agent.membership`) and the workers re-form in memory."""
        meeting, attempt = self._meeting, world.attempt
        host = self._label(world)
        governor = elastic.governor
        failures: list[Failure] = []
        left: int | None = None  # this node's exit status once it left the job after a failure
        done = False
        next_poll = 0.0
        reason: dict[str, Any] | None = None
        try:
            while reason is None:
                if self._signals:
                    reason = self._signal_stop(attempt, host)
                    break
                for m in supervisor.reap():
                    if m.returncode != 0:
                        failures.append(self._failure(m, host))
                    else:  # ended its training: re-formations stop waiting for it
                        elastic.workers.dead(elastic.ids[m.index])
                if failures and left is None:
                    left = self._leave(world, supervisor, mux, failures, host, elastic)
                    if governor is None:
                        return _Outcome(left)
                    stop = governor.leave_self()
                    if stop is not None:
                        reason = meeting.set_first(f"agents/a{attempt}/stop", stop)
                        break
                if left is None and not done and all(w.returncode == 0 for w in supervisor.of_kind("worker")):
                    meeting.set_json(f"agents/a{attempt}/done/{self._node}", 1)
                    done = True
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + _STORE_POLL
                    meeting.beat()
                    stop = governor.turn() if governor is not None else None
                    if stop is not None:
                        meeting.set_first(f"agents/a{attempt}/stop", stop)
                    reason = meeting.stop_reason(attempt)
                    if reason is not None:
                        break
                    members = elastic.refresh()
                    if left is None and not elastic.is_member():
                        return self._abandon(supervisor, mux, with_hint(
                            "error: the job went on without this node (node rank 0's agent saw its "
                            f"heartbeat stand still for {LOST_AFTER_S:g}s); stopped this node's workers",
                            "start this agent again to join the job"))
                    finished = [meeting.get(f"agents/a{attempt}/done/{n.node_rank}") is not None
                                for n in members.nodes if left is None or n.agent_id != meeting.agent_id]
                    if finished and all(finished) and (done or left is not None):
                        mux.close(timeout=2.0)
                        return _Outcome(left or 0)
                    if not done and left is None and any(finished) and not elastic.admitted():
                        return self._too_late(world, supervisor, mux, elastic)
                time.sleep(_POLL)
        except AgentError as exc:
            return self._abandon(supervisor, mux, f"error: {exc}; stopped this node's workers")
        assert reason is not None
        every = replace(world, nodes=tuple(elastic.seen[r] for r in sorted(elastic.seen)))
        return self._stopped(every, supervisor, mux, failures, left is not None, reason, host)

    def _leave(self, world: World, supervisor: Supervisor, mux: OutputMux, failures: list[Failure], host: str,
               elastic: ElasticNode) -> int:
        """This node's workers failed: it leaves the elastic job. Its other workers are marked
        leaving (and the change announced) before any is marked dead, so that the survivors'
        re-formation leaves them all out at once; then they are stopped. Return the exit status."""
        meeting, attempt = self._meeting, world.attempt
        running = [m for m in supervisor.of_kind("worker") if m.returncode is None]
        for m in running:
            elastic.workers.leaving(elastic.ids[m.index])
        if running:
            elastic.workers.announce("removed")
        for f in failures:
            elastic.workers.dead(elastic.ids[f.rank])
        stopped = self._stop(supervisor)
        for m in running:
            elastic.workers.dead(elastic.ids[m.index])
        mux.close(timeout=2.0)
        for f in failures:
            f.stderr_tail = mux.stderr_tail(f.rank)[-20:]
        meeting.set_json(f"agents/a{attempt}/fail/{self._node}", [failure_record(f) for f in failures])
        root = pick_root_cause(failures)
        code = exit_status(root.returncode) or 1
        title = (f"accordrun: node {self._node} leaves the job after its workers failed (--nnodes "
                 f"{self.spec.nnodes_text}: the others go on without it while at least "
                 f"{self.spec.min_nodes} nodes remain)")
        self._log.write(format_root_cause(root, [f for f in failures if f is not root], stopped, title=title) + "\n")
        self._log.flush()
        meeting.set_json(left_key(attempt, meeting.agent_id), {"code": code})
        return code

    def _too_late(self, world: World, supervisor: Supervisor, mux: OutputMux, elastic: ElasticNode) -> _Outcome:
        """The job finished its training before this joining node's workers were admitted."""
        stopped = self._stop(supervisor)
        for rank in stopped:
            elastic.workers.dead(elastic.ids[rank])
        mux.close(timeout=2.0)
        self._meeting.set_json(left_key(world.attempt, self._meeting.agent_id), {"code": 0})
        self._say("the job finished its training before this node's workers were admitted; stopped them")
        return _Outcome(0)

    def _signal_stop(self, attempt: int, host: str) -> dict[str, Any]:
        """Stop ``attempt`` for the signal this agent received; return the stop reason that holds."""
        return self._meeting.set_first(f"agents/a{attempt}/stop", {
            "reason": "signal", "node": self._node, "host": host,
            "text": f"the agent of node {self._node} on {host} received {signal_name(self._signals[0])}"})

    def _stop(self, supervisor: Supervisor) -> list[int]:
        sig = self._signals[0] if self._signals else signal.SIGTERM
        running = supervisor.stop(sig, skip_grace=lambda: len(self._signals) >= 2)
        return [m.index for m in running if m.kind == "worker"]

    def _stopped(self, world: World, supervisor: Supervisor, mux: OutputMux, failures: list[Failure],
                 published: bool, reason: dict[str, Any], host: str) -> _Outcome:
        """Stop this node's workers, print the job's root cause, and say whether to restart."""
        meeting, attempt = self._meeting, world.attempt
        stopped = self._stop(supervisor)
        mux.close(timeout=2.0)
        if not published:  # failures of our own the stop did not cause, for the others' reports
            failures += [self._failure(m, host) for m in supervisor.of_kind("worker")
                         if m.returncode not in (0, None) and not m.stopped and
                         all(f.rank != m.index for f in failures)]
            for f in failures:
                f.stderr_tail = mux.stderr_tail(f.rank)[-20:]
            # also when empty: the reporting agents wait for every node's entry, and a node that
            # wrote none would hold each of them for the whole wait
            meeting.set_json(f"agents/a{attempt}/fail/{self._node}", [failure_record(f) for f in failures])
        own_signal = reason.get("reason") == "signal" and reason.get("node") == self._node and self._signals
        if reason.get("reason") == "failure":
            return self._report_failure(world, reason, stopped)
        self._log.write(_box(f"accordrun: job stopped (node {self._node} of {len(world.nodes)}, host {host})",
                             [f"Root Cause: {reason.get('text', reason)}"],
                             stopped) + "\n")
        self._log.flush()
        if own_signal:
            return _Outcome(128 + self._signals[0])
        return _Outcome(1, restartable=True)

    def _report_failure(self, world: World, reason: dict[str, Any], stopped: list[int]) -> _Outcome:
        meeting, attempt = self._meeting, world.attempt
        origin = reason.get("node")
        deadline = time.monotonic() + _REPORTS_WAIT_S  # the other nodes' entries, for "Other failures"
        while time.monotonic() < deadline and not all(
                meeting.get(f"agents/a{attempt}/fail/{n.node_rank}") is not None for n in world.nodes):
            time.sleep(_POLL)
        silent = [n.node_rank for n in world.nodes if meeting.get(f"agents/a{attempt}/fail/{n.node_rank}") is None]
        if silent:
            self._say(f"node(s) {silent} reported nothing about their workers within {_REPORTS_WAIT_S:g} s "
                      "(agent lost?): failures there, if any, are not listed below")
        entries: list[Failure] = []
        for n in world.nodes:
            data = meeting.get_json(f"agents/a{attempt}/fail/{n.node_rank}") or []
            entries += [failure_from_record(d) for d in data]
        root = pick_root_cause([f for f in entries if f.rank // world.nproc == origin] or entries) if entries \
            else None
        if root is None:
            self._say(f"node {origin} reported a failure but no entry for it")
            return _Outcome(1, restartable=True)
        others = [f for f in entries if f is not root]
        title = (f"accordrun: job failed (seen by node {self._node} of {len(world.nodes)}; "
                 f"the failure is on node {origin})")
        self._log.write(format_root_cause(root, others, stopped, title=title) + "\n")
        self._log.flush()
        return _Outcome(exit_status(root.returncode) or 1, restartable=True)


def _box(title: str, lines: list[str], stopped: list[int], width: int = 72) -> str:
    text = ["=" * width, title, "-" * width, *lines]
    if stopped:
        text += ["-" * width, f"Stopped by this agent: ranks {', '.join(map(str, sorted(stopped)))}"]
    return "\n".join(text + ["=" * width])


def run_agent(spec: AgentSpec, cfg: LaunchConfig, ranks_filter: frozenset[int] | None = None) -> int:
    """Run this node's agent with the process's console; return its exit code."""
    return NodeAgent(spec, cfg, sys.stdout.buffer, sys.stderr.buffer, sys.stderr, ranks_filter).run()
