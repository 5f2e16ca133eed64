"""hvd.join() on real ranks: ranks with fewer steps join early and keep serving the others.

Like Horovod's join tests, ranks run different numbers of steps. Every rank regenerates every
rank's input from (seed, rank), so the expected values (joined ranks contribute zeros; Average
divides by the full size) are computed independently with numpy; the optimizer check replays
the uneven training in one process with plain torch.
"""
import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)


def _data(seed, rank, shape, dtype="float64"):
    # flat entropy: numpy >= 2.5 (Python >= 3.12) refuses nested seed sequences
    parts = list(seed) if isinstance(seed, tuple) else [seed]
    rng = np.random.default_rng([*parts, rank])
    return rng.integers(-50, 50, size=shape).astype(dtype)


def _eq(actual, expected, tol=0.0):
    actual = actual.detach().numpy() if hasattr(actual, "detach") else np.asarray(actual)
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, dtype=np.float64),
                               rtol=tol, atol=0)


def _join_checks(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    dtypes = ["int32", "int64", "float32", "float64"]
    results = {}

    # 1. Allreduce, fused and cached: rank r runs r + 1 steps of the same names, then joins.
    #    Average and Sum over the ranks still stepping; Average divides by the full size.
    for dtype in dtypes:
        for step in range(rank + 1):
            seed = (dtypes.index(dtype), step)
            mine = [torch.from_numpy(_data(seed + (k,), rank, shape, dtype))
                    for k, shape in enumerate([(5,), (3, 4)])]
            hs = [hvd.allreduce_async(t, name=f"{dtype}.avg.{k}", op=hvd.Average) for k, t in enumerate(mine)]
            hs += [hvd.allreduce_async(t, name=f"{dtype}.sum.{k}", op=hvd.Sum) for k, t in enumerate(mine)]
            outs = [hvd.synchronize(h) for h in hs]
            active = [r for r in range(size) if r >= step]  # ranks that still run this step
            for k, shape in enumerate([(5,), (3, 4)]):
                total = sum(_data(seed + (k,), r, shape, dtype) for r in active)
                avg = total / size if dtype.startswith("float") else np.trunc(total / size)
                _eq(outs[k], avg, {"float32": 1e-6, "float64": 1e-15}.get(dtype, 0.0))  # x * (1/n) vs x / n
                _eq(outs[2 + k], total)
                assert outs[k].dtype == getattr(torch, dtype)
        results[dtype] = hvd.join()  # the last rank (size - 1) joins last

    # 2. A joined rank contributes zeros to every reduce op, as in Horovod (Max of negatives: 0).
    if rank == 0:
        results["max"] = hvd.join()
    else:
        neg = -np.abs(_data(7, rank, (4,))) - 1
        _eq(hvd.allreduce(torch.from_numpy(neg), name="max", op=hvd.Max), np.zeros(4))
        results["max"] = hvd.join()

    # 3. Allgather, alltoall, reducescatter, broadcast and barrier with rank 0 joined:
    #    zero rows / zeros from the joined rank; it receives (and drops) what is sent to it.
    if rank == 0:
        # a broadcast from rank 0 after it joined is an error on rank 0 too: its join() raises
        with pytest.raises(hvd.HorovodInternalError, match="root rank 0 has joined"):
            hvd.join()
        results["others"] = hvd.join()
    else:
        active = list(range(1, size))
        rows = lambda r: r + 1  # noqa: E731
        got = hvd.allgather(torch.from_numpy(_data(8, rank, (rows(rank), 3))), name="ag")
        _eq(got, np.concatenate([_data(8, r, (rows(r), 3)) for r in active]))
        got = hvd.grouped_allgather([torch.from_numpy(_data(9, rank, (rows(rank),)))], name="gag")
        _eq(got[0], np.concatenate([_data(9, r, (rows(r),)) for r in active]))

        splits = [d + 1 for d in range(size)]  # d + 1 rows to rank d (the joined rank 0 too)
        out, received = hvd.alltoall(torch.from_numpy(_data(10, rank, (sum(splits), 2))),
                                     splits=splits, name="a2a")
        starts = np.cumsum([0] + splits)
        _eq(out, np.concatenate([_data(10, r, (sum(splits), 2))[starts[rank]:starts[rank + 1]]
                                 for r in active]))
        _eq(received, [0] + [rank + 1] * (size - 1))

        total = sum(_data(11, r, (2 * size + 1, 2)) for r in active)
        counts = [(2 * size + 1) // size + (1 if i < (2 * size + 1) % size else 0) for i in range(size)]
        lo = sum(counts[:rank])
        got = hvd.reducescatter(torch.from_numpy(_data(11, rank, (2 * size + 1, 2))), name="rs",
                                op=hvd.Average)
        _eq(got, total[lo:lo + counts[rank]] / size, 1e-15)

        got = hvd.broadcast(torch.from_numpy(_data(12, rank, (3,))), root_rank=1, name="bc")
        _eq(got, _data(12, 1, (3,)))
        # the joined rank cannot be a broadcast root: an error on every rank that submitted it
        with pytest.raises(hvd.HorovodInternalError, match="root rank 0 has joined"):
            hvd.broadcast(torch.zeros(3, dtype=torch.float64), root_rank=0, name="bc0")
        hvd.barrier()
        results["others"] = hvd.join()

    # 4. A rank that joins before the others have even started still serves several steps.
    if rank == size - 1:
        results["early"] = hvd.join()
    else:
        for step in range(3):
            got = hvd.allreduce(torch.full((2,), float(rank + step)), name="early", op=hvd.Sum)
            _eq(got, np.full(2, sum(r + step for r in range(size - 1))))
        results["early"] = hvd.join()

    # 5. Process sets (3 ranks): a joined member of a set serves that set's collectives too.
    if size > 2:
        pair = hvd.add_process_set([0, 1])
        if rank == 0:
            results["set"] = hvd.join()
        else:
            if rank == 1:
                got = hvd.allreduce(torch.full((3,), 6.0), name="pair", op=hvd.Average,
                                    process_set=pair)
                _eq(got, np.full(3, 3.0))  # rank 0 contributes zeros; the set has 2 ranks
            got = hvd.allreduce(torch.full((2,), float(rank)), name="world", op=hvd.Sum)
            _eq(got, np.full(2, sum(range(1, size))))
            results["set"] = hvd.join()
        hvd.remove_process_set(pair)

    # 6. A rank waiting in join() when the others shut down gets an error, not a hang.
    if rank == 0:
        with pytest.raises(hvd.HorovodInternalError, match="shut down"):
            hvd.join()
    hvd.shutdown()
    return results


@pytest.mark.parametrize("nprocs", [2, 3])
def test_join_collectives_with_uneven_steps(nprocs):
    results = run_ranks(_join_checks, nprocs, init="accord", timeout=50)
    assert results[0] == results[-1]  # join returns the same rank everywhere
    for r in results:
        for dtype in ("int32", "int64", "float32", "float64"):
            assert r[dtype] == nprocs - 1  # the rank with the most steps joined last
        assert r["max"] == nprocs - 1 if nprocs == 2 else r["max"] in (1, 2)
        assert r["others"] in range(1, nprocs) and r["early"] in range(nprocs - 1)
        assert r.get("set", 1) in range(1, nprocs)
    assert len({tuple(sorted(r.items())) for r in results}) == 1


def _alone(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    first = hvd.join()
    got = hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum)  # the engine goes on normally
    second = hvd.join()
    hvd.shutdown()
    return first, second, got.tolist()


def test_join_on_one_rank_returns_at_once():
    assert run_ranks(_alone, 1, init="accord", timeout=30) == [(0, 0, [1.0, 1.0])]


# --- DistributedOptimizer with uneven numbers of batches ---------------------------------------

def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)).double()


