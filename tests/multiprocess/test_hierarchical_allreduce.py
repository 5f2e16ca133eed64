"""ACCORD_HIERARCHICAL_ALLREDUCE (HOROVOD_HIERARCHICAL_ALLREDUCE) on real ranks.

Hosts are faked with ACCORD_HOSTNAME: 4 ranks as 2 hosts x 2 ranks. The local communicators are
shm (the one-host default), the cross ones and the flat one gloo (the multi-host default).
Expected values are computed with numpy from every rank's input.
"""
import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)


def _hosts_env(hosts):
    """Per-rank environment placing rank r on host hosts[r] (topology as a launcher gives it)."""
    def env(rank):
        host = hosts[rank]
        local = [r for r, h in enumerate(hosts) if h == host]
        local_rank = local.index(rank)
        peers = [h for h in dict.fromkeys(hosts) if hosts.count(h) > local_rank]
        return {"ACCORD_HOSTNAME": host, "ACCORD_LOCAL_RANK": str(local_rank),
                "ACCORD_LOCAL_SIZE": str(len(local)), "ACCORD_CROSS_RANK": str(peers.index(host)),
                "ACCORD_CROSS_SIZE": str(len(peers))}
    return env


def _values(rank, n, dtype):
    import torch

    gen = torch.Generator().manual_seed(1000 + rank * 7 + n)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=gen) * 4 - 2).to(dtype)
    return torch.randint(-5, 6, (n,), generator=gen, dtype=dtype)


_CASES = [(n, dt, op) for n in (1, 3, 1001) for dt in ("float32", "int32") for op in ("sum", "min", "max")]
_CASES += [(7, "float64", "product"), (4097, "bfloat16", "sum"), (9, "float32", "average")]


def _hierarchical_checks(rank, size):
    import torch

    from accord.comm.hierarchical import HierarchicalCommunicator
    from accord.comm.ops import ReduceOp
    from accord.engine import session

    session.init()
    comm = session.communicator(0, "cpu")
    kind = type(comm).__name__
    parts = (comm.local.backend_name, comm.cross.backend_name, comm.flat.backend_name) \
        if isinstance(comm, HierarchicalCommunicator) else None
    ops = {"sum": ReduceOp.SUM, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
           "product": ReduceOp.PRODUCT, "average": ReduceOp.AVERAGE}
    results = {}
    for n, dt, op in _CASES:
        t = _values(rank, n, getattr(torch, dt))
        h = session.submit("allreduce", t, f"{n}.{dt}.{op}", in_place=True, reduce_op=ops[op])
        session.synchronize(h)
        results[(n, dt, op)] = t.float().tolist()
    if parts is not None:  # pipelined: pieces of 1 KB, the network step on a helper thread
        comm.piece_bytes = 1024
        for dt, op in (("float32", "sum"), ("int32", "max")):
            t = _values(rank, 5003, getattr(torch, dt))
            session.synchronize(session.submit("allreduce", t, f"piped.{dt}", in_place=True,
                                               reduce_op=ops[op]))
            results[(5003, dt, op)] = t.float().tolist()
        comm.piece_bytes = 1 << 30
    # a fused batch of gradients (one buffer through the hierarchy)
    grads = [_values(rank, 257 + i, torch.float32) for i in range(6)]
    handles = [session.submit("allreduce", g, f"grad.{i}", in_place=True) for i, g in enumerate(grads)]
    for h in handles:
        session.synchronize(h)
    results["batch"] = [g.tolist() for g in grads]
    # ragged rows: the counts are agreed first, then each rank's rows cross hosts once
    gathered = session.synchronize(session.submit("allgather", torch.full((rank + 1,), float(rank)), "ag"))
    results["allgather"] = gathered.tolist()
    rows = torch.full((rank + 2, 3), rank * 1.5, dtype=torch.float64)
    into = torch.full((14, 3), -1.0, dtype=torch.float64)
    session.synchronize(session.submit("allgather", rows, "ag.out", output=into))
    results["allgather.out"] = into.tolist()
    for n, dt, op in _SCATTERS:  # lower ranks get the extra rows, as flat
        t = _values(rank, n, getattr(torch, dt))
        got = session.synchronize(session.submit("reducescatter", t, f"rs.{n}.{dt}.{op}", reduce_op=ops[op]))
        results[("rs", n, dt, op)] = got.float().tolist()
    t = _values(rank, 27, torch.float64).reshape(9, 3)
    into = torch.full((3 if rank == 0 else 2, 3), -1.0, dtype=torch.float64)
    session.synchronize(session.submit("reducescatter", t, "rs.out", output=into))
    results["rs.out"] = into.tolist()
    used = getattr(comm, "hierarchical_allreduces", 0)
    through = (getattr(comm, "hierarchical_scatters", 0), getattr(comm, "hierarchical_gathers", 0))
    # a set over every rank (torch.distributed's new_group) is host-first too; one over one rank
    # per host has nothing to do inside a host and stays flat
    everyone = session.add_private_process_set([0, 1, 2, 3], "everyone")
    in_set = session.communicator(everyone, "cpu")
    t = _values(rank, 1001, torch.float32)
    session.synchronize(session.submit("allreduce", t, "set.all", in_place=True, process_set_id=everyone))
    results["set.all"] = t.tolist()
    sets = {"everyone": (type(in_set).__name__, getattr(in_set, "hierarchical_allreduces", 0))}
    if rank in (0, 2):
        ends = session.add_private_process_set([0, 2], "one-per-host")
        sets["one-per-host"] = (type(session.communicator(ends, "cpu")).__name__, 0)
    session.shutdown()
    return {"kind": kind, "parts": parts, "used": used, "through": through, "results": results, "sets": sets}


