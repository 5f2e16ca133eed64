"""Process sets progress independently: a collective on a set never waits for a
rank outside it, overlapping sets both progress, and errors, stalls, removal and shutdown stay
within a set's members. Real ranks, ``import accord.torch as hvd`` as a Horovod script does.

"Never waits for a rank outside it" is shown by order, not by timing: the rank outside holds
back until the set's members have marked their work done (helpers/marks.py), so a set that
did wait for it would never finish, and the outside rank's wait for the marks ends in False
after a generous timeout instead of hanging the job.
"""
import pytest
from helpers.idle_engine import check_idle
from helpers.ranks import run_ranks

MARK_WAIT = 45.0  # ends the wait for a mark that never comes (the test then fails)

pytestmark = pytest.mark.timeout(150)


def _disjoint(rank, size, folder):
    import torch
    from helpers.marks import mark, wait_marked

    import accord.torch as hvd

    hvd.init()
    first = hvd.add_process_set([0, 1])
    second = hvd.add_process_set([2, 3])
    mine = first if rank < 2 else second
    hvd.barrier()  # every set's controller runs on every member
    out = {}
    if rank == 0:
        # Rank 0 stalls: it submits nothing until set [2, 3] has done all its work and rank 1
        # has seen its request wait for rank 0. Only set [0, 1] may wait for it.
        out["others_first"] = wait_marked(folder, "done.2", "done.3", "checked.1", timeout=MARK_WAIT)

    def allreduce(i):
        return hvd.allreduce_async(torch.full((4,), float(rank + i)), op=hvd.Sum, process_set=mine,
                                   name=f"ar.{i}")

    handle = allreduce(0)
    if rank == 1:
        out["others_first"] = wait_marked(folder, "done.2", "done.3", timeout=MARK_WAIT)
        out["waited_for_rank_0"] = not hvd.poll(handle)  # rank 0 has submitted nothing yet
        mark(folder, "checked.1")
    value = hvd.synchronize(handle)
    for i in range(1, 20):
        value = hvd.synchronize(allreduce(i))
    hvd.barrier(process_set=mine)
    gathered = hvd.allgather(torch.tensor([[rank]]), process_set=mine)
    if rank >= 2:
        mark(folder, f"done.{rank}")
    out["value"] = value.tolist()
    out["gathered"] = gathered.flatten().tolist()
    # the global set works as before, after all of it
    out["global"] = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


def test_disjoint_sets_do_not_wait_for_a_stalled_non_member(tmp_path):
    results = run_ranks(_disjoint, 4, str(tmp_path), init="accord", timeout=120)
    for rank, res in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        assert res["value"] == [float(sum(r + 19 for r in pair))] * 4
        assert res["gathered"] == pair
        assert res["global"] == [4.0, 4.0]
    # set [2, 3] finished its 20 allreduces, barrier and allgather before rank 0 submitted
    # anything, while rank 1's first request on set [0, 1] waited for rank 0
    assert results[0]["others_first"] and results[1]["others_first"], results[:2]
    assert results[1]["waited_for_rank_0"], results[1]


def _single_member_sets(rank, size, folder):
    """Sets of one rank each: even = [0], odd = [1]; rank 0 holds back its barrier."""
    import torch
    from helpers.marks import mark, wait_marked

    import accord.torch as hvd

    hvd.init()
    even = hvd.add_process_set([0])
    odd = hvd.add_process_set([1])
    hvd.barrier()
    if rank == 0:
        # rank 1's barrier and allreduce on its own set must not need rank 0 at all
        returned_alone = wait_marked(folder, "odd.done", timeout=MARK_WAIT)
        hvd.barrier(process_set=even)
    else:
        hvd.barrier(process_set=odd)
        assert hvd.allreduce(torch.ones(3), process_set=odd).tolist() == [1.0, 1.0, 1.0]
        mark(folder, "odd.done")
        returned_alone = None
    hvd.barrier()  # a rank's shutdown stops every rank's engine (as in Horovod)
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)
    hvd.shutdown()
    return returned_alone


def test_single_member_sets_return_at_once(tmp_path):
    returned_alone = run_ranks(_single_member_sets, 2, str(tmp_path), init="accord", timeout=120)
    assert returned_alone[0] is True, "rank 1's single-member set waited for rank 0"


