"""The rank-coordinate rule, checked against a brute-force reading of Horovod's definitions, and
the three places that use it (launch assignment, elastic plans, init's topology) agreeing."""
import itertools

import pytest

from accord.placement import Coordinates, coordinates, local_ranks
from accord.run.elastic.plan import planned_slots
from accord.run.spec.assignment import assign_slots
from accord.run.spec.hosts import HostSlots
from accord.runtime.topology import topology_from_hostnames


def _by_definition(names):
    """Independent: count each coordinate straight from its definition."""
    rows = []
    for rank, host in enumerate(names):
        local_rank = names[:rank].count(host)
        peers = [r for r in range(len(names)) if names[:r].count(names[r]) == local_rank]
        rows.append(Coordinates(rank, len(names), local_rank, names.count(host), peers.index(rank), len(peers),
                                list(dict.fromkeys(names)).index(host)))
    return rows


LAYOUTS = [["a"], ["a", "a", "b", "b"], ["a", "b", "a"], ["b", "a", "a", "c", "b", "a"],
           ["x", "y", "y", "x"]] + [list(p) for p in itertools.product("ab", repeat=4)]


@pytest.mark.parametrize("names", LAYOUTS)
def test_coordinates_follow_the_definitions(names):
    assert coordinates(names) == _by_definition(names)
    assert local_ranks(names) == [c.local_rank for c in _by_definition(names)]


def test_the_docstring_example():
    assert coordinates(["a", "b", "a"])[2] == Coordinates(rank=2, size=3, local_rank=1, local_size=2,
                                                          cross_rank=0, cross_size=1, host_index=0)


@pytest.mark.parametrize("names", LAYOUTS)
def test_launcher_plans_and_init_agree(names):
    planned = planned_slots(names)
    for rank in range(len(names)):
        topo = topology_from_hostnames(rank, names)
        slot = planned[rank]
        assert (slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size) == \
            (topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size)


def test_an_in_order_assignment_is_the_planned_one():
    hosts = [HostSlots("h1", 3), HostSlots("h2", 1), HostSlots("h3", 2)]
    assert assign_slots(hosts, 6) == planned_slots(["h1", "h1", "h1", "h2", "h3", "h3"])


def test_empty_job():
    assert coordinates([]) == [] and local_ranks([]) == []
