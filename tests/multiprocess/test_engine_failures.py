"""A rank that dies (SIGKILL) or hangs (SIGSTOP) while the others wait: the survivors raise
RankFailedError, never hang: a dead rank is noticed from its closed connections, a stopped one
at the collective timeout (the error's cause says which; a survivor that never raised would
hang the job until the harness's timeout)."""
import pytest
from helpers.dying_ranks import peer_gone, run_ranks_with_deaths

pytestmark = pytest.mark.timeout(60)


def _die_mid_run(rank, size, how):
    import os
    import signal

    import torch
    from helpers.engine_comm import start_engine

    from accord.engine.request import Op, build_request
    from accord.errors import RankFailedError

    eng = start_engine(rank, size)
    ok = eng.synchronize(eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "before")))
    assert ok.tolist() == [3.0, 3.0, 3.0]
    if rank == size - 1:
        os.kill(os.getpid(), getattr(signal, how))
    handle = eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "after"))
    with pytest.raises(RankFailedError) as info:
        eng.synchronize(handle)
    # the engine stays stopped: later submissions fail the same way, at once
    with pytest.raises(RankFailedError, match="stopped after an earlier error"):
        eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "later"))
    eng.shutdown()
    return {"message": str(info.value), "cause": repr(info.value.__cause__)}


# A dead rank must be noticed long before the timeout: 90 s there (a wait that ran it out would
# say "Timed out"); a stopped one only at the timeout, 3 s.
@pytest.mark.parametrize("how, limit", [("SIGKILL", "90"), ("SIGSTOP", "3")])
def test_survivors_raise_rank_failed_within_the_timeout(how, limit):
    results = run_ranks_with_deaths(_die_mid_run, 3, {2}, how, timeout=45, env={"ACCORD_COLLECTIVE_TIMEOUT": limit})
    assert sorted(results) == [0, 1]
    for rank, res in results.items():
        assert f"a collective failed on rank {rank} of 3" in res["message"]
        assert "HINT:" in res["message"] and f"ACCORD_COLLECTIVE_TIMEOUT={limit}s" in res["message"]
    if how == "SIGKILL":  # noticed from the dead rank's closed connections
        assert all(peer_gone(res["message"]) for res in results.values()), results
    else:  # a stopped rank keeps its connections: the timeout ends a survivor's wait (the
        # other may then see that survivor's connections close first)
        assert any("Timed out waiting 3000ms" in res["message"] for res in results.values()), results
