"""Where the agents of one job meet: the endpoint's authenticated store and its keys.

The agent of node rank 0 (or, when no agent was given a node rank, the first to bind the
endpoint on its host) serves accord's store at ``--rdzv-endpoint`` with the job's secret; every
agent (that one too) talks to it through an authenticated connection. Every value is JSON (no
pickle); the store checks each message's MAC before decoding it and bounds its size first.

Keys (``A`` = the attempt: 0, then one more per whole-job restart):

==============================  =================================================================
``agents/attempt``              the attempt the serving agent last opened
``agents/error``                a fatal error (agents that disagree): every agent stops with it
``agents/hb/<agent id>``        each agent's heartbeat counter (one more every half second)
``agents/exit/<agent id>``      set by an agent as it leaves (the serving agent waits for them)
``agents/a<A>/node/<rank>``     an agent's record (its values, host, id) for node ``rank``
``agents/a<A>/count``           join order, for agents without a node rank
``agents/a<A>/world``           the world the serving agent published: every node, the workers' store
``agents/a<A>/stop``            why the attempt stops (the first reason wins)
``agents/a<A>/fail/<rank>``     node ``rank``'s failed workers (their root-cause entries)
``agents/a<A>/done/<rank>``     node ``rank``'s workers all succeeded
``agents/a<A>/members``         ``--nnodes MIN:MAX``: the nodes in the running attempt now
``agents/a<A>/want/<n>``        ``--nnodes MIN:MAX``: agent n asking to join (``wants`` counts them)
``agents/a<A>/answer/<id>``     the serving agent's answer to one of them
``agents/a<A>/left/<id>``       ``--nnodes MIN:MAX``: that agent's node left after its workers failed
==============================  =================================================================

The ``--nnodes MIN:MAX`` keys are :mod:`accord.run.agent.membership`'s.
"""
from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from accord.errors import LaunchError, RendezvousError, with_hint
from accord.run.agent.cluster_vars import AgentSpec
from accord.run.processes import job_store
from accord.run.spec.advertise import is_loopback

HEARTBEAT_S = 0.5
LOST_AFTER_S = 5.0  # an agent whose heartbeat stood still this long is lost
_POLL = 0.1


class AgentError(LaunchError):
    """An agent cannot go on; ``code`` is its exit status (2: the agents disagree on the job)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodeRecord:
    """What one agent says about itself when it joins an attempt."""

    node_rank: int
    agent_id: str
    host: str
    nnodes: str
    nproc: int
    max_restarts: int
    ranked: bool  # it was given its node rank (else it took the next in join order)


@dataclass(frozen=True)
class World:
    """One attempt's job, as every agent sees it."""

    attempt: int
    nodes: tuple[NodeRecord, ...]
    nproc: int
    store_addr: str
    store_port: int
    master_addr: str
    master_port: int
    job_id: str

    @property
    def size(self) -> int:
        """Workers in the job."""
        return len(self.nodes) * self.nproc


def _key(attempt: int, name: str) -> str:
    return f"agents/a{attempt}/{name}"


def bind_address(host: str, interface_ip: str | None) -> str:
    """Where the serving agent binds: loopback when the endpoint is written as a loopback address
    (``127.0.0.1``, ``localhost``), else every interface (or ``--network-interface``'s address).
    A host name that resolves to loopback here (Debian maps its own name to 127.0.1.1) still
    names this host to the others, so it binds every interface."""
    if is_loopback(host) or host == "::1":
        return "127.0.0.1"
    return interface_ip or "0.0.0.0"


def _is_local_address(host: str) -> bool:
    """Whether ``host`` names an address of this machine (a bind there can succeed)."""
    try:
        resolved = socket.gethostbyname(host)
    except OSError:
        return False
    if is_loopback(resolved):
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((resolved, 0))
        except OSError:
            return False
    return True