def _overlapping(rank, size, folder):
    """x = [0, 1] and y = [1, 2] overlap on rank 1: rank 1 serves both at once."""
    import torch
    from helpers.marks import mark, wait_marked

    import accord.torch as hvd

    hvd.init()
    x = hvd.add_process_set([0, 1])
    y = hvd.add_process_set([1, 2])
    hvd.barrier()
    out = {}
    if rank == 0:
        # x waits for rank 0, which holds back until ranks 1 and 2 are done with y: y must not
        # wait for x
        out["y_first"] = wait_marked(folder, "y.1", "y.2", timeout=MARK_WAIT)
        out["x"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=x, name="x.sum").item()
    elif rank == 1:
        hx = hvd.allreduce_async(torch.tensor([10.0]), op=hvd.Sum, process_set=x, name="x.sum")
        ys = [hvd.allreduce(torch.tensor([float(i)]), op=hvd.Sum, process_set=y, name=f"y.{i}").item()
              for i in range(10)]
        out["x_done_early"] = hvd.poll(hx)
        mark(folder, "y.1")
        out["y"] = ys
        out["x"] = hvd.synchronize(hx).item()
    else:
        ys = [hvd.allreduce(torch.tensor([float(i)]), op=hvd.Sum, process_set=y, name=f"y.{i}").item()
              for i in range(10)]
        mark(folder, "y.2")
        out["y"] = ys
    # unnamed collectives on both sets and the global one, submitted in different orders
    hs = []
    if rank in (0, 1):
        hs.append(("x", hvd.allgather_async(torch.tensor([rank]), process_set=x)))
    if rank in (1, 2):
        hs.append(("y", hvd.allgather_async(torch.tensor([rank]), process_set=y)))
    hs.append(("g", hvd.allgather_async(torch.tensor([rank]))))
    if rank == 1:
        hs.reverse()
    out["gathers"] = {k: hvd.synchronize(h).tolist() for k, h in hs}
    hvd.remove_process_set(y)
    hvd.remove_process_set(x)
    hvd.shutdown()
    return out


def test_overlapping_sets_progress_independently(tmp_path):
    r0, r1, r2 = run_ranks(_overlapping, 3, str(tmp_path), init="accord", timeout=120)
    assert r0["x"] == r1["x"] == 11.0
    assert r1["y"] == r2["y"] == [2.0 * i for i in range(10)]
    assert r0["y_first"] is True, "y waited for rank 0, which is not in y"
    assert r1["x_done_early"] is False
    assert r0["gathers"] == {"x": [0, 1], "g": [0, 1, 2]}
    assert r1["gathers"] == {"x": [0, 1], "y": [1, 2], "g": [0, 1, 2]}
    assert r2["gathers"] == {"y": [1, 2], "g": [0, 1, 2]}


def _errors_within_a_set(rank, size):
    """Mismatches raise on every member; a set's stall shuts down only after its own ranks;
    shutdown fails requests pending in several sets on every member."""
    import time

    import torch
    from helpers.idle_engine import controllers

    import accord.torch as hvd
    from accord.engine import session
    from accord.errors import MismatchError, ShutdownError

    hvd.init()
    a = hvd.add_process_set([0, 1, 2])
    b = hvd.add_process_set([1, 2, 3])
    out = {}
    if rank in (0, 1, 2):
        with pytest.raises(MismatchError) as info:
            hvd.allreduce(torch.zeros(3 if rank != 2 else 4), process_set=a, name="bad")
        out["mismatch"] = str(info.value)
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=a, name="after").item() == 3.0
    hvd.barrier()
    # Requests that can never complete, pending in two sets at once: only ranks 1 and 2 (in
    # both sets) submit; ranks 0 and 3 shut down. Every pending handle fails on every rank.
    pending = []
    if rank in (1, 2):
        # the session's handles: hvd's integer handles are forgotten at shutdown, as in Horovod
        pending.append(session.submit("allreduce", torch.ones(1), "never.a", process_set_id=a.process_set_id))
        pending.append(session.submit("allreduce", torch.ones(1), "never.b", process_set_id=b.process_set_id))
        time.sleep(0.5)  # (the controllers take them meanwhile; taken or not, they must fail)
    ctrls = list(controllers(session.engine()).values())
    hvd.shutdown()
    out["threads_left"] = [c.thread.name for c in ctrls if c.thread.is_alive()]
    out["stop_errors"] = [repr(c.stop_error) for c in ctrls if c.stop_error is not None]
    errors = []
    for h in pending:
        with pytest.raises(ShutdownError) as info:
            session.synchronize(h)
        errors.append(type(info.value).__name__)
    out["pending_errors"] = errors
    return out


