"""The serving agent's leave (accord.run.agent.meeting.Meeting.leave): it waits for every node of
the last attempt to say it leaves, except a node that attempt was stopped for because it was
lost (it will never answer). The store is a dict-backed stand-in that records what is awaited."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from accord.run.agent.cluster_vars import AgentSpec
from accord.run.agent.meeting import Meeting, NodeRecord

pytestmark = pytest.mark.timeout(30)


class _Store:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = {k: v.encode() for k, v in values.items()}
        self.awaited: list[list[str]] = []

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key, timeout=None):
        return self.values[key]

    def check(self, keys):
        if all(k.startswith("agents/exit/") for k in keys):
            self.awaited.append(list(keys))
        return all(k in self.values for k in keys)


def _meeting(stop: dict, exited: list[str]) -> tuple[Meeting, _Store]:
    spec = AgentSpec(min_nodes=2, max_nodes=2, node_rank=0, nproc=1, endpoint_host="h1", endpoint_port=29400,
                     secret=b"s" * 32)
    meeting = Meeting(spec, None, lambda text: None)
    nodes = [NodeRecord(node_rank=r, agent_id=f"agent{r}", host=f"h{r + 1}", nnodes="2", nproc=1, max_restarts=0,
                        ranked=True) for r in (0, 1)]
    meeting.agent_id = "agent0"
    store = _Store({"agents/attempt": "0", "agents/a0/world": json.dumps({"nodes": [asdict(n) for n in nodes]}),
                    "agents/a0/stop": json.dumps(stop), **{f"agents/exit/{a}": "1" for a in exited}})
    meeting._conn, meeting.serving = store, object()  # the agent that serves the job's store
    return meeting, store


def test_a_node_lost_in_the_last_attempt_is_not_awaited():
    meeting, store = _meeting({"reason": "lost", "node": 1, "host": "h2", "text": "stopped answering"}, [])
    meeting.leave()
    assert store.awaited and all(keys == ["agents/exit/agent0"] for keys in store.awaited), store.awaited


def test_every_other_node_is_awaited():
    meeting, store = _meeting({"reason": "failure", "node": 1, "host": "h2", "text": "rank 1 failed"}, ["agent1"])
    meeting.leave()
    assert store.awaited == [["agents/exit/agent0", "agents/exit/agent1"]], store.awaited
