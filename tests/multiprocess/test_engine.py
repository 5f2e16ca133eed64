"""The engine on real ranks over Gloo: matching by name, every op vs numpy, fusion, errors.

Each test runs many checks inside one set of ranks (starting a rank costs about a second).
Every rank regenerates every rank's input from (seed, rank), so expected values are computed
independently with numpy.
"""
import json
import os

import numpy as np
import pytest
from helpers.idle_engine import check_idle
from helpers.ranks import run_ranks
from helpers.values import close as _close
from helpers.values import int_data as _data

pytestmark = pytest.mark.timeout(90)


def _submit(engine, op, tensor, name, **kw):
    from accord.engine.request import Op, build_request

    return engine.enqueue(build_request(Op(op), tensor, name, **kw))


def _sync(engine, handle):
    return engine.synchronize(handle)


# --- 2 ranks: idle CPU, matching, ops, dtypes, scale factors, errors, steady state, timeline -------------

def _two_rank_checks(rank, size, timeline_dir):
    import torch
    import torch.distributed as dist
    from helpers.engine_comm import start_engine

    from accord.comm.ops import ReduceOp
    from accord.engine.compression import Compression
    from accord.errors import MismatchError

    eng = start_engine(rank, size, count_negotiation=True, cycle_time=0.005)
    report = {}

    # 0. an idle engine must not spin: its thread sleeps on its condition between idle ticks
    # and runs no more cycles than the ticks ask for (state, not CPU time: see test_engine_idle.py)
    from helpers.idle_engine import watch_idle

    _sync(eng, _submit(eng, "barrier", None, "start"))  # both engines past their start-up
    report["idle"] = watch_idle(eng, seconds=2.0)
    collectives = eng.stats()["collectives"]

    # 1. many named tensors submitted in different orders on different ranks
    shapes = {f"grad.{i}": (i % 5 + 1, 3) for i in range(40)}
    order = sorted(shapes) if rank == 0 else sorted(shapes, reverse=True)
    tensors = {n: torch.from_numpy(_data(i, rank, shapes[n])) for i, n in enumerate(sorted(shapes))}
    handles = {n: _submit(eng, "allreduce", tensors[n], n, in_place=(rank == 0)) for n in order}
    for i, n in enumerate(sorted(shapes)):
        out = _sync(eng, handles[n])
        want = sum(_data(i, r, shapes[n]) for r in range(size))
        _close(out.numpy(), want)
        if rank == 0:
            assert out is tensors[n]  # in place
        else:
            _close(tensors[n].numpy(), _data(i, rank, shapes[n]))  # input untouched
    report["fused_collectives"] = eng.stats()["collectives"] - collectives

    # 1b. gradients that are views of one flat buffer are reduced where they lie (no copies);
    # rank 1 uses separate tensors, so the fused layouts must still agree element for element
    sizes = [3, 5, 2, 7]
    if rank == 0:
        flat = torch.zeros(sum(sizes))
        views = list(flat.split(sizes))
    else:
        views = [torch.zeros(n) for n in sizes]
    for i, v in enumerate(views):
        v.copy_(torch.from_numpy(_data(50 + i, rank, (sizes[i],))))
    allocations = eng.stats()["fusion_allocations"]
    hs = [_submit(eng, "allreduce", v, f"flat.{i}", in_place=True) for i, v in enumerate(views)]
    for i, h in enumerate(hs):
        assert _sync(eng, h) is views[i]
        _close(views[i].numpy(), sum(_data(50 + i, r, (sizes[i],)) for r in range(size)))
    if rank == 0:
        _close(flat.numpy(), np.concatenate([v.numpy() for v in views]))
    # out-of-place views must not be written into
    before = [v.clone() for v in views]
    hs = [_submit(eng, "allreduce", v, f"flat.out.{i}") for i, v in enumerate(views)]
    for i, h in enumerate(hs):
        _close(_sync(eng, h).numpy(), before[i].numpy() * size)
        _close(views[i].numpy(), before[i].numpy())
    report["flat_allocations"] = eng.stats()["fusion_allocations"] - allocations

    # 2. allreduce: every op x several dtypes, plus scale factors and compression
    for dtype in ["float32", "float64", "int32", "int64", "int8", "uint8", "float16"]:
        for op in [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.AVERAGE]:
            if dtype == "uint8":
                base = [np.abs(_data(7, r, (4, 2))).astype(dtype) for r in range(size)]
            else:
                base = [_data(7, r, (4, 2), dtype) for r in range(size)]
            if op == ReduceOp.AVERAGE and not dtype.startswith("float"):
                continue  # integer averaging follows the comm layer's rule (its own tests)
            t = torch.from_numpy(base[rank].copy())
            got = _sync(eng, _submit(eng, "allreduce", t, f"ar.{dtype}.{op.name}", reduce_op=op))
            stack = np.stack([b.astype(np.float64) for b in base])
            want = {ReduceOp.SUM: stack.sum(0), ReduceOp.MIN: stack.min(0), ReduceOp.MAX: stack.max(0),
                    ReduceOp.PRODUCT: stack.prod(0), ReduceOp.AVERAGE: stack.mean(0)}[op]
            assert str(got.dtype) == f"torch.{dtype}", (got.dtype, dtype)
            _close(got.numpy(), want)
    bf = torch.from_numpy(_data(8, rank, (5,))).to(torch.bfloat16)
    got = _sync(eng, _submit(eng, "allreduce", bf, "ar.bf16"))
    _close(got.float().numpy(), sum(_data(8, r, (5,)) for r in range(size)))
    flags = torch.tensor([rank == 0, False, True])
    got = _sync(eng, _submit(eng, "allreduce", flags, "ar.bool", reduce_op=ReduceOp.MAX))
    assert got.tolist() == [True, False, True]
    # prescale / postscale on a fused batch and on a lone tensor; AVERAGE folds into postscale
    hs = [_submit(eng, "allreduce", torch.from_numpy(_data(9, rank, (6,))), f"scaled.{k}",
                  prescale_factor=0.5, postscale_factor=3.0, reduce_op=ReduceOp.AVERAGE) for k in range(3)]
    for h in hs:
        _close(_sync(eng, h).numpy(), sum(_data(9, r, (6,)) * 0.5 for r in range(size)) * 3.0 / size)
    leaf = torch.from_numpy(_data(9, rank, (6,))).requires_grad_()  # e.g. a parameter
    h = _submit(eng, "allreduce", leaf, "scaled.lone", prescale_factor=2.0, postscale_factor=0.25)
    got = _sync(eng, h)
    assert got.grad_fn is None and not got.requires_grad
    _close(got.numpy(), sum(_data(9, r, (6,)) * 2.0 for r in range(size)) * 0.25)
    param = torch.from_numpy(_data(9, rank, (6,))).requires_grad_()
    with torch.no_grad():  # in place on a leaf that requires grad, as optimizers do
        _sync(eng, _submit(eng, "allreduce", param, "param", in_place=True))
    _close(param.detach().numpy(), sum(_data(9, r, (6,)) for r in range(size)))
    x = torch.from_numpy(_data(10, rank, (64,)) / 3.0)
    got = _sync(eng, _submit(eng, "allreduce", x, "compressed", in_place=True, compression=Compression.fp16))
    assert got is x and got.dtype == torch.float32
    _close(got.numpy(), sum(_data(10, r, (64,)) / 3.0 for r in range(size)), tol=1e-2)

    # 3. the other collectives
    rows = rank + 1
    got = _sync(eng, _submit(eng, "allgather", torch.from_numpy(_data(11, rank, (rows, 3))), "ag"))
    _close(got.numpy(), np.concatenate([_data(11, r, (r + 1, 3)) for r in range(size)]))
    b = torch.from_numpy(_data(12, rank, (2, 2)))
    got = _sync(eng, _submit(eng, "broadcast", b, "bc", root_rank=1, in_place=True))
    assert got is b
    _close(b.numpy(), _data(12, 1, (2, 2)))
    got = _sync(eng, _submit(eng, "broadcast", torch.from_numpy(_data(13, rank, (3,))), "bc.out", root_rank=0))
    _close(got.numpy(), _data(13, 0, (3,)))
    splits = [1, 2] if rank == 0 else [3, 0]
    src = torch.from_numpy(_data(14, rank, (3, 2)))
    out, received = _sync(eng, _submit(eng, "alltoall", src, "a2a", splits=splits))
    all_splits = [[1, 2], [3, 0]]
    parts = []
    for r in range(size):
        start = sum(all_splits[r][:rank])
        parts.append(_data(14, r, (3, 2))[start:start + all_splits[r][rank]])
    _close(out.numpy(), np.concatenate(parts))
    assert [int(x) for x in received] == [all_splits[r][rank] for r in range(size)]
    got = _sync(eng, _submit(eng, "reducescatter", torch.from_numpy(_data(15, rank, (5, 2))), "rs"))
    total = sum(_data(15, r, (5, 2)) for r in range(size))
    _close(got.numpy(), total[:3] if rank == 0 else total[3:])
    red = torch.from_numpy(_data(16, rank, (4,)))
    got = _sync(eng, _submit(eng, "reduce", red, "red", root_rank=0, reduce_op=ReduceOp.MAX))
    if rank == 0:
        _close(got.numpy(), np.maximum(_data(16, 0, (4,)), _data(16, 1, (4,))))
    else:
        assert got is None
    _close(red.numpy(), _data(16, rank, (4,)))  # out-of-place: input untouched
    got = _sync(eng, _submit(eng, "gather", torch.from_numpy(_data(17, rank, (rows, 2))), "gat", root_rank=1))
    if rank == 1:
        _close(got.numpy(), np.concatenate([_data(17, r, (r + 1, 2)) for r in range(size)]))
    else:
        assert got is None
    full = torch.from_numpy(_data(18, 0, (5, 2)))
    got = _sync(eng, _submit(eng, "scatter", full if rank == 0 else torch.zeros(0, 2), "sc",
                             root_rank=0, splits=[4, 1] if rank == 0 else None))
    _close(got.numpy(), _data(18, 0, (5, 2))[:4] if rank == 0 else _data(18, 0, (5, 2))[4:])
    assert _sync(eng, _submit(eng, "barrier", None, "bar")) is None
    for dtype in ["float64", "int64", "int8", "uint8", "bool", "float16"]:  # data movement dtypes
        mine = torch.from_numpy(_data(60, rank, (rank + 1, 2), dtype))
        got = _sync(eng, _submit(eng, "allgather", mine, f"ag.{dtype}"))
        _close(got.numpy(), np.concatenate([_data(60, r, (r + 1, 2), dtype) for r in range(size)]))
        got = _sync(eng, _submit(eng, "broadcast", torch.from_numpy(_data(61, rank, (3,), dtype)),
                                 f"bc.{dtype}", root_rank=1))
        assert str(got.dtype) == f"torch.{dtype}"
        _close(got.numpy(), _data(61, 1, (3,), dtype))

    # 4. a second in-flight request under one name is refused at submit time
    h = _submit(eng, "allreduce", torch.ones(2), "dup") if rank == 0 else None
    if rank == 0:
        with pytest.raises(ValueError, match="'dup' is already in flight"):
            _submit(eng, "allreduce", torch.ones(2), "dup")
    dist.barrier()
    if rank == 1:
        h = _submit(eng, "allreduce", torch.ones(2), "dup")
    _close(_sync(eng, h).numpy(), [2.0, 2.0])

    # 5. mismatches raise on every rank, with per-rank values, and the engine keeps working
    messages = {}
    rank_dtype = torch.float32 if rank == 0 else torch.float64
    cases = {
        "grad.fc.weight": lambda: _submit(eng, "allreduce", torch.zeros(3 + rank), "grad.fc.weight"),
        "m.dtype": lambda: _submit(eng, "allreduce", torch.zeros(2, dtype=rank_dtype), "m.dtype"),
        "m.op": lambda: _submit(eng, "allreduce" if rank == 0 else "allgather", torch.zeros(2), "m.op"),
        "m.root": lambda: _submit(eng, "broadcast", torch.zeros(2), "m.root", root_rank=rank),
    }
    hs = {k: f() for k, f in cases.items()}
    for k, h in hs.items():
        with pytest.raises(MismatchError) as info:
            _sync(eng, h)
        messages[k] = str(info.value)
    report["mismatch"] = messages
    _close(_sync(eng, _submit(eng, "allreduce", torch.ones(3), "after.mismatch")).numpy(), [2, 2, 2])

    # 6. steady state: the same names every step cost exactly one negotiation collective a cycle
    names = [f"steady.{i}" for i in range(20)]
    def step():
        order = names if rank == 0 else names[::-1]
        hs = [_submit(eng, "allreduce", torch.ones(8), n) for n in order]
        for h in hs:
            _close(_sync(eng, h).numpy(), np.full(8, 2.0))
    step()  # first step: names are new, a full exchange agrees on them
    before = dict(eng._comm.calls), eng.stats()
    for _ in range(5):
        step()
    after = dict(eng._comm.calls), eng.stats()
    report["steady"] = {
        "cycles": after[1]["cycles"] - before[1]["cycles"],
        "negotiation_allreduces": after[0].get("allreduce", 0) - before[0].get("allreduce", 0),
        "negotiation_allgathers": after[0].get("allgather", 0) - before[0].get("allgather", 0),
        "full_exchanges": after[1]["full_exchanges"] - before[1]["full_exchanges"],
        "planned_cycles": after[1]["planned_cycles"] - before[1]["planned_cycles"],
        "fusion_allocations": after[1]["fusion_allocations"] - before[1]["fusion_allocations"],
    }

    # 7. timeline (rank 0 writes it)
    path = os.path.join(timeline_dir, "timeline.json")
    eng.start_timeline(path)
    hs = [_submit(eng, "allreduce", torch.ones(4), f"tl.{i}") for i in range(3)]
    hs.append(_submit(eng, "allreduce", torch.ones(10), "tl.lone", reduce_op=ReduceOp.MAX))
    hs.append(_submit(eng, "allgather", torch.ones(1, 2), "tl.gather"))
    for h in hs:
        _sync(eng, h)
    eng.stop_timeline()
    eng.shutdown()
    assert not eng.running
    return report


