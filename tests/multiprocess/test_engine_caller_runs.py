"""A waiting caller runs the planned cycle on its own thread (accord/engine/cycle/caller_runs.py): values,
results that do not alias the reused staging buffer, a peer leaving the plan while the caller
runs it, and a peer dying under a collective run on the caller's thread. Real ranks over Gloo;
expected values computed from each rank's inputs."""
import time

import pytest
from helpers.dying_ranks import peer_gone
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(150)


def _submit(eng, tensor, name, in_place=False, waited=True):
    """Submit an allreduce; ``waited``: the caller synchronizes it at once (as hvd.allreduce)."""
    from accord.engine.request import Op, build_request

    return eng.enqueue_many([build_request(Op.ALLREDUCE, tensor, name, in_place=in_place)], waited)[0]


def _parked(eng):
    """Wait until the global controller's thread is parked in its wait for submissions, so that
    whether a caller may run the next planned cycle does not depend on how fast a loaded machine
    schedules that thread (reads a private flag: test-only). 30 s only ends a wait for a thread
    that never parks: the checks on lent cycles then fail."""
    from helpers.stacks import wait_until

    wait_until(lambda: eng._global.caller_runs._parked, timeout=30, interval=0.001)
    return eng


def _stopped(eng):
    """Wait until the engine has stopped (up to 30 s); return whether it still runs."""
    from helpers.stacks import wait_until

    wait_until(lambda: not eng.running, timeout=30)
    return eng.running


def _lent_checks(rank, size):
    import torch
    from helpers.engine_comm import start_engine

    eng = start_engine(rank, size)
    out = {}
    # 1. out of place: every step's result is its own tensor (the staging buffer is reused)
    results = [eng.synchronize(_submit(_parked(eng), torch.full((5,), float(rank + 10 * step)), "w"))
               for step in range(15)]
    out["values_ok"] = all(r.tolist() == [float(1 + 20 * step)] * 5 for step, r in enumerate(results))
    stats = eng.stats()
    out["planned"], out["lent"] = stats["planned_cycles"], stats["lent_cycles"]
    # 2. in place, a 2-D tensor, through the same path
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1)
    for _ in range(8):
        x.copy_(torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1))
        same = eng.synchronize(_submit(_parked(eng), x, "inplace", in_place=True))
    out["in_place_is_input"] = same is x
    out["in_place"] = x.tolist()
    out["lent_in_place"] = eng.stats()["lent_cycles"] - out["lent"]
    # 3. rank 1 leaves the plan (another name first) while rank 0's caller runs it: nothing
    #    completes twice, the plan is left on both ranks, both names complete right
    for _ in range(6):
        eng.synchronize(_submit(eng, torch.full((3,), 1.0), "p"))
    before = eng.stats()
    if rank == 0:
        p = eng.synchronize(_submit(_parked(eng), torch.full((3,), 1.0), "p"))
        other = eng.synchronize(_submit(eng, torch.full((2,), 5.0), "other"))
    else:
        first = _submit(eng, torch.full((2,), 7.0), "other", waited=False)
        time.sleep(0.3)  # rank 0's caller is inside the planned collective by now
        p = eng.synchronize(_submit(eng, torch.full((3,), 2.0), "p"))
        other = eng.synchronize(first)
    out["deviation"] = (p.tolist(), other.tolist())
    after = eng.stats()
    out["deviation_lent"] = after["lent_cycles"] - before["lent_cycles"]
    out["deviation_negotiated"] = after["negotiations"] - before["negotiations"]
    eng.shutdown()
    return out


def test_waiting_caller_runs_the_plan_with_right_values():
    results = run_ranks(_lent_checks, 2, timeout=120)
    for res in results:
        assert res["values_ok"], res
        # 15 steps, the first few negotiated; every planned one ran on the (waiting) caller
        assert res["planned"] >= 8 and res["lent"] >= res["planned"] - 1, res
        assert res["in_place_is_input"] and res["in_place"] == [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]
        assert res["lent_in_place"] >= 3, res
        assert res["deviation"] == ([3.0] * 3, [12.0, 12.0])
        assert res["deviation_negotiated"] >= 1, res  # the plan was left, then negotiated
    assert results[0]["deviation_lent"] == 1  # rank 0's caller ran the step rank 1 left


def _planned_engine(rank, size):
    """An engine that has run 12 steps of "w" (planned, lent to the caller) and the count of
    lent cycles so far. A long idle tick (a quarter of the collective timeout): a failure must
    come from the caller's collective, not from the controller thread's next idle negotiation."""
    import torch
    from helpers.engine_comm import start_engine

    eng = start_engine(rank, size, idle_interval=30.0, stall_check_disable=True)
    for _ in range(12):  # (_parked: on a loaded machine the thread may not be parked yet)
        eng.synchronize(_submit(_parked(eng), torch.ones(4), "w"))
    return eng, eng.stats()["lent_cycles"]


