"""accord.spawn: results in rank order, the worker contract, failures re-raised with the rank."""
import os
import time

import pytest

import accord
from accord.errors import ConfigError, WorkerFailedError


def contract(scale):
    names = ("ACCORD_RANK", "ACCORD_SIZE", "ACCORD_LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT",
             "OMP_NUM_THREADS", "ACCORD_FUSION_THRESHOLD", "EXTRA")
    env = {n: os.environ.get(n) for n in names}
    env["secret_len"] = len(os.environ.get("ACCORD_JOB_SECRET", ""))
    env["value"] = int(os.environ["ACCORD_RANK"]) * scale
    env["pgid_is_pid"] = os.getpgid(0) == os.getpid()
    return env


def fail_on_rank_1(message):
    if os.environ["ACCORD_RANK"] == "1":
        raise ValueError(message)
    time.sleep(120)
    return "slept"


def die_on_rank_0():
    if os.environ["ACCORD_RANK"] == "0":
        os._exit(7)
    time.sleep(30)


def sleep_then_return(seconds):
    time.sleep(seconds)
    return os.getpid()


@pytest.mark.timeout(30)
def test_results_in_rank_order_with_contract():
    results = accord.spawn(contract, args=(10,), nprocs=3, fusion_threshold_mb=1, env={"EXTRA": "x"})
    assert [r["value"] for r in results] == [0, 10, 20]
    ports = {r["MASTER_PORT"] for r in results}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, r in enumerate(results):
        assert (r["ACCORD_RANK"], r["ACCORD_SIZE"], r["ACCORD_LOCAL_RANK"]) == (str(rank), "3", str(rank))
        assert (r["RANK"], r["WORLD_SIZE"]) == (str(rank), "3")
        assert r["ACCORD_FUSION_THRESHOLD"] == str(1024 * 1024) and r["EXTRA"] == "x"
        assert r["secret_len"] == 64 and r["pgid_is_pid"]
        assert r["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 3)))
    assert "ACCORD_RANK" not in os.environ  # the parent's environment is left as it was


@pytest.mark.timeout(60)
def test_worker_exception_reraised_with_rank_and_traceback():
    # rank 0 sleeps 120 s, past the test's 60 s timeout: spawn returns only if it was stopped
    with pytest.raises(WorkerFailedError) as info:
        accord.spawn(fail_on_rank_1, args=("bad input 42",), nprocs=2, grace_period=1)
    err = info.value
    assert err.rank == 1 and err.exit_code == 1
    text = str(err)
    assert "rank 1 of 2 failed: ValueError: bad input 42" in text
    assert "in fail_on_rank_1" in text and "HINT:" in text
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "bad input 42"


@pytest.mark.timeout(30)
def test_worker_that_dies_without_result():
    with pytest.raises(WorkerFailedError) as info:
        accord.spawn(die_on_rank_0, nprocs=2, grace_period=1)
    assert info.value.rank == 0 and info.value.exit_code == 7 and "exit code 7" in str(info.value)


@pytest.mark.timeout(30)
def test_join_false_returns_a_context():
    ctx = accord.spawn(sleep_then_return, args=(0.5,), nprocs=2, join=False)
    try:
        assert len(ctx.processes) == 2 and all(isinstance(p, int) for p in ctx.pids())
        assert ctx.join(timeout=0.01) is False
        assert ctx.join(timeout=20) is True
        assert ctx.results == ctx.pids()
    finally:
        ctx.close()


def allreduce_with_accord_init():
    from accord.runtime.bootstrap import bootstrap

    rt = bootstrap()
    try:
        rank, size = rt.topology.rank, rt.topology.size
        rt.store.set(f"value/{rank}", str(rank + 1))  # summed over the store the ranks met on
        rt.store.wait([f"value/{r}" for r in range(size)])
        return rank, size, sum(float(rt.store.get(f"value/{r}")) for r in range(size))
    finally:
        rt.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_workers_meet_through_spawns_store():
    pytest.importorskip("accord.runtime.bootstrap")
    assert accord.spawn(allreduce_with_accord_init, nprocs=2) == [(0, 2, 3.0), (1, 2, 3.0)]


def test_unknown_option_and_bad_nprocs():
    with pytest.raises(ConfigError, match="(?s)unknown options.*HINT:"):
        accord.spawn(contract, nprocs=1, bogus=1)
    with pytest.raises(ConfigError, match="nprocs"):
        accord.spawn(contract, nprocs=0)
