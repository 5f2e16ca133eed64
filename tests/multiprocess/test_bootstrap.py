"""bootstrap() on real ranks: topology, a collective through the default group, re-bootstrap,
fake hosts, missing ranks, and the torchrun / SLURM (rank 0 hosts the store) paths."""
from __future__ import annotations

import pytest
from helpers import groups
from helpers.ports import held_port
from helpers.ranks import run_ranks


def _expected_topology(hostnames: list[str]) -> list[tuple[int, int, int, int]]:
    """(local_rank, local_size, cross_rank, cross_size) per rank, computed by hand-rolled loops."""
    out = []
    for rank, host in enumerate(hostnames):
        same_host = [r for r, h in enumerate(hostnames) if h == host]
        local_rank = same_host.index(rank)
        peers = []
        for r, h in enumerate(hostnames):
            if [q for q, g in enumerate(hostnames) if g == h].index(r) == local_rank:
                peers.append(r)
        out.append((local_rank, len(same_host), peers.index(rank), len(peers)))
    return out


def _bootstrap_twice(rank: int, size: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord.errors import RendezvousError
    from accord.runtime.bootstrap import active_runtime, bootstrap

    out: dict = {}
    for round_ in range(2):
        rt = bootstrap(timeout=20)
        t = rt.topology
        out[f"topo{round_}"] = (t.rank, t.size, t.local_rank, t.local_size, t.cross_rank,
                                t.cross_size, t.hostnames, t.homogeneous)
        value = torch.tensor([float(rank + 1), float(10 * (round_ + 1))])
        groups.gloo_allreduce(rt.store, range(size), rank, "sum", value)
        out[f"sum{round_}"] = value.tolist()
        out["source"] = rt.source
        out["secret_len"] = len(rt.secret)
        # The generation-scoped store is private to this bootstrap: last round's key is absent.
        rt.store.set(f"mine/{round_}/{rank}", str(rank))
        rt.store.wait([f"mine/{round_}/{r}" for r in range(size)])
        out[f"old_key_visible{round_}"] = rt.store.check([f"mine/{round_ - 1}/{rank}"])
        if round_ == 0:
            assert active_runtime() is rt
            try:
                bootstrap(timeout=5)
                out["double"] = "no error"
            except RendezvousError as exc:
                out["double"] = str(exc)
        rt.close()
        rt.close()  # idempotent
        out[f"pg_after_close{round_}"] = dist.is_initialized()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_bootstrap_topology_allreduce_and_rebootstrap(nprocs):
    results = run_ranks(_bootstrap_twice, nprocs, init="accord", timeout=45)
    ranks_sum = sum(range(1, nprocs + 1))
    for rank, out in enumerate(results):
        for round_ in range(2):
            assert out[f"topo{round_}"] == (rank, nprocs, rank, nprocs, 0, 1,
                                            ("localhost",) * nprocs, True)
            assert out[f"sum{round_}"] == [float(ranks_sum), float(10 * (round_ + 1) * nprocs)]
            assert out[f"pg_after_close{round_}"] is False
            assert out[f"old_key_visible{round_}"] is False
        assert out["source"] == "accord"
        assert out["secret_len"] == 32
        assert "already bootstrapped" in out["double"] and "HINT:" in out["double"]


_FAKE_HOSTS = ["hostA", "hostA", "hostB"]


def _fake_hosts(rank: int) -> dict[str, str]:
    local = _expected_topology(_FAKE_HOSTS)[rank]
    return {"ACCORD_HOSTNAME": _FAKE_HOSTS[rank], "ACCORD_LOCAL_RANK": str(local[0]),
            "ACCORD_LOCAL_SIZE": str(local[1]), "ACCORD_CROSS_RANK": str(local[2]),
            "ACCORD_CROSS_SIZE": str(local[3])}


def _topology_and_groups(rank: int, size: int) -> dict:
    import torch

    from accord.runtime.bootstrap import bootstrap
    from accord.runtime.groups import cross_sets, local_sets

    with bootstrap(timeout=20) as rt:
        t = rt.topology
        local = torch.tensor([float(rank)])
        groups.gloo_allreduce(rt.store, t.local_ranks(), rank, f"local{t.local_ranks()}", local)
        cross = torch.tensor([float(rank)])
        groups.gloo_allreduce(rt.store, t.cross_ranks(), rank, f"cross{t.cross_ranks()}", cross)
        return {"topo": (t.local_rank, t.local_size, t.cross_rank, t.cross_size),
                "homogeneous": t.homogeneous, "hostnames": list(t.hostnames),
                "local_sum": local.item(), "cross_sum": cross.item(),
                "local_sets": local_sets(t), "cross_sets": cross_sets(t)}


@pytest.mark.timeout(60)
def test_fake_two_hosts_local_and_cross_groups():
    results = run_ranks(_topology_and_groups, 3, init="accord", per_rank_env=_fake_hosts,
                        timeout=45)
    expected = _expected_topology(_FAKE_HOSTS)
    for rank, out in enumerate(results):
        assert out["topo"] == expected[rank]
        assert out["hostnames"] == _FAKE_HOSTS
        assert out["homogeneous"] is False
        local = [r for r, h in enumerate(_FAKE_HOSTS) if h == _FAKE_HOSTS[rank]]
        cross = [r for r in range(3) if expected[r][0] == expected[rank][0]]
        assert out["local_sum"] == float(sum(local))
        assert out["cross_sum"] == float(sum(cross))
        assert out["local_sets"] == [[0, 1], [2]]
        assert out["cross_sets"] == [[0, 2], [1]]


def _expect_missing(rank: int, size: int) -> str:
    from accord.errors import RendezvousError
    from accord.runtime.bootstrap import bootstrap

    try:
        bootstrap(timeout=2).close()
    except RendezvousError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
def test_missing_rank_named_within_timeout():
    # Two processes start, but the job claims three: rank 2 never comes.
    results = run_ranks(_expect_missing, 2, init="accord", env={"ACCORD_SIZE": "3"}, timeout=30)
    for message in results:  # (a rendezvous that never gave up would hang: the harness's 30 s)
        assert "did not reach the rendezvous within 2.0s" in message, message  # its own timeout ended it
        assert "missing ranks [2]" in message and "present: [0, 1]" in message, message
        assert "HINT:" in message


def _bootstrap_allreduce(rank: int, size: int) -> tuple:
    import torch

    from accord.runtime.bootstrap import bootstrap

    out = []
    for _ in range(2):  # the second round re-binds rank 0's store on the same port
        with bootstrap(timeout=60) as rt:  # generous: a loaded machine starts ranks late
            value = torch.tensor([float(rank + 1)])
            groups.gloo_allreduce(rt.store, range(size), rank, "sum", value)
            out.append((rt.source, rt.topology.size, rt.topology.local_size, value.item(),
                        rt.secret.hex()))
    return tuple(out)


def _torchrun_env(port: int):
    def env(rank: int) -> dict[str, str]:
        # Empty ACCORD_* values count as unset, so the torchrun detector answers.
        return {"ACCORD_RANK": "", "ACCORD_SIZE": "", "ACCORD_JOB_SECRET": "",
                "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return env


def _slurm_env(port: int):
    def env(rank: int) -> dict[str, str]:
        return {"ACCORD_RANK": "", "ACCORD_SIZE": "", "SLURM_PROCID": str(rank),
                "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost",
                "MASTER_PORT": str(port)}
    return env


@pytest.mark.timeout(150)
def test_torchrun_environment_uses_torch_store():
    results = run_ranks(_bootstrap_allreduce, 2, init="none",
                        per_rank_env=_torchrun_env(held_port()), timeout=130)
    for out in results:
        for source, size, local_size, total, _ in out:
            assert (source, size, local_size, total) == ("torchrun", 2, 2, 3.0)
    # The secret was agreed through the store: the same on both ranks.
    assert results[0][0][4] == results[1][0][4]


@pytest.mark.timeout(150)
def test_slurm_environment_rank0_hosts_store():
    results = run_ranks(_bootstrap_allreduce, 2, init="accord",
                        per_rank_env=_slurm_env(held_port()), timeout=130)
    for out in results:
        for source, size, local_size, total, _ in out:
            assert (source, size, local_size, total) == ("slurm", 2, 2, 3.0)


def _rank1_leaves_without_close(rank: int, size: int) -> tuple[float, list[str]]:
    import logging
    import time

    from accord.runtime.bootstrap import bootstrap

    rt = bootstrap(timeout=90)
    if rank == 1:
        return 0.0, []  # its process ends without close(): its connections drop
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("accord.runtime").addHandler(handler)
    start = time.monotonic()
    try:
        rt.close()  # rank 0 hosts the store and must not wait out the whole timeout
    finally:
        logging.getLogger("accord.runtime").removeHandler(handler)
    return time.monotonic() - start, [r.getMessage() for r in records if r.levelno >= logging.WARNING]


@pytest.mark.timeout(60)
def test_store_owner_does_not_wait_for_a_rank_that_exited():
    results = run_ranks(_rank1_leaves_without_close, 2, init="accord",
                        per_rank_env=_slurm_env(held_port()), timeout=60)
    _, warnings = results[0]
    # it saw rank 1's connections drop; waiting out the 90 s would have logged "not every rank left"
    assert not any("not every rank left" in w for w in warnings), warnings