def test_errors_and_shutdown_stay_correct_with_several_sets():
    results = run_ranks(_errors_within_a_set, 4, init="accord", timeout=90)
    for rank in (0, 1, 2):
        m = results[rank]["mismatch"]
        assert m.startswith("Mismatched allreduce shapes for 'allreduce.bad@ps1': "
                            "ranks 0, 1 sent [3], rank 2 sent [4]"), m
    for rank in (1, 2):
        assert results[rank]["pending_errors"] == ["ShutdownError", "ShutdownError"]
    for res in results:
        # Every set's thread stopped on every rank, by the negotiated stop: a thread still in a
        # collective would end only at the collective timeout, with a RankFailedError as its
        # stop error (and the pending requests failing with it, not with a ShutdownError), or
        # outlive shutdown's wait and be listed here.
        assert res["threads_left"] == [], res
        assert res["stop_errors"] == [], res


def _stall_in_a_set(rank, size):
    import logging
    import re

    import torch
    from helpers.stacks import wait_until

    from accord.engine import session
    from accord.errors import StallError

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("accord.engine").addHandler(handler)
    session.init()
    s = session.add_process_set([0, 1])
    out = {}
    try:
        if rank == 0:
            h = session.submit("allreduce", torch.ones(2), "only.rank0", process_set_id=s)
            with pytest.raises(StallError) as info:
                session.synchronize(h)
            out["error"] = str(info.value)
            age = re.search(r"'only\.rank0@ps1': submitted by ranks \[0\] \((\d+\.\d) s\)", out["error"])
            out["age"] = float(age.group(1)) if age else None
        else:  # the stall stops every rank's engine (the bound ends a wait for a stop that never comes)
            out["stopped"] = wait_until(lambda: not session.engine().running, timeout=40)
        # read when the stop was seen: a warning logged by then came before the stop
        out["warnings"] = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    finally:
        logging.getLogger("accord.engine").removeHandler(handler)
        session.shutdown()
    return out


def test_stall_in_a_set_is_reported_by_its_members_and_stops_the_job():
    env = {"ACCORD_STALL_CHECK_TIME_SECONDS": "0.5", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    results = run_ranks(_stall_in_a_set, 3, init="accord", timeout=60, env=env)
    for rank in (0, 1):
        w = results[rank]["warnings"]
        assert w and "'only.rank0@ps1': submitted by ranks [0]" in w[0] and "missing on ranks [1]" in w[0], w
    assert results[1]["stopped"] and results[2]["stopped"], results
    assert not results[2]["warnings"]  # rank 2 is not in the set: nothing stalled there
    assert "Stall shutdown: names waited more than 2.0 s" in results[0]["error"], results[0]
    # the set stopped once the name's exchanged age reached the shutdown time, not at the warning
    assert results[0]["age"] is not None and results[0]["age"] >= 2.0, results[0]


def _idle_with_sets(rank, size):
    from helpers.idle_engine import watch_idle

    from accord.engine import session

    session.init()
    session.add_process_set([0, 1])
    session.add_process_set([1, 2])
    # every rank has added both sets (and started their controllers) before the window opens
    session.synchronize(session.submit("barrier", None, None))
    idle = watch_idle(session.engine(), seconds=3.0)
    session.shutdown()
    return idle


def test_idle_engine_with_sets_parks_every_thread_between_ticks():
    """Each of a rank's controllers (the global set's and one per extra set it is in) sleeps
    on its condition and wakes for its idle tick only; the CPU share this comes to is measured
    by benchmarks/idle_engine_cpu.py."""
    idles = run_ranks(_idle_with_sets, 3, init="accord", timeout=60, env={"ACCORD_CPU_BACKEND": "auto"})
    for rank, idle in enumerate(idles):
        check_idle(idle, set_ids={0: [0, 1], 1: [0, 1, 2], 2: [0, 2]}[rank])
