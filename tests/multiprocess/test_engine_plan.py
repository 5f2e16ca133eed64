"""Planned cycles (accord/engine/cycle/plan.py): once every rank repeats the same step, the engine runs
it without a negotiation, the data collective carrying one control value; any rank that cannot
follow leaves the plan for every rank with nothing completed, and errors are found as always.
Two real ranks over Gloo; expected values computed from each rank's input."""
import time

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(150)


def _submit(eng, tensor, name):
    from accord.engine.request import Op, build_request

    return eng.enqueue(build_request(Op.ALLREDUCE, tensor, name))


def _plan_checks(rank, size, folder):
    import torch
    from helpers.engine_comm import start_engine
    from helpers.idle_engine import controllers
    from helpers.marks import mark, wait_marked

    from accord.errors import MismatchError

    eng = start_engine(rank, size, count_negotiation=True)
    out = {}

    def step(name="w", n=4):
        return eng.synchronize(_submit(eng, torch.full((n,), float(rank + 1)), name)).tolist()

    # 1. a repeated lone allreduce: after a few negotiated cycles, no negotiation at all
    values = [step() for _ in range(12)]
    stats = eng.stats()
    out["steady_values_ok"] = all(v == [3.0] * 4 for v in values)
    out["planned"] = stats["planned_cycles"]
    out["negotiations"] = eng._comm.calls.get("allreduce", 0)
    # 2. one rank submits a name outside the plan first: every rank leaves the plan, nothing
    #    completes twice, and both names complete with the right values
    if rank == 0:
        hs = [_submit(eng, torch.full((4,), 1.0), "w"), _submit(eng, torch.full((2,), 10.0), "other")]
    else:
        first = _submit(eng, torch.full((2,), 20.0), "other")
        time.sleep(0.3)
        hs = [_submit(eng, torch.full((4,), 2.0), "w"), first]
    out["after_deviation"] = sorted(eng.synchronize(h).tolist() for h in hs)
    # 3. back in the plan, a changed shape under the planned name: a mismatch on every rank
    for _ in range(6):
        step()
    with pytest.raises(MismatchError) as info:
        step(n=4 if rank == 0 else 5)
    out["mismatch"] = str(info.value).splitlines()[0]
    # 4. a rank that stops submitting (here for 1.5 s, longer than the idle tick) is waited for:
    #    rank 1 holds back only once rank 0 is about to submit, so rank 0 waits in its step
    for _ in range(6):
        step()
    if rank == 0:
        mark(folder, "late.0")
    else:
        out["peer_waiting"] = wait_marked(folder, "late.0", timeout=60)
        time.sleep(1.5)
    out["late"] = step()
    # 5. shutdown while planned
    for _ in range(6):
        step()
    out["planned_before_shutdown"] = eng.stats()["planned_cycles"]
    ctrls = list(controllers(eng).values())
    eng.shutdown()
    out["running"] = eng.running
    out["threads_left"] = [c.thread.name for c in ctrls if c.thread.is_alive()]
    out["stop_errors"] = [repr(c.stop_error) for c in ctrls if c.stop_error is not None]
    return out


def test_planned_cycles_skip_negotiation_and_leave_together(tmp_path):
    results = run_ranks(_plan_checks, 2, str(tmp_path), timeout=120)
    for _rank, res in enumerate(results):
        assert res["steady_values_ok"]
        assert res["planned"] >= 6, res  # 12 steps: at most a few negotiated ones before the plan
        assert res["negotiations"] <= 12 - res["planned"] + 1, res
        assert res["after_deviation"] == [[3.0] * 4, [30.0, 30.0]]
        assert res["mismatch"] == "Mismatched allreduce shapes for 'w': rank 0 sent [4], rank 1 sent [5]"
        assert res["late"] == [3.0] * 4
        assert res["planned_before_shutdown"] > res["planned"]
        # Stopped while planned by the negotiated stop: a thread left in the plan's collective
        # would end only at the collective timeout, with a RankFailedError as its stop error,
        # or outlive shutdown's wait (the collective timeout + 10 s) and be listed here.
        assert not res["running"] and res["threads_left"] == [] and res["stop_errors"] == [], res
    assert results[1]["peer_waiting"]  # rank 0 was in its step while rank 1 held back; both completed
