"""How the engine gathers requests into cycles: a waiting caller (synchronize, or poll of an
unfinished handle) starts the cycle at once, however long the cycle time; async bursts that
nobody waits on yet are gathered into one collective.

The cycle time and the quiet time are set to 90 s here, longer than run_ranks' 80 s bound, so
a job that returns at all shows no cycle waited it out, and a burst is cut only by a caller that
waits (not by a pause in the submissions on a loaded machine).
"""
import pytest
from helpers.marks import mark, wait_marked
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)


def _gathering_checks(rank, size, folder):
    import time

    import torch

    from accord.engine import session

    session.init()
    engine = session.engine()
    assert engine.settings.cycle_time == 90.0 and engine.settings.quiet_time == 90.0
    report = {}

    # a synchronous op: submit, then wait: the wait starts the cycle
    for i in range(10):
        t = torch.full((4,), float(rank + i))
        session.synchronize(session.submit("allreduce", t, "sync", in_place=True))
        assert t.tolist() == [float(sum(r + i for r in range(size)))] * 4
    report["synchronized"] = i + 1

    # polling an unfinished handle is waiting too
    t = torch.full((3,), float(rank))
    h = session.submit("allreduce", t, "polled", in_place=True)
    while not session.poll(h):
        time.sleep(0.001)
    assert session.synchronize(h).tolist() == [float(sum(range(size)))] * 3
    report["polled"] = True

    # an async burst is gathered until the caller waits: one data collective for all 12
    before = engine.stats()["collectives"]
    tensors = [torch.full((100 + k,), float(rank * k)) for k in range(12)]
    handles = [session.submit("allreduce", x, f"burst.{k}", in_place=True) for k, x in enumerate(tensors)]
    # every rank has queued all 12 before any waits (a loaded machine may hold one rank back
    # between its submissions); then the engine must not start while the callers are busy elsewhere
    mark(folder, f"burst queued {rank}")
    assert wait_marked(folder, *[f"burst queued {r}" for r in range(size)], timeout=30)
    time.sleep(0.3)
    for k, (x, hk) in enumerate(zip(tensors, handles)):
        session.synchronize(hk)
        assert x.tolist() == [float(sum(r * k for r in range(size)))] * (100 + k)
    report["burst_collectives"] = engine.stats()["collectives"] - before
    session.shutdown()
    return report


def test_waiting_callers_start_the_cycle_and_bursts_are_gathered(tmp_path):
    env = {"ACCORD_CPU_BACKEND": "shm", "ACCORD_CYCLE_TIME": "90000", "ACCORD_CYCLE_QUIET_TIME": "90000"}
    for report in run_ranks(_gathering_checks, 2, str(tmp_path), init="accord", env=env, timeout=80):
        # all 10 synchronous ops and the polled one done: any cycle that waited would have
        # taken 90 s, past run_ranks' bound
        assert report["synchronized"] == 10 and report["polled"], report
        assert report["burst_collectives"] == 1, report
