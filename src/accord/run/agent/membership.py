"""Elastic membership with one agent per node (``--nnodes MIN:MAX``): which nodes are in the
running attempt, and the serving agent's decisions when one leaves, is lost or asks to join.

The workers re-form in memory exactly as under accordrun's elastic driver
(:mod:`accord.run.elastic.driver`): they follow the ``accord/elastic/*`` keys of the workers'
store (:mod:`accord.torch.elastic.reform`, :mod:`accord.runtime.admission`), and the agents
write the driver's marks there (:class:`~accord.run.elastic.store.ElasticStore`): a worker that
ended is *dead*, a worker whose node leaves is *leaving* (the change *announced*), a worker
started for a node that joins is *launched* before it starts and asks to join itself
(``ACCORD_ELASTIC_JOIN=1``). Every worker has a stable member id (``ACCORD_ELASTIC_ID``): the
first workers' ranks, then the next free ids for each node that joins.

The agent serving the endpoint (node rank 0) plays the driver's part for the nodes: it alone
changes the membership, ``agents/a<A>/members`` (:class:`Members`), and every agent reads it:

- a node whose worker failed leaves (its agent marks its workers, stops them and sets
  ``agents/a<A>/left/<agent id>``); one whose agent stopped answering for
  :data:`~accord.run.agent.meeting.LOST_AFTER_S` is lost (its workers are marked dead). Either
  is dropped from the members while at least MIN nodes remain; below MIN the attempt stops with
  that node as the root cause (then ``--max-restarts`` applies as for any failure).
- an agent that arrives while the attempt runs asks to join (``agents/a<A>/want/<n>``, its
  :class:`~accord.run.agent.meeting.NodeRecord`); while fewer than MAX nodes run it gets a node
  rank (its own ``--node-rank``, else the lowest free one) and its workers' member ids in
  ``agents/a<A>/answer/<agent id>``, else a refusal with the reason.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from accord.errors import with_hint
from accord.run.agent.cluster_vars import AgentSpec
from accord.run.agent.meeting import LOST_AFTER_S, AgentError, Meeting, NodeRecord, World
from accord.run.elastic.store import ElasticStore
from accord.run.spec.worker_env import elastic_env

_POLL = 0.1


def members_key(attempt: int) -> str:
    """Where the serving agent publishes the members of ``attempt``."""
    return f"agents/a{attempt}/members"


def left_key(attempt: int, agent_id: str) -> str:
    """Set by an agent whose node leaves ``attempt`` after a failure of its workers."""
    return f"agents/a{attempt}/left/{agent_id}"


def answer_key(attempt: int, agent_id: str, n: int) -> str:
    """The serving agent's answer to request ``n``, from ``agent_id``, to join the running ``attempt``."""
    return f"agents/a{attempt}/answer/{agent_id}/{n}"