@pytest.mark.timeout(120)
def test_engine_two_ranks(tmp_path):
    reports = run_ranks(_two_rank_checks, 2, str(tmp_path), timeout=100)
    for _rank, rep in enumerate(reports):
        check_idle(rep["idle"], set_ids=[0])
        assert rep["fused_collectives"] < 40  # 40 allreduces were fused into fewer collectives
        msgs = rep["mismatch"]
        assert msgs["grad.fc.weight"].startswith(
            "Mismatched allreduce shapes for 'grad.fc.weight': rank 0 sent [3], rank 1 sent [4]")
        assert "HINT:" in msgs["grad.fc.weight"]
        want = "Mismatched allreduce data types for 'm.dtype': rank 0 sent float32, rank 1 sent float64"
        assert want in msgs["m.dtype"]
        assert "Mismatched operations for 'm.op': rank 0 sent allreduce, rank 1 sent allgather" in msgs["m.op"]
        assert "Mismatched broadcast root ranks for 'm.root': rank 0 sent 0, rank 1 sent 1" in msgs["m.root"]
        steady = rep["steady"]
        assert steady["cycles"] > 0
        # one negotiation a cycle, or none once the step repeats (planned cycles, engine/cycle/plan.py)
        assert steady["negotiation_allreduces"] + steady["planned_cycles"] == steady["cycles"], steady
        assert steady["negotiation_allgathers"] == 0 and steady["full_exchanges"] == 0, steady
        assert steady["fusion_allocations"] == 0, steady
    doc = json.loads((tmp_path / "timeline.json").read_text())
    events = doc["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    phases = {}
    for e in events:
        if e["ph"] == "X":
            phases.setdefault(rows[e["tid"]], []).append(e["name"])
    lone = ["NEGOTIATE_ALLREDUCE", "WAIT_FOR_DATA", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE"]
    fused = lone + ["MEMCPY_OUT_FUSION_BUFFER"]
    # tl.0-2 are submitted together and normally fused; a loaded machine may split a cycle
    assert all(phases[f"tl.{i}"] in (fused, lone) for i in range(3)), phases
    assert any(phases[f"tl.{i}"] == fused for i in range(3)), phases
    assert phases["tl.lone"] == lone  # out of place: one private copy, reduced in place
    assert phases["tl.gather"] == ["NEGOTIATE_ALLGATHER", "WAIT_FOR_DATA", "ALLGATHER"]
    assert not (tmp_path / "timeline.json.1").exists()


# --- 3 ranks: process sets, mismatch text with grouped ranks ----------------------------------

def _three_rank_checks(rank, size):
    import torch
    from helpers.engine_comm import start_engine

    from accord.errors import MismatchError

    # A non-zero quiet time here: the gathering loop that waits for submissions to pause.
    eng = start_engine(rank, size, extra_sets=[(0, 2)], quiet_time=0.0005)
    members = (0, 2)
    hs = {}
    for k in range(4):  # set {0, 2} and the global set interleaved, in different orders
        if rank in members:
            hs[f"set.{k}"] = _submit(eng, "allreduce", torch.from_numpy(_data(20 + k, rank, (3,))),
                                     f"set.{k}", process_set_id=1)
        hs[f"all.{k}"] = _submit(eng, "allreduce", torch.from_numpy(_data(30 + k, rank, (2,))), f"all.{k}")
    for name, h in sorted(hs.items(), reverse=(rank == 2)):
        seed = int(name.split(".")[1]) + (20 if name.startswith("set") else 30)
        shape = (3,) if name.startswith("set") else (2,)
        group = members if name.startswith("set") else range(size)
        _close(_sync(eng, h).numpy(), sum(_data(seed, r, shape) for r in group))
    if rank in members:
        got = _sync(eng, _submit(eng, "broadcast", torch.from_numpy(_data(40, rank, (2,))), "set.bc",
                                 root_rank=2, process_set_id=1))
        _close(got.numpy(), _data(40, 2, (2,)))
        got = _sync(eng, _submit(eng, "allgather", torch.from_numpy(_data(41, rank, (rank + 1, 2))),
                                 "set.ag", process_set_id=1))
        _close(got.numpy(), np.concatenate([_data(41, r, (r + 1, 2)) for r in members]))
    else:
        with pytest.raises(ValueError, match="rank 1 is not in process set 1"):
            _submit(eng, "allreduce", torch.ones(1), "outsider", process_set_id=1)
    if rank in members:
        # refused on every member, where the ranks agree on the name (a root is per-rank data)
        with pytest.raises(ValueError, match="root rank 1 is not in process set 1"):
            _sync(eng, _submit(eng, "broadcast", torch.ones(1), "bad.root", root_rank=1, process_set_id=1))
    h = _submit(eng, "allreduce", torch.zeros(4 if rank == 1 else 3), "w")
    with pytest.raises(MismatchError) as info:
        _sync(eng, h)
    eng.shutdown()
    return str(info.value)


def test_engine_three_ranks_process_sets():
    messages = run_ranks(_three_rank_checks, 3, timeout=60)
    for m in messages:
        assert m.startswith("Mismatched allreduce shapes for 'w': ranks 0, 2 sent [3], rank 1 sent [4]")


# --- stall inspector (settings from the environment) ------------------------------

def _stall_checks(rank, size):
    import logging

    import torch
    from helpers.engine_comm import start_engine
    from helpers.stacks import wait_until

    from accord.errors import StallError

    eng = start_engine(rank, size)
    assert eng.settings.stall_check_time == 0.5 and eng.settings.stall_shutdown_time == 2.0

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("accord.engine").addHandler(handler)

    def warnings():
        return [r.getMessage() for r in records if r.levelno == logging.WARNING]

    try:
        if rank == 0:
            h = _submit(eng, "allreduce", torch.ones(2), "only.on.rank0")
            with pytest.raises(StallError) as info:
                _sync(eng, h)
            error = str(info.value)
        else:
            # the stall stops this rank's engine too (the bound only ends a wait for a stop
            # that never comes)
            assert wait_until(lambda: not eng.running, timeout=40), "the stall did not stop rank 1"
            with pytest.raises(StallError):
                _submit(eng, "allreduce", torch.ones(2), "too.late")
            error = None
        warned_before_the_stop = warnings()
    finally:
        logging.getLogger("accord.engine").removeHandler(handler)
    eng.shutdown()
    return {"error": error, "warnings": warned_before_the_stop}


def test_stall_warning_then_shutdown_on_every_rank():
    import re

    env = {"ACCORD_STALL_CHECK_TIME_SECONDS": "0.5", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    results = run_ranks(_stall_checks, 2, timeout=60, per_rank_env=lambda r: env)
    for rank, res in enumerate(results):
        # the warning (check time 0.5 s) was logged before the engine stopped, on every rank
        assert res["warnings"], f"rank {rank} logged no stall warning before its engine stopped"
        assert "'only.on.rank0': submitted by ranks [0]" in res["warnings"][0]
        assert "missing on ranks [1]" in res["warnings"][0] and "HINT:" in res["warnings"][0]
    error = results[0]["error"]
    assert "Stall shutdown: names waited more than 2.0 s" in error, error
    # the engine stopped once the name's exchanged age reached the shutdown time (not at the
    # first warning): the age it decided on is in the message
    age = float(re.search(r"'only\.on\.rank0': submitted by ranks \[0\] \((\d+\.\d) s\)", error).group(1))
    assert age >= 2.0, error
