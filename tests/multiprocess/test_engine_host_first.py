"""Host-first negotiation: with a hierarchical global communicator, the engine's
per-cycle negotiation sums within each host, then across hosts; mismatches still raise on every
rank. 4 ranks as 2 fake hosts x 2 (ACCORD_HOSTNAME), expected values computed independently."""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(150)

HOSTS = ["hostA", "hostA", "hostB", "hostB"]


def _env(rank):
    return {"ACCORD_HOSTNAME": HOSTS[rank], "ACCORD_LOCAL_RANK": str(rank % 2), "ACCORD_LOCAL_SIZE": "2",
            "ACCORD_CROSS_RANK": str(rank // 2), "ACCORD_CROSS_SIZE": "2"}


def _checks(rank, size):
    import torch

    from accord.engine import session
    from accord.errors import MismatchError

    session.init()
    out = {"negotiation": type(session.engine()._comm).__name__}
    sums = []
    for step in range(5):  # steady state: cached names, one host-first negotiation a cycle
        hs = [session.submit("allreduce", torch.full((3,), float(rank * 10 + k + step)), f"w.{k}")
              for k in range(4)]
        sums.append([session.synchronize(h).tolist() for h in hs])
    out["sums"] = sums
    with pytest.raises(MismatchError) as info:
        session.synchronize(session.submit("allreduce", torch.zeros(2 + (rank == 3)), "bad"))
    out["mismatch"] = str(info.value).splitlines()[0]
    out["after"] = session.synchronize(session.submit("allgather", torch.tensor([rank]), "ag")).tolist()
    out["stats"] = session.engine().stats()
    session.shutdown()
    return out


def test_negotiation_goes_host_first_and_keeps_errors_on_every_rank():
    results = run_ranks(_checks, 4, init="accord", per_rank_env=_env, timeout=120,
                        env={"ACCORD_HIERARCHICAL_ALLREDUCE": "1", "ACCORD_CPU_BACKEND": "auto"})
    for _rank, res in enumerate(results):
        assert res["negotiation"] == "HostFirstNegotiation"
        for step, got in enumerate(res["sums"]):
            assert got == [[float(sum(r * 10 + k + step for r in range(4)))] * 3 for k in range(4)]
        assert res["mismatch"] == "Mismatched allreduce shapes for 'bad': ranks 0, 1, 2 sent [2], rank 3 sent [3]"
        assert res["after"] == [0, 1, 2, 3]
        stats = res["stats"]  # a negotiation a cycle, except planned cycles (engine/cycle/plan.py)
        assert stats["negotiations"] + stats["planned_cycles"] >= stats["cycles"] > 0
