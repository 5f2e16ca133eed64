"""An elastic worker's view of the job's members (accord.torch.elastic.reform.Membership), with
a fake store standing for the launcher: a host change announced while the ranks gather is part
of the re-formation (nobody re-forms a second time for it), and one announced after it still
interrupts the next commit, even when the state's reset dropped it."""
import json
import threading
import time

import pytest

from accord import config
from accord.torch.elastic.reform import Membership
from accord.worker_contract import (
    ELASTIC_DEAD_KEY,
    ELASTIC_LEAVING_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)

pytestmark = pytest.mark.timeout(30)


class LauncherStore(dict):
    """A store in which the launcher reacts to worker 2's failure when the leader looks for it
    ``react_after`` seconds after the store was made: as accordrun's driver does, it marks
    worker 1 (on the failed worker's host) to leave, announces the removal, then marks worker 2
    dead."""

    def __init__(self, react_after=0.0):
        super().__init__()
        self.react_at = time.monotonic() + react_after
        self.looks: dict[str, int] = {}  # how many times check() asked for each key

    def set(self, key, value):
        self[key] = value

    def add(self, key, delta):
        self[key] = int(dict.get(self, key, 0)) + delta
        return self[key]

    def get(self, key, timeout=None):
        value = self[key]
        return value if isinstance(value, bytes) else str(value).encode()

    def wait(self, keys, timeout=None):
        assert all(k in self for k in keys)

    def check(self, keys):
        for k in keys:
            self.looks[k] = self.looks.get(k, 0) + 1
        if keys == [ELASTIC_DEAD_KEY.format(member=2)] and keys[0] not in self and time.monotonic() >= self.react_at:
            self.set(ELASTIC_LEAVING_KEY.format(member=1), "1")
            n = self.add(ELASTIC_UPDATES_KEY, 1)
            self.set(ELASTIC_UPDATE_KEY.format(n=n), "removed")
            self.set(keys[0], "1")
        return all(k in self for k in keys)


def test_a_removal_announced_while_the_ranks_gather_is_part_of_the_reformation():
    store = LauncherStore()
    leader = Membership.__new__(Membership)  # no thread, no launcher connection: the fields _lead uses
    leader.member_id, leader.members, leader.epoch = 0, [0, 1, 2], 1
    leader._store, leader._lock = store, threading.Lock()
    base = "accord/elastic/e1"
    for m in (0, 1):  # worker 2 failed: it never arrives
        store.set(f"{base}/arrived/{m}", b"1")
    record = leader._lead(base, timeout=10.0)
    assert record == {"members": [0], "updates": 1}  # worker 1 leaves; the removal is counted
    assert json.loads(store[ELASTIC_MEMBERS_KEY.format(epoch=1)]) == record


def _lead_without_worker_2(store):
    leader = _membership(store, members=[0, 1, 2], epoch=1)
    for m in (0, 1):  # worker 2 never arrives (and never beats)
        store.set(f"accord/elastic/e1/arrived/{m}", b"1")
    return leader._lead("accord/elastic/e1", timeout=30.0)


def test_under_the_elastic_driver_a_failing_member_is_waited_for_until_the_launcher_saw_it_end(monkeypatch):
    """Worker 2 raised (it marked itself exiting) but its process takes 3 s to exit: the leader
    does not give up on it after 2 s without heartbeat, it waits for the launcher, whose verdict
    also sends worker 1 away (its host is blacklisted): one re-formation, as in Horovod. (A
    leader that gave up at 2 s would re-form with [0, 1] and no update: the launcher reacts at 3 s.)"""
    monkeypatch.setenv("ACCORD_ELASTIC_ID", "0")
    store = LauncherStore(react_after=3.0)
    store.set("accord/elastic/exiting/2", b"1")
    record = _lead_without_worker_2(store)
    assert record == {"members": [0], "updates": 1}
    assert store[ELASTIC_DEAD_KEY.format(member=2)] == "1"  # it re-formed on the launcher's verdict


def test_without_the_driver_a_failing_member_is_gone_at_once(monkeypatch):
    monkeypatch.delenv("ACCORD_ELASTIC_ID", raising=False)
    store = LauncherStore(react_after=1000.0)  # accordrun --min-np on one host marks nobody dead
    store.set("accord/elastic/exiting/2", b"1")
    record = _lead_without_worker_2(store)
    assert record == {"members": [0, 1], "updates": 0}
    # at once: the leader looked for worker 2 a single time (waiting for it, even only for its
    # 2 s without heartbeat, would look every 50 ms)
    assert store.looks["accord/elastic/e1/arrived/2"] == 1, store.looks


