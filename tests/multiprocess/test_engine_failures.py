"""A rank that dies (SIGKILL) or hangs (SIGSTOP) while the others wait: the survivors raise
RankFailedError within the collective timeout, never hang."""
import pytest
from helpers.dying_ranks import run_ranks_with_deaths

pytestmark = pytest.mark.timeout(60)


def _die_mid_run(rank, size, how):
    import os
    import signal
    import time

    import torch
    from helpers.engine_comm import start_engine

    from accord.engine.request import Op, build_request
    from accord.errors import RankFailedError

    eng = start_engine(rank, size)
    ok = eng.synchronize(eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "before")))
    assert ok.tolist() == [3.0, 3.0, 3.0]
    if rank == size - 1:
        os.kill(os.getpid(), getattr(signal, how))
    start = time.monotonic()
    handle = eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "after"))
    with pytest.raises(RankFailedError) as info:
        eng.synchronize(handle)
    elapsed = time.monotonic() - start
    # the engine stays stopped: later submissions fail the same way, at once
    with pytest.raises(RankFailedError, match="stopped after an earlier error"):
        eng.enqueue(build_request(Op.ALLREDUCE, torch.ones(3), "later"))
    eng.shutdown()
    return {"elapsed": elapsed, "message": str(info.value), "cause": repr(info.value.__cause__)}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_survivors_raise_rank_failed_within_the_timeout(how):
    env = {"ACCORD_COLLECTIVE_TIMEOUT": "3"}
    results = run_ranks_with_deaths(_die_mid_run, 3, {2}, how, timeout=45, env=env)
    assert sorted(results) == [0, 1]
    for rank, res in results.items():
        assert res["elapsed"] < 10, f"rank {rank} took {res['elapsed']:.1f}s to notice the death"
        assert f"a collective failed on rank {rank} of 3" in res["message"]
        assert "HINT:" in res["message"] and "ACCORD_COLLECTIVE_TIMEOUT=3s" in res["message"]