def _peer_dies(rank, size):
    import torch

    from accord.errors import RankFailedError

    eng, lent = _planned_engine(rank, size)
    if rank == 1:
        return {"left": True, "lent": lent}  # the process exits: its sockets close
    try:
        eng.synchronize(_submit(_parked(eng), torch.ones(4), "w"))
        error = "no error"
    except RankFailedError as exc:
        error = str(exc)
    out = {"error": error, "lent_attempt": eng.stats()["lent_cycles"] - lent, "lent": lent}
    out["running"] = _stopped(eng)
    try:
        eng.synchronize(_submit(eng, torch.ones(4), "after"))
        out["after"] = "accepted"
    except RankFailedError as exc:
        out["after"] = f"RankFailedError: {str(exc).splitlines()[0]}"
    return out


def test_peer_dying_under_a_collective_run_by_the_caller_fails_the_caller():
    results = run_ranks(_peer_dies, 2, timeout=90, env={"ACCORD_COLLECTIVE_TIMEOUT": "40"})
    res = results[0]
    assert results[1]["lent"] >= 2 and res["lent"] >= 2, results
    assert res["lent_attempt"] == 1, res  # the failing collective ran on the caller's thread
    assert res["error"].startswith("a collective failed on rank 0 of 2"), res
    assert "HINT:" in res["error"]
    # a closed peer fails Gloo at once, not at the 40 s collective timeout
    assert peer_gone(res["error"]), res
    assert res["running"] is False
    assert res["after"].startswith("RankFailedError: the accord engine stopped after an earlier error"), res


def _local_failure(rank, size):
    import torch

    from accord.errors import RankFailedError

    # A failure of the caller's collective that the controller thread would not meet again by
    # itself: rank 0's data collective raises once, before any data moves, on the caller's thread.
    # Only the hand-off of that failure to the thread stops rank 0's engine; without it the
    # thread would run the plan's collective again, with rank 1 waiting in it, and succeed.
    eng, lent = _planned_engine(rank, size)
    if rank == 1:
        try:
            value = eng.synchronize(_submit(eng, torch.ones(4), "w")).tolist()
        except RankFailedError as exc:
            value = f"RankFailedError: {str(exc).splitlines()[0]}"
        return {"lent": lent, "value": value}
    comm = eng.sets.communicator(0, "cpu")
    plain = comm.allreduce

    def fails_once(tensor, op):
        comm.allreduce = plain
        raise RuntimeError("injected: the link reset under this rank's collective")

    comm.allreduce = fails_once
    try:
        value = eng.synchronize(_submit(_parked(eng), torch.ones(4), "w")).tolist()
    except RankFailedError as exc:
        value = f"RankFailedError: {exc}"
    out = {"lent": lent, "value": value, "lent_attempt": eng.stats()["lent_cycles"] - lent}
    out["running"] = _stopped(eng)
    return out  # the process exits: rank 1's collective fails on the closed sockets


def test_a_failure_of_the_callers_collective_stops_the_engine_not_only_the_call():
    results = run_ranks(_local_failure, 2, timeout=90, env={"ACCORD_COLLECTIVE_TIMEOUT": "40"})
    res = results[0]
    assert res["lent"] >= 2 and res["lent_attempt"] == 1, res  # it ran on the caller's thread
    assert str(res["value"]).startswith("RankFailedError: a collective failed on rank 0 of 2"), res
    assert "injected: the link reset" in res["value"], res
    assert res["running"] is False, res
    # rank 1 was inside the same collective: it fails when rank 0 goes, it does not complete
    assert str(results[1]["value"]).startswith("RankFailedError"), results[1]


def _async_then_wait(rank, size):
    import torch
    from helpers.engine_comm import start_engine

    eng = start_engine(rank, size)
    x = torch.zeros(6)
    values = []
    for step in range(40):
        x.fill_(float(rank + step))
        handle = _submit(eng, x, "step", in_place=True, waited=False)  # allreduce_async_, then wait
        values.append(eng.synchronize(handle).tolist())
    stats = eng.stats()
    eng.shutdown()
    return {"values": values, "planned": stats["planned_cycles"], "lent": stats["lent_cycles"]}


def test_an_async_submission_waited_at_once_is_run_by_its_caller_every_time():
    # The submission wakes the controller's thread (an async caller may never wait); the caller
    # then runs the cycle itself, and the thread, woken for nothing, parks again instead of
    # taking over the caller's next request (which made every other cycle the thread's).
    results = run_ranks(_async_then_wait, 2, timeout=90)
    for res in results:
        assert res["values"] == [[float(2 * step + 1)] * 6 for step in range(40)], res
        assert res["planned"] >= 30 and res["lent"] >= res["planned"] - 2, res
