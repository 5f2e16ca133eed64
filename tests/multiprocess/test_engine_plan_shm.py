"""Planned cycles on the shm backend, whose data collective carries each rank's vote in the op's
descriptor (ShmCommunicator.allreduce_voted) instead of a control element appended to a
staging copy: a plain lone request is reduced straight from its tensor into its output. What
must hold: right values in place and out of place, a rank that leaves the plan leaves nothing
written (an in-place tensor is reduced exactly once), ranks that take different routes to the
wire (a non-contiguous tensor, a prescale) still agree, and a changed shape under the planned
name raises MismatchError on every rank. Two real ranks; expected values computed from each
rank's input."""
import time

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(150)


def _shm_engine(rank, size):
    """An Engine whose set 0 moves its data over shm (negotiation over gloo, as in tests)."""
    from helpers import groups
    from helpers.engine_comm import make_comm

    from accord.comm import get_backend
    from accord.engine.engine import Engine
    from accord.engine.sets import ProcessSetRegistry
    from accord.engine.settings import EngineSettings

    registry = ProcessSetRegistry(size)
    registry.set_communicator(0, "cpu", groups.create(get_backend("shm"), range(size)))
    engine = Engine(rank, size, make_comm(range(size)), registry, EngineSettings.from_config())
    engine.start()
    return engine


def _submit(eng, tensor, name, in_place=False, prescale=1.0, waited=True):
    from accord.engine.request import Op, build_request

    return eng.enqueue_many([build_request(Op.ALLREDUCE, tensor, name, in_place=in_place,
                                           prescale_factor=prescale)], waited)[0]


def _checks(rank, size):
    import torch

    from accord.errors import MismatchError

    eng = _shm_engine(rank, size)
    assert eng.sets.communicator(0, "cpu").backend_name == "shm"
    out = {}
    # 1. out of place: fresh results, inputs untouched
    inputs = [torch.full((5,), float(rank + 10 * step)) for step in range(12)]
    results = [eng.synchronize(_submit(eng, x, "w")) for x in inputs]
    out["values_ok"] = all(r.tolist() == [float(1 + 20 * step)] * 5 for step, r in enumerate(results))
    out["inputs_untouched"] = all(x.tolist() == [float(rank + 10 * s)] * 5 for s, x in enumerate(inputs))
    out["distinct_results"] = len({r.data_ptr() for r in results}) == len(results)
    out["planned"] = eng.stats()["planned_cycles"]
    out["lent"] = eng.stats()["lent_cycles"]
    out["grad_mode_kept"] = torch.is_grad_enabled()  # the caller ran cycles with autograd off, then back on
    leaf = torch.full((3,), float(rank + 1), requires_grad=True)
    for _ in range(5):  # in place into a leaf that requires grad: refused with autograd on, fine off
        with torch.no_grad():
            leaf.fill_(float(rank + 1))
        eng.synchronize(_submit(eng, leaf, "leaf", in_place=True))
    out["leaf_ok"] = leaf.detach().tolist() == [3.0] * 3 and torch.is_grad_enabled()
    # 2. in place, 2-D
    x = torch.empty(2, 3, dtype=torch.float64)
    for _ in range(8):
        x.copy_(torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1))
        same = eng.synchronize(_submit(eng, x, "inplace", in_place=True))
    out["in_place"] = same is x and x.tolist() == (torch.arange(6, dtype=torch.float64).reshape(2, 3) * 3).tolist()
    # 3. a prescale (through the fusion buffer) and mixed routes: rank 0's tensor is not
    #    contiguous (packed), rank 1's is (straight from the tensor)
    pre = [eng.synchronize(_submit(eng, torch.full((3,), float(rank + 1)), "pre", prescale=2.0)).tolist()
           for _ in range(8)]
    out["prescale_ok"] = all(p == [6.0] * 3 for p in pre)
    mixed = []
    for _ in range(8):
        t = torch.full((4, 2), float(rank + 1)).t() if rank == 0 else torch.full((2, 4), float(rank + 1))
        mixed.append(eng.synchronize(_submit(eng, t, "mixed")).tolist())
    out["mixed_ok"] = all(m == [[3.0] * 4] * 2 for m in mixed)
    # 4. back to one planned name, then rank 1 leaves the plan (another name first) while rank 0
    #    follows it in place: the voted collective writes nothing, the tensor is reduced once
    for _ in range(6):
        eng.synchronize(_submit(eng, torch.ones(4), "v", in_place=True))
    planned_before = eng.stats()["planned_cycles"]
    mine = torch.full((4,), float(rank + 1))
    if rank == 0:
        hs = [_submit(eng, mine, "v", in_place=True, waited=False), _submit(eng, torch.full((2,), 10.0), "other")]
    else:
        first = _submit(eng, torch.full((2,), 20.0), "other", waited=False)
        time.sleep(0.3)
        hs = [_submit(eng, mine, "v", in_place=True, waited=False), first]
    out["after_deviation"] = sorted(eng.synchronize(h).tolist() for h in hs)
    out["reduced_once"] = mine.tolist() == [3.0] * 4
    out["planned_before_deviation"] = planned_before
    # 5. back in the plan, a changed shape under the planned name: a mismatch on every rank
    for _ in range(6):
        eng.synchronize(_submit(eng, torch.ones(4), "v", in_place=True))
    out["planned_again"] = eng.stats()["planned_cycles"] > planned_before
    with pytest.raises(MismatchError) as info:
        eng.synchronize(_submit(eng, torch.ones(4 if rank == 0 else 5), "v", in_place=True))
    out["mismatch"] = str(info.value).splitlines()[0]
    out["after_mismatch"] = eng.synchronize(_submit(eng, torch.ones(4), "v", in_place=True)).tolist()
    eng.shutdown()
    return out