@dataclass(frozen=True)
class Members:
    """The nodes of a running elastic attempt and their workers' member ids.

    ``version`` grows with every change; ``ids`` maps a node rank to its workers' member ids, in
    local-rank order; ``next_id`` is the first member id not given yet.
    """

    version: int
    nodes: tuple[NodeRecord, ...]
    ids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    next_id: int = 0

    @classmethod
    def first(cls, nodes: tuple[NodeRecord, ...], nproc: int) -> "Members":
        """The members as the attempt starts: node ``i`` (in world order) runs ids ``i*P .. i*P+P-1``,
        its workers' first ranks."""
        ids = {n.node_rank: tuple(range(i * nproc, (i + 1) * nproc)) for i, n in enumerate(nodes)}
        return cls(version=1, nodes=nodes, ids=ids, next_id=len(nodes) * nproc)

    def to_json(self) -> dict[str, Any]:
        """The JSON the serving agent publishes."""
        return {"version": self.version, "nodes": [asdict(n) for n in self.nodes],
                "ids": {str(r): list(i) for r, i in self.ids.items()}, "next_id": self.next_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Members":
        """The other direction of :meth:`to_json`."""
        return cls(version=int(data["version"]), nodes=tuple(NodeRecord(**n) for n in data["nodes"]),
                   ids={int(r): tuple(int(x) for x in i) for r, i in data["ids"].items()},
                   next_id=int(data["next_id"]))

    def without(self, node_rank: int) -> "Members":
        """These members less node ``node_rank``."""
        return replace(self, version=self.version + 1, nodes=tuple(n for n in self.nodes if n.node_rank != node_rank),
                       ids={r: i for r, i in self.ids.items() if r != node_rank})

    def with_node(self, record: NodeRecord, nproc: int) -> "Members":
        """These members and ``record``'s node last, its workers given the next ``nproc`` ids."""
        ids = tuple(range(self.next_id, self.next_id + nproc))
        return Members(version=self.version + 1, nodes=(*self.nodes, record), ids={**self.ids, record.node_rank: ids},
                       next_id=self.next_id + nproc)

    def ranks(self) -> list[int]:
        """The node ranks of the members, in their order."""
        return [n.node_rank for n in self.nodes]

    def free_rank(self, max_nodes: int) -> int | None:
        """The lowest node rank below ``max_nodes`` no member holds (None: all are held)."""
        taken = set(self.ranks())
        return next((r for r in range(max_nodes) if r not in taken), None)


def read_members(meeting: Meeting, attempt: int) -> Members | None:
    """The members of ``attempt`` as last published, or None before the first publication."""
    data = meeting.get_json(members_key(attempt))
    return None if data is None else Members.from_json(data)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Governor:
    """The serving agent's part in a running elastic attempt (see the module docstring).

    Args:
        meeting: the serving agent's side of the endpoint.
        spec: its place in the job (MIN and MAX).
        world: the attempt as it started.
        workers: the driver's marks in the workers' store.
        say: one line of the agent's own output.
    """

    def __init__(self, meeting: Meeting, spec: AgentSpec, world: World, workers: ElasticStore,
                 say: Callable[[str], None]) -> None:
        self._meeting, self._spec, self._world = meeting, spec, world
        self._workers, self._say = workers, say
        self.members = Members.first(world.nodes, world.nproc)
        meeting.set_json(members_key(world.attempt), self.members.to_json())
        self._wants_seen = 0

    def turn(self) -> dict[str, Any] | None:
        """Take in what changed since the last turn: nodes that left or were lost, agents that
        ask to join. Return the attempt's stop reason when fewer than MIN nodes remain."""
        attempt = self._world.attempt
        for node in self.members.nodes:
            left = None if node.agent_id == self._meeting.agent_id else \
                self._meeting.get_json(left_key(attempt, node.agent_id))
            if left is not None and not left.get("code"):  # a joiner the job finished without
                self.members = self.members.without(node.node_rank)
                self._publish()
            elif left is not None:
                stop = self._drop(node, {"reason": "failure", "node": node.node_rank, "host": node.host},
                                  f"node {node.node_rank} on {node.host} left the job after its workers failed")
                if stop is not None:
                    return stop
        for node in self._meeting.lost(replace(self._world, nodes=self.members.nodes)):
            for member_id in self.members.ids.get(node.node_rank, ()):
                self._workers.dead(member_id)  # its workers' re-formation need not wait for them
            text = (f"the agent of node {node.node_rank} on {node.host} stopped answering for "
                    f"{LOST_AFTER_S:g}s (killed, or its host went away?)")
            stop = self._drop(node, {"reason": "lost", "node": node.node_rank, "host": node.host, "text": text}, text)
            if stop is not None:
                return stop
        self._admit_new()
        return None

    def leave_self(self) -> dict[str, Any] | None:
        """The serving agent's own workers failed: its node leaves the members (it keeps serving
        the endpoint until the job ends); return the stop reason below MIN."""
        me = next(n for n in self.members.nodes if n.agent_id == self._meeting.agent_id)
        return self._drop(me, {"reason": "failure", "node": me.node_rank, "host": me.host},
                          f"node {me.node_rank} on {me.host} left the job after its workers failed")

    def _drop(self, node: NodeRecord, reason: dict[str, Any], what: str) -> dict[str, Any] | None:
        remaining = len(self.members.nodes) - 1
        if remaining < self._spec.min_nodes:
            reason = {**reason, "text": f"{what}; {_count(remaining, 'node')} would remain, fewer than "
                                        f"--nnodes {self._spec.nnodes_text} allows"} \
                if reason["reason"] == "lost" else reason
            return reason
        self.members = self.members.without(node.node_rank)
        self._publish()
        self._say(f"elastic: {what}; the job goes on in memory with nodes {self.members.ranks()} "
                  f"(--nnodes {self._spec.nnodes_text})")
        return None

    def _publish(self) -> None:
        self._meeting.set_json(members_key(self._world.attempt), self.members.to_json())

    def _admit_new(self) -> None:
        attempt = self._world.attempt
        count = self._meeting.add(f"agents/a{attempt}/wants", 0)
        while self._wants_seen < count:
            data = self._meeting.get_json(f"agents/a{attempt}/want/{self._wants_seen + 1}")
            if data is None:  # counted but not written yet: the next turn reads it
                break
            self._wants_seen += 1
            record = NodeRecord(**data)
            answer = self._answer(record)
            if answer.get("ok"):
                self._say(f"elastic: admitted node {answer['node_rank']} on {record.host}; its workers join at "
                          f"the next re-formation (nodes {self.members.ranks()})")
            self._meeting.set_json(answer_key(attempt, record.agent_id, self._wants_seen), answer)

    def _answer(self, record: NodeRecord) -> dict[str, Any]:
        spec, mine = self._spec, self.members.nodes[0]
        fields = ("nnodes", "nproc", "max_restarts", "ranked")
        if any(getattr(record, f) != getattr(mine, f) for f in fields):
            return {"ok": False, "code": 2, "text": with_hint(
                f"the agent on {record.host} (--nnodes {record.nnodes} --nproc-per-node {record.nproc} "
                f"--max-restarts {record.max_restarts}{'' if record.ranked else ', no --node-rank'}) disagrees "
                f"with the running job (--nnodes {mine.nnodes} --nproc-per-node {mine.nproc} --max-restarts "
                f"{mine.max_restarts}{'' if mine.ranked else ', no --node-rank'}); it was not admitted",
                "give every node the same --nnodes, --nproc-per-node and --max-restarts, and --node-rank to "
                "all of them or to none")}
        if len(self.members.nodes) >= spec.max_nodes:
            return {"ok": False, "code": 1, "text": with_hint(
                f"the job at {spec.endpoint} already runs its {spec.max_nodes} nodes (--nnodes "
                f"{spec.nnodes_text}); the agent on {record.host} is not needed",
                "start no more agents than --nnodes allows; one may join once a node has left")}
        rank = record.node_rank if record.ranked else self.members.free_rank(spec.max_nodes)
        holder = next((n for n in self.members.nodes if n.node_rank == rank), None)
        if rank is None or holder is not None:  # a restarted agent may come before its old self is lost
            return {"ok": False, "code": 2, "retry": holder is not None, "text": with_hint(
                f"two agents claim node rank {rank}: the running one on {holder.host if holder else '?'} and "
                f"one on {record.host} that asked to join",
                "give every node its own --node-rank (0..nnodes-1), or none of them")}
        self.members = self.members.with_node(replace(record, node_rank=rank), record.nproc)
        self._publish()
        return {"ok": True, "node_rank": rank, "ids": list(self.members.ids[rank])}


def ask_to_join(meeting: Meeting, spec: AgentSpec, attempt: int,
                wait: Callable[[], int]) -> tuple[World, tuple[int, ...]]:
    """Ask the serving agent to admit this node into the running ``attempt``; return the world
    with this node last and its workers' member ids.

    ``wait()`` is called between polls; a signal number (not 0) means stop waiting.

    Raises:
        AgentError: refused (the job is full, the agents disagree, a node rank taken), the
            attempt stopped meanwhile, no answer within the start timeout, or a signal.
    """
    record = NodeRecord(node_rank=-1 if spec.node_rank is None else spec.node_rank, agent_id=meeting.agent_id,
                        host=meeting.host, nnodes=spec.nnodes_text, nproc=spec.nproc,
                        max_restarts=spec.max_restarts, ranked=spec.node_rank is not None)
    deadline = time.monotonic() + spec.start_timeout
    n = 0
    while True:
        if n == 0:
            n = meeting.add(f"agents/a{attempt}/wants", 1)
            meeting.set_json(f"agents/a{attempt}/want/{n}", asdict(record))
        meeting.beat()
        answer = meeting.get_json(answer_key(attempt, meeting.agent_id, n))
        if answer is not None and answer.get("retry") and time.monotonic() + LOST_AFTER_S < deadline:
            # its node rank is held by an agent that may be gone (this one's former self, its pod
            # restarted): asked again once the serving agent would have seen it lost
            time.sleep(LOST_AFTER_S / 2)
            n = 0
            continue
        if answer is not None:
            break
        if meeting.stop_reason(attempt) is not None:
            raise AgentError(with_hint(f"the running job at {spec.endpoint} stopped (attempt {attempt}) while "
                                       "this agent asked to join it; nothing was started",
                                       "start this agent again: it joins the next attempt if there is one"), 1)
        if time.monotonic() >= deadline:
            raise AgentError(with_hint(f"the job at {spec.endpoint} did not answer this agent's request to join "
                                       f"within --start-timeout {spec.start_timeout:g}s; nothing was started",
                                       "look at node rank 0's agent output; raise --start-timeout"), 1)
        signum = wait()
        if signum:
            raise AgentError(f"stopped by signal {signum} while asking to join the running job; nothing was "
                             "started", 128 + signum)
        time.sleep(_POLL)
    if not answer.get("ok"):
        raise AgentError(str(answer["text"]), int(answer.get("code", 1)))
    members = read_members(meeting, attempt)
    data = meeting.get_json(f"agents/a{attempt}/world")
    assert members is not None and data is not None  # both written before the answer
    nodes = members.nodes if any(n.agent_id == meeting.agent_id for n in members.nodes) \
        else (*members.nodes, replace(record, node_rank=int(answer["node_rank"])))
    return meeting.world_of(attempt, data, nodes), tuple(int(i) for i in answer["ids"])


class ElasticNode:
    """One agent's elastic side of an attempt: its workers' member ids, the driver's marks in
    the workers' store, the members as last seen, and (node rank 0) the :class:`Governor`.

    Args:
        meeting: this agent's side of the endpoint.
        spec: its place in the job.
        world: the attempt (for a node that joined: the members then, this node last).
        joining: the member ids the serving agent gave this node's workers when it joined the
            running attempt; None for a node the attempt started with.
        conn: a connection to the workers' store, for the driver's marks there.
        say: one line of the agent's own output.
    """

    def __init__(self, meeting: Meeting, spec: AgentSpec, world: World, joining: tuple[int, ...] | None,
                 conn: Any, say: Callable[[str], None]) -> None:
        self._meeting, self._spec, self._world = meeting, spec, world
        self._conn = conn
        self.workers = ElasticStore(conn, say)
        self.joining = joining
        self.governor = Governor(meeting, spec, world, self.workers, say) if meeting.serving is not None else None
        self.members = self.governor.members if self.governor is not None else Members.first(world.nodes, world.nproc)
        self.seen: dict[int, NodeRecord] = {n.node_rank: n for n in world.nodes}  # every node of the attempt
        self.ids: dict[int, int] = {}  # a worker's first rank (its label) -> its member id

    @classmethod
    def open(cls, meeting: Meeting, spec: AgentSpec, world: World, joining: tuple[int, ...] | None,
             say: Callable[[str], None]) -> "ElasticNode":
        """Connect to the workers' store of ``world`` and set up this node's elastic side.

        Raises:
            AgentError: the workers' store cannot be reached.
        """
        from accord.errors import RendezvousError
        from accord.store.connection import StoreConnection

        try:
            conn = StoreConnection(world.store_addr, world.store_port, spec.secret, timeout=10.0,
                                   connect_timeout=10.0)
        except RendezvousError as exc:
            raise AgentError(with_hint(f"could not reach the workers' store at {world.store_addr}:"
                                       f"{world.store_port}: {str(exc).splitlines()[0]}",
                                       "node rank 0's agent serves it: look at its output")) from None
        return cls(meeting, spec, world, joining, conn, say)

    def close(self) -> None:
        """Close the connection to the workers' store."""
        self._conn.close()

    def take_slots(self, ranks: list[int]) -> None:
        """This node's workers, by first rank: a first node's member ids are those ranks, a
        joining node's those the serving agent gave."""
        ids = ranks if self.joining is None else list(self.joining)
        self.ids = dict(zip(ranks, ids))

    def worker_env(self, rank: int) -> dict[str, str]:
        """The elastic variables of this node's worker ``rank``; a joining node's worker is
        recorded as launched first (its re-formation waits a little for it)."""
        member_id = self.ids[rank]
        if self.joining is not None:
            self.workers.launched(member_id)
        return elastic_env(member_id, self.joining is not None, self._spec.min_nodes * self._spec.nproc, None)

    def refresh(self) -> Members:
        """The members as published now (the serving agent's own view, else read)."""
        if self.governor is not None:
            self.members = self.governor.members
        else:
            self.members = read_members(self._meeting, self._world.attempt) or self.members
        for n in self.members.nodes:
            self.seen.setdefault(n.node_rank, n)
        return self.members

    def is_member(self) -> bool:
        """True while this agent's node is one of the members."""
        return any(n.agent_id == self._meeting.agent_id for n in self.members.nodes)

    def admitted(self) -> bool:
        """True once a re-formation took this node's workers in (always for a first node)."""
        return self.joining is None or all(self.workers.admitted(i) for i in self.joining)
