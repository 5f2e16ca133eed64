"""The process-set registry's bookkeeping and local/cross rank lists."""
from __future__ import annotations

import pytest

from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.runtime.groups import cross_ranks, cross_sets, local_ranks, local_sets
from accord.runtime.topology import topology_from_hostnames

pytestmark = pytest.mark.timeout(10)


def test_global_set_is_id_zero_and_permanent():
    table = ProcessSetRegistry(4)
    assert table.ids() == [GLOBAL_ID] == [0]
    assert table.get(0) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="cannot be removed") as info:
        table.remove(0)
    assert "HINT:" in str(info.value)


def test_add_get_remove_and_ids_are_not_reused():
    table = ProcessSetRegistry(4)
    even = table.add([0, 2], {})
    odd = table.add((1, 3), {})
    assert (even, odd) == (1, 2)
    assert table.get(even) == (0, 2) and table.get(odd) == (1, 3)
    assert table.ids() == [0, 1, 2] and len(table) == 3 and even in table
    assert table.find([1, 3]) == odd and table.find([0, 1]) is None
    table.remove(even)
    assert table.ids() == [0, 2] and even not in table
    assert table.add([0, 2], {}) == 3  # a fresh id, never the removed one
    with pytest.raises(ValueError, match="no process set with id 1") as info:
        table.get(1)
    assert "known ids: [0, 2, 3]" in str(info.value) and "HINT:" in str(info.value)
    with pytest.raises(ValueError, match="no process set"):
        table.remove(1)


@pytest.mark.parametrize(
    "ranks, text",
    [
        ([], "empty"),
        ([2, 0], "sorted and unique"),
        ([0, 0, 1], "sorted and unique"),
        ([0, 4], "[0, 4)"),
        ([-1, 0], "[0, 4)"),
        ([0.0, 1.0], "int"),
        ([True, 2], "int"),
        ([0, 1, 2, 3], "already registered as id 0"),
    ],
)
def test_invalid_sets_raise_value_error_with_hint(ranks, text):
    table = ProcessSetRegistry(4)
    with pytest.raises(ValueError) as info:
        table.add(ranks, {})
    assert text in str(info.value) and "HINT:" in str(info.value)


def test_duplicate_of_a_user_set_is_refused():
    table = ProcessSetRegistry(3)
    first = table.add([0, 2], {})
    with pytest.raises(ValueError, match=f"already registered as id {first}"):
        table.add([0, 2], {})


def test_size_must_be_positive():
    with pytest.raises(ValueError, match="HINT:"):
        ProcessSetRegistry(0)


HOSTS = ["a", "b", "a", "c", "b", "a"]


def _by_hand():
    """Local and cross lists computed directly from the definitions."""
    local = {}
    for rank, host in enumerate(HOSTS):
        local.setdefault(host, []).append(rank)
    local_rank = {r: ranks.index(r) for ranks in local.values() for r in ranks}
    cross = {}
    for rank in range(len(HOSTS)):
        cross.setdefault(local_rank[rank], []).append(rank)
    return local, cross, local_rank


def test_local_and_cross_sets_from_topology():
    local, cross, local_rank = _by_hand()
    topo = topology_from_hostnames(0, HOSTS)
    assert local_sets(topo) == [local["a"], local["b"], local["c"]] == [[0, 2, 5], [1, 4], [3]]
    assert cross_sets(topo) == [cross[0], cross[1], cross[2]] == [[0, 1, 3], [2, 4], [5]]
    for rank in range(len(HOSTS)):
        t = topology_from_hostnames(rank, HOSTS)
        assert local_ranks(t) == local[HOSTS[rank]]
        assert cross_ranks(t) == cross[local_rank[rank]]


def test_sets_register_in_the_table():
    topo = topology_from_hostnames(0, HOSTS)
    table = ProcessSetRegistry(len(HOSTS))
    ids = [table.add(ranks, {}) for ranks in local_sets(topo) + cross_sets(topo) if len(ranks) > 0
           and table.find(ranks) is None]
    assert [table.get(i) for i in ids] == [(0, 2, 5), (1, 4), (3,), (0, 1, 3), (2, 4), (5,)]


def test_hierarchy_needs_several_hosts_with_equal_ranks():
    from accord.comm.hierarchical import hierarchy_problem

    assert hierarchy_problem([[0, 1], [2, 3]]) is None
    assert hierarchy_problem([[0, 2, 4], [1, 3, 5]]) is None
    assert "one host" in hierarchy_problem([[0, 1, 2]])
    assert "not homogeneous" in hierarchy_problem([[0, 1], [2]])
    assert "one rank" in hierarchy_problem([[0], [1]])