def _batch(step, rank):
    import torch

    rng = np.random.default_rng([step, rank, 99])
    return torch.from_numpy(rng.normal(size=(3, 4))), torch.from_numpy(rng.normal(size=(3, 2)))


def _batches(rank):
    return 2 + 2 * rank  # rank 0: 2 batches, rank 1: 4, rank 2: 6


def _reference(size):
    """One process: at each step, gradients of the ranks still training, summed, / size."""
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    for step in range(_batches(size - 1)):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(size):
            if step < _batches(r):
                model.zero_grad()
                x, y = _batch(step, r)
                torch.nn.functional.mse_loss(model(x), y).backward()
                for g, p in zip(grads, model.parameters()):
                    g += p.grad
        for g, p in zip(grads, model.parameters()):
            p.grad = g / size
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def _train_then_join(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(_batches(rank)):
        opt.zero_grad()
        x, y = _batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    last = hvd.join()

    # Engine hardening: tensors that require grad go through fusion, in place and compressed.
    from accord.engine import session

    leaves = [torch.full((3,), float(rank + k), requires_grad=True) for k in range(3)]
    hs = [session.submit("allreduce", t, f"grad.{k}", reduce_op=hvd.Sum) for k, t in enumerate(leaves)]
    hs.append(session.submit("allreduce", leaves[0], "grad.fp16", reduce_op=hvd.Sum,
                             compression=hvd.Compression.fp16))
    hs.append(session.submit("allreduce", leaves[1] * 2, "grad.inplace", in_place=True,
                             reduce_op=hvd.Sum))
    sums = [session.synchronize(h).detach().numpy().tolist() for h in hs]
    hvd.shutdown()
    return last, [p.detach().numpy().copy() for p in model.parameters()], sums


@pytest.mark.parametrize("nprocs", [2, 3])
def test_distributed_optimizer_with_uneven_batches_then_join(nprocs):
    results = run_ranks(_train_then_join, nprocs, init="accord", timeout=50)
    expected = _reference(nprocs)
    last_rank = nprocs - 1
    for _rank, (last, _params, sums) in enumerate(results):
        assert last == last_rank
        tri = nprocs * (nprocs - 1) / 2
        assert sums[:3] == [[tri + nprocs * k] * 3 for k in range(3)]
        assert sums[3] == [tri] * 3 and sums[4] == [2 * (tri + nprocs)] * 3
    # the rank that trained longest holds the model trained on every step
    for got, want in zip(results[last_rank][1], expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# --- the pure parts: decisions with joined ranks, stand-ins, who joined last --------------------

def _sig(op="allreduce", shape=(2, 3), root=-1, dtype="float32", wire="float16", pset=0):
    from accord.engine.request import Signature

    return Signature(op, dtype, wire, shape, "cpu", 0 if op == "allreduce" else -1, root, 1.0,
                     0.5, pset)


def test_decide_with_joined_ranks_reports_signatures_and_refuses_joined_roots():
    from accord.engine.negotiation.negotiate import Exchange, ResponseCache, decide

    b = (_sig("broadcast", (3,), root=0), 0.0)
    per_rank = [{}, {"a": (_sig(), 0.0), "b": b, "c": (_sig("broadcast", (3,), root=1), 0.0)},
                {"a": (_sig(), 0.0), "b": b}]
    d = decide(Exchange(per_rank, [{}, {}, {}], [0]), ResponseCache(), 1)
    assert d.ready == ["a"]  # c waits for rank 2; b's root has joined without submitting it
    assert [p.name for p in d.partial] == ["c"]
    assert d.agreed["a"] == (_sig(), (0, 1, 2))
    assert "root rank 0 has joined" in d.errors["b"] and "HINT:" in d.errors["b"]


def test_stand_ins_match_the_agreed_signature():
    import torch

    from accord.engine.negotiation.join import stand_in
    from accord.engine.request import Op, signature_of

    for sig in [_sig(), _sig("allgather", (3,)), _sig("broadcast", (4,), root=1),
                _sig("alltoall", (2,)), _sig("reducescatter", (5, 2))]:
        sig = sig._replace(reduce_op=0 if sig.op in ("allreduce", "reducescatter") else -1,
                           postscale=0.5 if sig.op in ("allreduce", "reducescatter") else 1.0,
                           dtype="float16" if sig.op not in ("allreduce", "reducescatter") else "float32")
        r = stand_in("x", sig, (0, 1, 2))
        assert signature_of(r) == sig, sig.op
        assert r.tensor.dtype == torch.float16 and not r.tensor.any()
        if Op(sig.op) in (Op.ALLGATHER, Op.ALLTOALL):
            assert r.tensor.shape[0] == 0
    assert stand_in("b", _sig("barrier", (), dtype="", wire="")._replace(reduce_op=-1, postscale=1.0),
                    (0, 1)).tensor is None
    assert stand_in("t", _sig("alltoall", (2,))._replace(reduce_op=-1, postscale=1.0), (0, 1)).splits == (0, 0)


def test_last_rank_to_join():
    from accord.engine.negotiation.join import JoinState

    js = JoinState()
    assert js.observe([], 3) is None and js.observe([1], 3) is None and js.observe([1], 3) is None
    assert js.observe([0, 1], 3) is None
    assert js.observe([0, 1, 2], 3) == 2
    assert js.observe([2], 3) is None  # a new round starts from nobody
    assert js.observe([0, 1, 2], 3) == 1  # 0 and 1 joined together last: the higher one