def _membership(store, **fields):
    m = Membership.__new__(Membership)  # no thread, no launcher connection
    m._store, m._lock = store, threading.Lock()
    m.member_id, m.members, m.epoch, m._notified, m._covered, m.on_update = 0, [0, 1], 0, 0, 0, None
    for name, value in fields.items():
        setattr(m, name, value)
    return m


def test_a_change_announced_after_the_reformation_interrupts_again_after_the_reset(monkeypatch):
    monkeypatch.setattr(config, "set_variables", lambda values: None)  # no rank change in this process
    store = LauncherStore()
    store.add(ELASTIC_UPDATES_KEY, 1)
    store.set(ELASTIC_UPDATE_KEY.format(n=1), "added")  # the change this re-formation is for
    store.set(ELASTIC_MEMBERS_KEY.format(epoch=1), json.dumps({"members": [0, 1, 2], "updates": 1}))
    store.add("accord/elastic/e1/count", 1)  # another rank leads
    seen = []
    member = _membership(store, on_update=seen.append)
    member.regroup()
    assert member.members == [0, 1, 2]
    store.add(ELASTIC_UPDATES_KEY, 1)
    store.set(ELASTIC_UPDATE_KEY.format(n=2), "removed")  # announced after the re-formation
    member._watch_updates()  # the heartbeat thread sees it while the new job starts...
    assert seen == ["removed"]
    seen.clear()  # ...and the state's reset drops it
    member.after_reset()
    member._watch_updates()
    assert seen == ["removed"]  # announced again (update 1, taken in, is not: that would say "added")


def _fake_run(monkeypatch):
    """accord.torch.elastic with a fake membership, state and reset that record their calls."""
    from accord.torch import basics
    from accord.torch import elastic as el

    calls = []

    class FakeMembership:
        on_update = None
        members = [0, 1]

        def after_reset(self):
            calls.append("after_reset")

        def mark_exiting(self):
            calls.append("mark_exiting")

        def stop(self):
            calls.append("stop")

    class FakeState:
        def sync(self):
            calls.append("sync")

        def on_reset(self):
            calls.append("on_reset")

    monkeypatch.setattr(basics, "is_initialized", lambda: True)
    monkeypatch.setattr(el, "Membership", FakeMembership)
    monkeypatch.setattr(el, "_reset", lambda membership: calls.append("reset"))
    return el, FakeState, calls


def test_run_marks_a_worker_that_fails_for_good_as_exiting(monkeypatch):
    el, FakeState, calls = _fake_run(monkeypatch)

    @el.run
    def train(state):
        raise ValueError("a bug in the script")

    with pytest.raises(ValueError, match="a bug in the script"):
        train(FakeState())
    assert calls == ["sync", "mark_exiting", "stop"]


def test_run_announces_again_what_the_reset_dropped(monkeypatch):
    """hvd.elastic.run asks the membership to announce again after the state's reset, not before."""
    el, FakeState, calls = _fake_run(monkeypatch)
    tries = []

    @el.run
    def train(state):
        tries.append(1)
        if len(tries) == 1:
            raise el.HostsUpdatedInterrupt(skip_sync=True)
        return "done"

    assert train(FakeState()) == "done"
    assert calls == ["sync", "reset", "on_reset", "after_reset", "stop"]


def test_run_syncs_after_a_removal_when_the_reformation_took_in_a_new_worker(monkeypatch):
    """Told of a removal only (skip_sync), a survivor still syncs when the re-formation brought a
    new member: the new worker waits for rank 0's state in its own sync()."""
    el, FakeState, calls = _fake_run(monkeypatch)
    for new_members, synced_twice in (([0, 2], True), ([0], False)):
        calls.clear()
        tries = []

        def regroup(membership, members=new_members):
            calls.append("reset")
            membership.members = members

        monkeypatch.setattr(el, "_reset", regroup)

        @el.run
        def train(state, tries=tries):
            tries.append(1)
            if len(tries) == 1:
                raise el.HostsUpdatedInterrupt(skip_sync=True)
            return "done"

        assert train(FakeState()) == "done"
        assert calls.count("sync") == (2 if synced_twice else 1), (new_members, calls)
