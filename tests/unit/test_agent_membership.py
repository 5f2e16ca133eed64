"""The serving agent's membership decisions with --nnodes MIN:MAX (accord.run.agent.membership):
admissions and their refusals, nodes that leave or are lost, and the stop below MIN. The
meeting is a dict-backed stand-in with the same calls (get_json/set_json/add/lost); the
workers' marks go to a recording store. The real agents are in
tests/integration/test_launcher_agents.py."""
from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from accord.run.agent.cluster_vars import AgentSpec
from accord.run.agent.meeting import NodeRecord, World
from accord.run.agent.membership import Governor, Members, answer_key, left_key, members_key
from accord.run.elastic.store import ElasticStore
from accord.worker_contract import ELASTIC_DEAD_KEY


class _Meeting:
    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.keys: dict[str, str] = {}
        self.lost_now: list[NodeRecord] = []

    def get_json(self, key):
        return json.loads(self.keys[key]) if key in self.keys else None

    def set_json(self, key, value):
        self.keys[key] = json.dumps(value)

    def add(self, key, delta):
        self.keys[key] = json.dumps(int(json.loads(self.keys.get(key, "0"))) + delta)
        return int(self.keys[key])

    def lost(self, world):
        return [n for n in self.lost_now if n in world.nodes]


class _Store:
    closed = False

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def add(self, key, delta):
        self.values[key] = str(int(self.values.get(key, b"0")) + delta).encode()
        return int(self.values[key])

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key, timeout=None):
        return self.values[key]


def _node(rank: int, nproc: int = 2, nnodes: str = "2:3", ranked: bool = True) -> NodeRecord:
    return NodeRecord(node_rank=rank, agent_id=f"agent{rank}", host=f"h{rank + 1}", nnodes=nnodes, nproc=nproc,
                      max_restarts=0, ranked=ranked)


def _governor(nodes: int = 3, low: int = 2, high: int = 3):
    spec = AgentSpec(min_nodes=low, max_nodes=high, node_rank=0, nproc=2, endpoint_host="h1", endpoint_port=29400,
                     secret=b"s" * 32)
    world = World(attempt=0, nodes=tuple(_node(r) for r in range(nodes)), nproc=2, store_addr="h1", store_port=1,
                  master_addr="h1", master_port=2, job_id="job")
    meeting, store = _Meeting("agent0"), _Store()
    return Governor(meeting, spec, world, ElasticStore(store, lambda text: None), lambda text: None), meeting, store


def _ask(meeting: _Meeting, record: NodeRecord) -> None:
    n = meeting.add("agents/a0/wants", 1)
    meeting.set_json(f"agents/a0/want/{n}", asdict(record))


def test_members_start_with_ranks_as_ids_and_round_trip_through_json():
    members = Members.first((_node(0), _node(1)), nproc=2)
    assert members.ids == {0: (0, 1), 1: (2, 3)} and members.next_id == 4
    grown = members.without(0).with_node(_node(2), 2)
    assert grown.ranks() == [1, 2] and grown.ids == {1: (2, 3), 2: (4, 5)} and grown.version == 3
    assert Members.from_json(json.loads(json.dumps(grown.to_json()))) == grown
    assert grown.free_rank(3) == 0 and Members.first((_node(0), _node(1), _node(2)), 2).free_rank(3) is None


def test_a_lost_node_is_dropped_and_its_workers_marked_dead_while_min_remain():
    governor, meeting, store = _governor()
    assert Members.from_json(meeting.get_json(members_key(0))).ranks() == [0, 1, 2]
    meeting.lost_now = [_node(1)]
    assert governor.turn() is None
    assert Members.from_json(meeting.get_json(members_key(0))).ranks() == [0, 2]
    assert store.check([ELASTIC_DEAD_KEY.format(member=2), ELASTIC_DEAD_KEY.format(member=3)])
    meeting.lost_now = [_node(2)]  # one node would remain: below --nnodes 2:3
    stop = governor.turn()
    assert stop["reason"] == "lost" and stop["node"] == 2
    assert "1 node would remain, fewer than --nnodes 2:3 allows" in stop["text"]
    assert governor.members.ranks() == [0, 2]  # the stop is the attempt's end, not a change


def test_a_node_that_left_after_a_failure_is_dropped_or_stops_the_job_below_min():
    governor, meeting, _ = _governor()
    meeting.set_json(left_key(0, "agent2"), {"code": 137})
    assert governor.turn() is None and governor.members.ranks() == [0, 1]
    meeting.set_json(left_key(0, "agent1"), {"code": 3})
    assert governor.turn() == {"reason": "failure", "node": 1, "host": "h2"}


def test_an_agent_asking_to_join_is_admitted_with_the_next_ids_up_to_max():
    governor, meeting, _ = _governor(nodes=2)
    _ask(meeting, replace(_node(2), agent_id="late"))
    assert governor.turn() is None
    assert meeting.get_json(answer_key(0, "late", 1)) == {"ok": True, "node_rank": 2, "ids": [4, 5]}
    assert Members.from_json(meeting.get_json(members_key(0))).ranks() == [0, 1, 2]
    _ask(meeting, replace(_node(2), agent_id="extra"))  # MAX (3) nodes run already
    governor.turn()
    refused = meeting.get_json(answer_key(0, "extra", 2))
    assert refused["ok"] is False and refused["code"] == 1
    assert "already runs its 3 nodes (--nnodes 2:3)" in refused["text"] and "HINT:" in refused["text"]


@pytest.mark.parametrize("record, code, said", [
    (replace(_node(1), agent_id="twin"), 2, "two agents claim node rank 1"),
    (replace(_node(2, nproc=4), agent_id="other"), 2, "disagrees with the running job"),
    (replace(_node(2, nnodes="2:4"), agent_id="other"), 2, "--nnodes 2:4"),
])
def test_an_agent_that_cannot_join_is_refused_with_the_reason(record, code, said):
    governor, meeting, _ = _governor(nodes=2)
    _ask(meeting, record)
    governor.turn()
    answer = meeting.get_json(answer_key(0, record.agent_id, 1))
    assert answer["ok"] is False and answer["code"] == code and said in answer["text"] and "HINT:" in answer["text"]
    assert answer.get("retry", False) is (record.agent_id == "twin")  # the holder may be this one's former self
    assert governor.members.ranks() == [0, 1]


def test_an_unranked_agent_gets_the_lowest_free_node_rank():
    governor, meeting, _ = _governor(nodes=3)
    unranked = tuple(replace(n, ranked=False) for n in governor.members.nodes)
    governor.members = replace(governor.members, nodes=unranked).without(1)
    _ask(meeting, NodeRecord(node_rank=-1, agent_id="late", host="h9", nnodes="2:3", nproc=2, max_restarts=0,
                             ranked=False))
    governor.turn()
    assert meeting.get_json(answer_key(0, "late", 1)) == {"ok": True, "node_rank": 1, "ids": [6, 7]}