_SCATTERS = [(4, "float32", "sum"), (7, "float32", "sum"), (1001, "int32", "max"), (10, "float32", "average")]


def _expected(size, n, dt, op):
    import torch

    vals = np.stack([_values(r, n, getattr(torch, dt)).double().numpy() for r in range(size)])
    if op == "average":
        return vals.sum(axis=0) / size
    return {"sum": vals.sum(axis=0), "min": vals.min(axis=0), "max": vals.max(axis=0),
            "product": vals.prod(axis=0)}[op]


def test_two_hosts_of_two_ranks_reduce_hierarchically():
    hosts = ["hostA", "hostA", "hostB", "hostB"]
    out = run_ranks(_hierarchical_checks, 4, init="accord", per_rank_env=_hosts_env(hosts), timeout=100,
                    env={"ACCORD_HIERARCHICAL_ALLREDUCE": "1", "ACCORD_CPU_BACKEND": "auto"})
    for _rank, res in enumerate(out):
        assert res["kind"] == "HierarchicalCommunicator", res["kind"]
        assert res["parts"] == ("shm", "gloo", "gloo")
        # every allreduce of at least one element per local rank took the three steps (the
        # batch at least once); one-element tensors went flat
        assert res["used"] >= sum(1 for n, _, _ in _CASES if n >= 2) + 1, res["used"]
        for (n, dt, op) in _CASES:
            got = np.array(res["results"][(n, dt, op)])
            want = _expected(4, n, dt, op)
            if dt == "bfloat16":
                np.testing.assert_allclose(got, want, rtol=0.05, atol=0.1)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        for dt, op in (("float32", "sum"), ("int32", "max")):  # the pipelined path
            np.testing.assert_allclose(np.array(res["results"][(5003, dt, op)]), _expected(4, 5003, dt, op),
                                       rtol=1e-6, atol=1e-6)
        for i, g in enumerate(res["results"]["batch"]):
            np.testing.assert_allclose(np.array(g), _expected(4, 257 + i, "float32", "sum"), rtol=1e-6, atol=1e-6)
        assert res["results"]["allgather"] == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]
        assert res["results"]["allgather.out"] == [[r * 1.5] * 3 for r in range(4) for _ in range(r + 2)]
        for n, dt, op in _SCATTERS:
            rows = [n // 4 + (1 if r < n % 4 else 0) for r in range(4)]
            start = sum(rows[:_rank])
            np.testing.assert_allclose(np.array(res["results"][("rs", n, dt, op)]),
                                       _expected(4, n, dt, op)[start:start + rows[_rank]], rtol=1e-6, atol=1e-6)
        want = _expected(4, 27, "float64", "sum").reshape(9, 3)
        start = 0 if _rank == 0 else 3 + 2 * (_rank - 1)
        np.testing.assert_allclose(np.array(res["results"]["rs.out"]), want[start:start + (3 if _rank == 0 else 2)],
                                   rtol=1e-12)
        # every reduce-scatter and allgather went host-first (the forced hierarchy has no size cutoff)
        assert res["through"] == (len(_SCATTERS) + 1, 2), res["through"]
        kind_in_set, took_hierarchy = res["sets"]["everyone"]
        assert kind_in_set == "HierarchicalCommunicator" and took_hierarchy >= 1, res["sets"]
        np.testing.assert_allclose(np.array(res["results"]["set.all"]), _expected(4, 1001, "float32", "sum"),
                                   rtol=1e-6, atol=1e-6)
        if _rank in (0, 2):
            assert res["sets"]["one-per-host"][0] != "HierarchicalCommunicator", res["sets"]
    # every rank ends with the same bits (but for its own rows of a reduce-scatter)
    for key in out[0]["results"]:
        if key == "rs.out" or key[0] == "rs":
            continue
        assert all(o["results"][key] == out[0]["results"][key] for o in out), key


def _flat_fallback(rank, size):
    import torch

    from accord.engine import session

    session.init()
    kind = type(session.communicator(0, "cpu")).__name__
    t = torch.full((5,), float(rank + 1))
    session.synchronize(session.submit("allreduce", t, "x", in_place=True))
    session.shutdown()
    return kind, t.tolist()


@pytest.mark.parametrize("value, kind", [(None, "HierarchicalCommunicator"), ("0", "TorchCommunicator")])
def test_unset_chooses_the_hierarchy_and_zero_keeps_it_flat(value, kind):
    hosts = ["hostA", "hostA", "hostB", "hostB"]
    env = {"ACCORD_CPU_BACKEND": "auto"} if value is None else {"HOROVOD_HIERARCHICAL_ALLREDUCE": value}
    out = run_ranks(_flat_fallback, 4, init="accord", per_rank_env=_hosts_env(hosts), timeout=60, env=env)
    for got, values in out:
        assert got == kind
        assert values == [10.0] * 5


def test_uneven_hosts_stay_flat():
    hosts = ["hostA", "hostA", "hostB"]
    out = run_ranks(_flat_fallback, 3, init="accord", per_rank_env=_hosts_env(hosts), timeout=60,
                    env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    for kind, values in out:
        assert kind == "TorchCommunicator"
        assert values == [6.0] * 5
