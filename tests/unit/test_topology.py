from accord.runtime.topology import topology_from_hostnames


def test_two_hosts_two_slots_each():
    hosts = ["a", "a", "b", "b"]
    t = topology_from_hostnames(3, hosts)
    assert (t.rank, t.size, t.local_rank, t.local_size, t.cross_rank, t.cross_size) == (3, 4, 1, 2, 1, 2)
    assert t.local_ranks() == [2, 3] and t.cross_ranks() == [1, 3] and t.homogeneous


def test_heterogeneous_hosts():
    hosts = ["a", "a", "a", "b"]
    t = topology_from_hostnames(2, hosts)
    assert (t.local_rank, t.local_size, t.cross_size) == (2, 3, 1)
    assert not t.homogeneous
    t0 = topology_from_hostnames(3, hosts)
    assert (t0.local_rank, t0.cross_rank, t0.cross_size) == (0, 1, 2)
