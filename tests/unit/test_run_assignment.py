"""Slot assignment, checked against a brute-force reading of Horovod's definitions."""
import itertools

import pytest

from accord.errors import ConfigError
from accord.run.spec.assignment import assign_slots, hosts_of
from accord.run.spec.hosts import HostSlots


def _expected(hosts, np_):
    """Independent: list rank -> host, then count by definition."""
    names = [h for h, s in hosts for _ in range(s)][:np_]
    rows = []
    for r, h in enumerate(names):
        local_rank = names[:r].count(h)
        used = list(dict.fromkeys(names))
        peers = [x for x in used if names.count(x) > local_rank]
        rows.append((r, np_, local_rank, names.count(h), peers.index(h), len(peers), h, used.index(h)))
    return rows


def test_example_from_the_docstring():
    slots = assign_slots([HostSlots("a", 2), HostSlots("b", 2)], 3)
    assert [(s.rank, s.hostname, s.local_rank, s.local_size) for s in slots] == [
        (0, "a", 0, 2), (1, "a", 1, 2), (2, "b", 0, 1)]
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 2), (0, 1), (1, 2)]
    assert [s.host_index for s in slots] == [0, 0, 1]


@pytest.mark.parametrize("layout", [(1,), (4,), (2, 2), (3, 1, 2), (1, 3), (2, 2, 2, 2)])
def test_matches_definitions_for_every_np(layout):
    hosts = [(f"h{i}", s) for i, s in enumerate(layout)]
    for np_ in range(1, sum(layout) + 1):
        got = assign_slots([HostSlots(h, s) for h, s in hosts], np_)
        assert [(s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.hostname,
                 s.host_index) for s in got] == _expected(hosts, np_)


def test_unused_hosts_are_dropped():
    slots = assign_slots([HostSlots("a", 4), HostSlots("b", 4)], 2)
    assert hosts_of(slots) == ["a"]
    assert all(s.cross_size == 1 for s in slots)


def test_cross_groups_partition_ranks():
    slots = assign_slots([HostSlots("a", 3), HostSlots("b", 1), HostSlots("c", 2)], 6)
    for _local_rank, group in itertools.groupby(sorted(slots, key=lambda s: s.local_rank),
                                               key=lambda s: s.local_rank):
        group = list(group)
        assert sorted(s.cross_rank for s in group) == list(range(len(group)))
        assert {s.cross_size for s in group} == {len(group)}


@pytest.mark.parametrize("hosts, np_, fragment", [
    ([HostSlots("a", 2)], 3, "more than the 2 slots"),
    ([HostSlots("a", 2)], 0, "at least 1"),
    ([], 1, "no hosts"),
])
def test_errors_have_hints(hosts, np_, fragment):
    with pytest.raises(ConfigError) as info:
        assign_slots(hosts, np_)
    assert fragment in str(info.value) and "HINT:" in str(info.value)