class Meeting:
    """This agent's side of the endpoint: serve it (node rank 0) or reach it, then join attempts.

    Args:
        spec: this node's agent.
        interface_ip: ``--network-interface``'s address, for the serving agent's bind.
        say: one line of the agent's own output.
    """

    def __init__(self, spec: AgentSpec, interface_ip: str | None, say: Callable[[str], None]) -> None:
        self.spec = spec
        self._say = say
        self._interface_ip = interface_ip
        self.agent_id = uuid.uuid4().hex[:12]
        self.host = socket.gethostname()
        self.serving: job_store.JobStore | None = None
        self._workers_store: job_store.JobStore | None = None
        self._master_hold: job_store.ReservedPort | None = None
        self._conn: Any = None
        self._deadline = 0.0
        self._beats = 0
        self._next_beat = 0.0
        self._next_look = 0.0
        self._seen: dict[str, tuple[int, float]] = {}  # agent id -> (counter, when it last moved)

    # --- the endpoint ----------------------------------------------------------------------
    def open(self) -> None:
        """Serve the endpoint (node rank 0, or the first agent on its host to bind it) and connect.

        Raises:
            AgentError: node rank 0 cannot bind the endpoint, or the endpoint cannot be reached
                (not up, a wrong address, or a wrong secret) within the start timeout.
        """
        spec = self.spec
        self._deadline = time.monotonic() + spec.start_timeout
        serve = spec.node_rank == 0 or (spec.node_rank is None and _is_local_address(spec.endpoint_host))
        if serve:
            try:
                self.serving = job_store.JobStore(bind_address(spec.endpoint_host, self._interface_ip),
                                                  spec.endpoint_port, spec.secret)
            except LaunchError as exc:
                if spec.node_rank == 0:
                    raise AgentError(with_hint(
                        f"node rank 0 serves the job's rendezvous at {spec.endpoint} but cannot bind it: "
                        f"{str(exc).splitlines()[0]}",
                        "give node rank 0 an endpoint on its own host with a free port (--rdzv-endpoint "
                        "HOST:PORT); `ss -ltnp` shows who holds the port")) from None
                self.serving = None  # another agent on this host serves it
        self._conn = self._connect()

    def _connect(self) -> Any:
        from accord.store.connection import StoreConnection

        spec = self.spec
        host = "127.0.0.1" if self.serving is not None else spec.endpoint_host
        within = max(self._deadline - time.monotonic(), 0.5)
        try:
            return StoreConnection(host, spec.endpoint_port, spec.secret, timeout=10.0, connect_timeout=within)
        except RendezvousError as exc:
            raise AgentError(with_hint(
                f"could not reach the job's rendezvous at {spec.endpoint} ({spec.sources.get('endpoint')}) "
                f"within --start-timeout {spec.start_timeout:g}s: {str(exc).splitlines()[0]}",
                "check that node rank 0's agent runs there and that this host reaches it, and that "
                "every node has the same secret (a wrong secret is refused at the handshake)")) from None

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (RendezvousError, OSError) as exc:
            raise AgentError(with_hint(
                f"lost the job's rendezvous at {self.spec.endpoint} while {what}: {str(exc).splitlines()[0]}",
                "node rank 0's agent serves it: look at its output (it ended, was killed, or its host "
                "went away); every agent stops when it does")) from None

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it is not set."""
        if not self._call(f"reading {key}", lambda: self._conn.check([key])):
            return None
        return self._call(f"reading {key}", lambda: self._conn.get(key, timeout=5.0))

    def get_json(self, key: str) -> Any:
        """``key``'s JSON value, or None when it is not set."""
        raw = self.get(key)
        return None if raw is None else json.loads(raw.decode())

    def set_json(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` as JSON."""
        data = json.dumps(value)
        self._call(f"writing {key}", lambda: self._conn.set(key, data))

    def set_first(self, key: str, value: Any) -> Any:
        """Set ``key`` unless set; return the value it holds now (ours or the first writer's)."""
        data = json.dumps(value)
        held = self._call(f"writing {key}", lambda: self._conn.compare_set(key, "", data))
        return json.loads(bytes(held).decode())

    def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the counter ``key`` (0 creates it); return its value now."""
        return int(self._call(f"counting {key}", lambda: self._conn.add(key, delta)))

    # --- liveness --------------------------------------------------------------------------
    def beat(self) -> None:
        """Count this agent's heartbeat, every :data:`HEARTBEAT_S` at most."""
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + HEARTBEAT_S
            self._call("sending the heartbeat", lambda: self._conn.add(f"agents/hb/{self.agent_id}", 1))

    def lost(self, world: World) -> list[NodeRecord]:
        """The other nodes of ``world`` whose heartbeat stood still for :data:`LOST_AFTER_S`
        (read once per :data:`HEARTBEAT_S` at most: a store round trip per node)."""
        now = time.monotonic()
        if now < self._next_look:
            return []
        self._next_look = now + HEARTBEAT_S
        found = []
        for node in world.nodes:
            if node.agent_id == self.agent_id:
                continue
            count = self._call("reading heartbeats", lambda n=node: self._conn.add(f"agents/hb/{n.agent_id}", 0))
            last = self._seen.get(node.agent_id)
            if last is None or last[0] != count:
                self._seen[node.agent_id] = (count, now)
            elif now - last[1] >= LOST_AFTER_S:
                found.append(node)
        return found

    # --- an attempt ------------------------------------------------------------------------
    def current_attempt(self) -> int:
        """The attempt to join: the open one, or (it is running without us: our agent restarted)
        the next, after asking the running one to stop.

        Raises:
            AgentError: the job already used its restarts.
        """
        attempt = int(self.get_json("agents/attempt") or 0)
        if self.get(_key(attempt, "world")) is None:
            return attempt
        if self.get(_key(attempt, "stop")) is None:
            if self.spec.elastic:  # asks the serving agent to join it (accord.run.agent.membership)
                return attempt
            if attempt >= self.spec.max_restarts:
                raise AgentError(with_hint(
                    f"the job at {self.spec.endpoint} is running attempt {attempt} without this node, "
                    f"and it has no restart left (--max-restarts {self.spec.max_restarts})",
                    "restart the whole job, or pass a higher --max-restarts to every node"))
            self.set_first(_key(attempt, "stop"), {"reason": "rejoin", "node": self.spec.node_rank,
                                                   "host": self.host,
                                                   "text": f"an agent on {self.host} joined the running job "
                                                           "(its agent restarted?)"})
        return attempt + 1

    def _check_error(self) -> None:
        error = self.get_json("agents/error")
        if error is not None:
            raise AgentError(str(error["text"]), int(error.get("code", 1)))

    def _fail(self, text: str, code: int) -> None:
        self.set_first("agents/error", {"text": text, "code": code})
        self._check_error()
        raise AgentError(text, code)  # pragma: no cover - the error just set is raised above

    def _claim(self, attempt: int) -> NodeRecord:
        spec = self.spec
        if spec.node_rank is not None:
            rank = spec.node_rank
        elif self.serving is not None:  # rank 0 runs where the endpoint is (MASTER_ADDR)
            rank = 0
        else:
            rank = int(self._call("joining", lambda: self._conn.add(_key(attempt, "count"), 1)))
        record = NodeRecord(node_rank=rank, agent_id=self.agent_id, host=self.host, nnodes=spec.nnodes_text,
                            nproc=spec.nproc, max_restarts=spec.max_restarts, ranked=spec.node_rank is not None)
        held = self.set_first(_key(attempt, f"node/{rank}"), asdict(record))
        if held["agent_id"] != self.agent_id:
            self._fail(with_hint(
                f"two agents claim node rank {rank}: one on {held['host']} and one on {self.host}",
                "give every node its own --node-rank (0..nnodes-1), or none of them"), 2)
        return record

    def _records(self, attempt: int, upto: int) -> dict[int, NodeRecord]:
        found = {}
        for rank in range(upto):
            data = self.get_json(_key(attempt, f"node/{rank}"))
            if data is not None:
                found[rank] = NodeRecord(**data)
        return found

    def _check_agree(self, mine: NodeRecord, records: dict[int, NodeRecord]) -> None:
        fields = ("nnodes", "nproc", "max_restarts", "ranked")
        if all(getattr(r, f) == getattr(mine, f) for r in records.values() for f in fields):
            return
        listing = "; ".join(f"node {r.node_rank} on {r.host}: --nnodes {r.nnodes} --nproc-per-node {r.nproc} "
                            f"--max-restarts {r.max_restarts}{'' if r.ranked else ' (no --node-rank)'}"
                            for r in sorted(records.values(), key=lambda r: r.node_rank))
        self._fail(with_hint(f"the agents disagree on the job ({listing}); nothing was started",
                             "give every node the same --nnodes, --nproc-per-node and --max-restarts, "
                             "and --node-rank to all of them or to none"), 2)

    def running(self, attempt: int) -> bool:
        """True once ``attempt``'s world is published (its workers run or have run)."""
        return self.get(_key(attempt, "world")) is not None

    def join(self, attempt: int, wait: Callable[[], int]) -> World | None:
        """Join ``attempt`` and return its world once every node is there; None when, with
        ``--nnodes MIN:MAX``, it started without this agent (which then asks to join it).

        ``wait()`` is called between polls; a signal number (not 0) means stop waiting.

        Raises:
            AgentError: the agents disagree, a node did not come within the start timeout, the
                job is full, or the endpoint went away.
        """
        spec = self.spec
        self._deadline = time.monotonic() + spec.start_timeout
        if self.serving is not None:
            self.set_json("agents/attempt", attempt)
        mine = self._claim(attempt)
        if mine.node_rank >= spec.max_nodes:
            raise AgentError(with_hint(f"the job at {spec.endpoint} already has its {spec.max_nodes} nodes "
                                       f"(--nnodes {spec.nnodes_text}); this agent is not needed", "start no more "
                                       "agents than --nnodes allows"), 1)
        last_join = time.monotonic()
        count = 0
        while True:
            self._check_error()
            self.beat()
            records = self._records(attempt, spec.max_nodes)
            self._check_agree(mine, records)
            if len(records) != count:
                count, last_join = len(records), time.monotonic()
            if self.serving is not None and self.get(_key(attempt, "world")) is None:
                full = count == spec.max_nodes
                # MIN:MAX: once MIN are there, a little longer for the others
                enough = count >= spec.min_nodes and time.monotonic() - last_join >= 3.0
                if (full or enough) and list(records) == list(range(count)):
                    self._publish(attempt, records)
            world = self.get_json(_key(attempt, "world"))
            if world is not None:
                if self.spec.elastic and not any(n["agent_id"] == self.agent_id for n in world["nodes"]):
                    return None  # it started without this agent: ask to join it
                return self._world(attempt, world, mine)
            if time.monotonic() >= self._deadline:
                self._timeout(attempt, records)
            signum = wait()
            if signum:
                raise AgentError(f"stopped by signal {signum} while waiting for the other nodes; nothing was "
                                 "started", 128 + signum)
            time.sleep(_POLL)

    def _publish(self, attempt: int, records: dict[int, NodeRecord]) -> None:
        """The serving agent: a fresh store for this attempt's workers, and the world."""
        if self._workers_store is not None:
            self._workers_store.close()
        if self._master_hold is not None:
            self._master_hold.release()
        bind = bind_address(self.spec.endpoint_host, self._interface_ip)
        self._workers_store = job_store.JobStore(bind, 0, self.spec.secret)
        self._master_hold = job_store.ReservedPort(host="" if bind == "0.0.0.0" else bind)
        self.set_first(_key(attempt, "world"), {
            "nodes": [asdict(records[r]) for r in sorted(records)], "store_port": self._workers_store.port,
            "master_port": self._master_hold.port, "job_id": uuid.uuid4().hex[:12]})

    def _world(self, attempt: int, data: dict[str, Any], mine: NodeRecord) -> World:
        nodes = tuple(NodeRecord(**n) for n in data["nodes"])
        if not any(n.agent_id == self.agent_id for n in nodes):
            raise AgentError(with_hint(
                f"the job at {self.spec.endpoint} started attempt {attempt} with nodes "
                f"{[n.node_rank for n in nodes]} without this one (node {mine.node_rank} on {self.host})",
                "start every agent within --start-timeout of the first"), 1)
        return self.world_of(attempt, data, nodes)

    def world_of(self, attempt: int, data: dict[str, Any], nodes: tuple[NodeRecord, ...]) -> World:
        """The :class:`World` of ``attempt`` from its published ``data``, with these ``nodes``."""
        host = self.spec.endpoint_host
        return World(attempt=attempt, nodes=nodes, nproc=self.spec.nproc, store_addr=host,
                     store_port=int(data["store_port"]), master_addr=host, master_port=int(data["master_port"]),
                     job_id=str(data["job_id"]))

    def _timeout(self, attempt: int, records: dict[int, NodeRecord]) -> None:
        spec = self.spec
        missing = [r for r in range(spec.min_nodes) if r not in records]
        joined = ", ".join(f"{r.node_rank} on {r.host}" for r in records.values()) or "none"
        refused = ""
        if self.serving is not None and self.serving.refusals:
            refused = (f"; the endpoint refused {self.serving.refusals} connection(s) that failed the "
                       "handshake (a node with another secret?)")
        raise AgentError(with_hint(
            f"node(s) {missing} did not join the job at {spec.endpoint} within --start-timeout "
            f"{spec.start_timeout:g}s (attempt {attempt}; joined: {joined}){refused}; nothing was started",
            "start an agent on every node with the same --nnodes, endpoint and secret; or raise "
            "--start-timeout"), 1)

    # --- the end of an attempt ---------------------------------------------------------------
    def stop_reason(self, attempt: int) -> dict[str, Any] | None:
        """Why ``attempt`` stops, once some agent said so."""
        return self.get_json(_key(attempt, "stop"))

    def leave(self) -> None:
        """Say this agent leaves; the serving agent waits (a few seconds at most) for the others,
        who may still read the store, then every connection closes."""
        if self._conn is None:
            return
        try:
            self._conn.set(f"agents/exit/{self.agent_id}", "1")
            if self.serving is not None:
                attempt = int(json.loads(self._conn.get("agents/attempt", timeout=1.0)))
                world = self.get_json(_key(attempt, "members")) or self.get_json(_key(attempt, "world"))
                # no world yet (the agents disagreed, or one timed out): those that joined;
                # with --nnodes MIN:MAX, the members as they ended
                nodes = world["nodes"] if world else [asdict(r) for r in self._records(attempt, self.spec.max_nodes)
                                                      .values()]
                # (not for a node the attempt stopped because it was lost: it will not answer)
                reason = self.stop_reason(attempt) or {}
                gone = reason.get("node") if reason.get("reason") == "lost" else None
                ids = [f"agents/exit/{n['agent_id']}" for n in nodes if n["node_rank"] != gone]
                deadline = time.monotonic() + 5.0
                while ids and not self._conn.check(ids) and time.monotonic() < deadline:
                    time.sleep(_POLL)
        except (RendezvousError, OSError, AgentError, ValueError):
            pass

    def close(self) -> None:
        """Close the connection and the stores this agent serves (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        for store in (self._workers_store, self.serving):
            if store is not None:
                store.close()
        self._workers_store = self.serving = None
        if self._master_hold is not None:
            self._master_hold.release()
            self._master_hold = None