def test_planned_cycles_on_shm_vote_beside_the_data():
    results = run_ranks(_checks, 2, timeout=120)
    for res in results:
        assert res["values_ok"] and res["inputs_untouched"] and res["distinct_results"], res
        assert res["planned"] >= 6 and res["lent"] >= 6, res
        assert res["grad_mode_kept"] and res["leaf_ok"], res
        assert res["in_place"] and res["prescale_ok"] and res["mixed_ok"], res
        assert res["planned_before_deviation"] > res["planned"], res  # "v" was planned before rank 1 left
        assert res["after_deviation"] == [[3.0] * 4, [30.0, 30.0]], res
        assert res["reduced_once"], res
        assert res["planned_again"], res
        assert res["mismatch"] == "Mismatched allreduce shapes for 'v': rank 0 sent [4], rank 1 sent [5]", res
        assert res["after_mismatch"] == [2.0] * 4, res


def _batch_checks(rank, size):
    """A repeated batch of async in-place Average allreduces with shm's own cycle settings."""
    import torch
    from helpers import groups
    from helpers.engine_comm import make_comm

    from accord.comm import get_backend
    from accord.comm.ops import ReduceOp
    from accord.engine.engine import Engine
    from accord.engine.request import Op, build_request
    from accord.engine.sets import ProcessSetRegistry
    from accord.engine.settings import EngineSettings

    registry = ProcessSetRegistry(size)
    registry.set_communicator(0, "cpu", groups.create(get_backend("shm"), range(size)))
    eng = Engine(rank, size, make_comm(range(size)), registry, EngineSettings.from_config("shm"))
    eng.start()
    sizes = [300, 1, 1500, 0, 777]  # with 4 KB slots: pieces straddle chunks

    def submit(tensors, prefix, in_place=True):
        return [eng.enqueue_many([build_request(Op.ALLREDUCE, t, f"{prefix}.{i}", in_place=in_place,
                                                reduce_op=ReduceOp.AVERAGE)])[0] for i, t in enumerate(tensors)]

    def inputs(step, r):
        return [torch.arange(n, dtype=torch.float32) * (r + 1) + step for n in sizes]

    def expected(step):  # Average over the ranks, in float64 (every value is exact in float32)
        return [(sum(inputs(step, r)[i].double() for r in range(size)) / size).tolist() for i in range(len(sizes))]

    out = {"wrong": []}
    for step in range(8):
        grads = inputs(step, rank)
        handles = submit(grads, "g")
        results = [eng.synchronize(h) for h in handles]
        if not all(res is g for res, g in zip(results, grads)) or [g.tolist() for g in grads] != expected(step):
            out["wrong"].append(f"step {step} in place")
    stats = eng.stats()
    out["planned"], out["lent"], out["allocations"] = stats["planned_cycles"], stats["lent_cycles"], \
        stats["fusion_allocations"]
    # rank 1 leaves the plan (another name first): nothing is written on rank 0, reduced once
    grads = inputs(100, rank)
    if rank == 0:
        handles = submit(grads, "g") + submit([torch.full((2,), 10.0)], "other", in_place=False)
    else:
        handles = submit([torch.full((2,), 20.0)], "other", in_place=False)
        time.sleep(0.3)
        handles = submit(grads, "g") + handles
    results = [eng.synchronize(h) for h in handles]
    if [g.tolist() for g in grads] != expected(100) or results[-1].tolist() != [15.0, 15.0]:
        out["wrong"].append("after the deviation")
    # out of place: fresh results, inputs untouched
    for step in range(6):
        grads = inputs(step, rank)
        results = [eng.synchronize(h) for h in submit(grads, "o", in_place=False)]
        if [r.tolist() for r in results] != expected(step) or [g.tolist() for g in grads] != \
                [t.tolist() for t in inputs(step, rank)]:
            out["wrong"].append(f"step {step} out of place")
    # submitted and never waited on (nor polled): the engine still runs them
    planned = eng.stats()["planned_cycles"]
    grads = inputs(7, rank)
    handles = submit(grads, "o", in_place=False)
    out["unwaited_done"] = all(h.wait(30) for h in handles)
    out["unwaited_right"] = out["unwaited_done"] and [h.result().tolist() for h in handles] == expected(7)
    out["unwaited_planned"] = eng.stats()["planned_cycles"] > planned
    eng.shutdown()
    return out


def test_a_repeated_batch_is_planned_on_shm_and_run_by_the_waiting_caller():
    """shm's cycle settings: a repeated batch runs planned, on the caller that waits, straight from
    its tensors (no fusion buffer), exactly; a rank that leaves the plan leaves nothing written;
    requests nobody waits on still run."""
    results = run_ranks(_batch_checks, 2, timeout=120, env={"ACCORD_SHM_CHUNK_BYTES": "4096"})
    for res in results:
        assert res["wrong"] == [], res
        assert res["planned"] >= 4 and res["lent"] >= 4 and res["allocations"] == 0, res
        assert res["unwaited_done"] and res["unwaited_right"] and res["unwaited_planned"], res
