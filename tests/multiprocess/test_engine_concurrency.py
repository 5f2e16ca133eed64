"""Several Python threads per rank submitting at once, and autograd hooks firing while other
threads submit: correct results, no deadlock, and no request left behind. The engine's own
count of requests in flight (``session.engine().inflight_names()``, which remove_process_set
also consults) must be empty after successes, errors, a join and a shutdown/init cycle.
"""
import threading

import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(180)

THREADS, PER_THREAD = 3, 12


def _thread_work(tid, rank, size, errors):
    """One thread's mix: allreduce (sync and async), allgather, broadcast, grouped allreduce."""
    import torch
    from helpers.comm_checks import SUM, expected_reduce, tolerance
    from helpers.values import bits_equal, random_values, to_tensor, within

    from accord.engine import session

    try:
        pending = []
        for i in range(PER_THREAD):
            key = f"t{tid}.{i}"
            ins = [random_values(f"{key}|{r}", (i % 7 + 1, 3), torch.float32) for r in range(size)]
            kind = i % 4
            if kind == 0:
                got = session.synchronize(session.submit("allreduce", to_tensor(ins[rank], torch.float32), key))
                assert within(got, expected_reduce(ins, SUM, torch.float32), tolerance(ins, SUM, torch.float32)), key
            elif kind == 1:
                pending.append((key, ins, session.submit("allreduce", to_tensor(ins[rank], torch.float32), key)))
            elif kind == 2:
                rows = [random_values(f"{key}|{r}", (r + 1, 3), torch.float64) for r in range(size)]
                got = session.synchronize(session.submit("allgather", to_tensor(rows[rank], torch.float64), key))
                assert bits_equal(got, np.concatenate(rows), torch.float64), key
                got = session.synchronize(session.submit("broadcast", to_tensor(rows[rank][:1], torch.float64),
                                                         key + ".b", root_rank=i % size))
                assert bits_equal(got, rows[i % size][:1], torch.float64), key
            else:
                parts = [to_tensor(ins[rank][:k + 1], torch.float32) for k in range(ins[rank].shape[0])]
                handles = session.submit_group("allreduce", parts, key, in_place=True)
                for k, h in enumerate(handles):
                    arrays = [x[:k + 1] for x in ins]
                    assert session.synchronize(h) is parts[k]
                    assert within(parts[k], expected_reduce(arrays, SUM, torch.float32),
                                  tolerance(arrays, SUM, torch.float32)), key
        for key, ins, h in pending:
            assert within(session.synchronize(h), expected_reduce(ins, SUM, torch.float32),
                          tolerance(ins, SUM, torch.float32)), key
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(f"thread {tid}: {type(exc).__name__}: {exc}")


def _run_threads(target, count, *args):
    """Start ``count`` threads at once; return the names of those still alive after 60 s."""
    threads = [threading.Thread(target=target, args=(t, *args), name=f"accord-test-submit-{t}")
               for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [t.name for t in threads if t.is_alive()]


def _threads_and_hooks(rank, size):
    import torch

    import accord.torch as hvd
    from accord.engine import session
    from accord.errors import MismatchError

    hvd.init()
    engine = session.engine()
    report = {}

    # 1. four threads per rank submit their own names at once
    errors = []
    report["hung"] = _run_threads(_thread_work, THREADS, rank, size, errors)
    report["thread_errors"] = errors
    report["after_threads"] = engine.inflight_names()

    # 2. backward (gradient hooks submit allreduces) on the main thread while two threads submit
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    side_errors = []
    side = [threading.Thread(target=_thread_work, args=(10 + t, rank, size, side_errors),
                             name=f"accord-test-side-{t}") for t in range(2)]
    for t in side:
        t.start()
    grads = []
    for step in range(6):
        opt.zero_grad()
        x = torch.from_numpy(np.random.default_rng([step, rank]).normal(size=(4, 6)))
        model(x).pow(2).sum().backward()
        opt.step()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
    for t in side:
        t.join(60)
    report["side_hung"] = [t.name for t in side if t.is_alive()]
    report["side_errors"] = side_errors
    report["grads"] = grads
    report["after_hooks"] = engine.inflight_names()

    # 3. errors: a mismatch (raised on every rank) and a refused group leave nothing in flight
    h = hvd.allreduce_async(torch.zeros(2 + rank), name="bad.shape")
    try:
        hvd.synchronize(h)
        report["mismatch"] = "no error"
    except MismatchError as exc:
        report["mismatch"] = "MismatchError" if "bad.shape" in str(exc) else str(exc)
    held = session.submit("allreduce", torch.ones(1), "held_2of2")  # the group's second name
    try:
        session.submit_group("allreduce", [torch.ones(1), torch.ones(1)], "held")
        report["refused"] = "accepted"
    except ValueError:  # all or none: "held_1of2" must not be queued either
        report["refused"] = "ValueError" if engine.inflight_names() == ["held_2of2"] else engine.inflight_names()
    session.synchronize(held)
    report["after_errors"] = engine.inflight_names()

    # 4. join: rank 0 has more batches than the others; the rest stand in for it
    extra = [hvd.allreduce_async(torch.ones(3), name=f"extra.{i}", op=hvd.Sum) for i in range(3)] if rank == 0 else []
    last = hvd.join()
    report["join"] = (last, [hvd.synchronize(h).tolist() for h in extra])
    report["after_join"] = engine.inflight_names()

    # 5. a request nobody else submits is failed by shutdown, and a new engine starts empty
    lonely = session.submit("allreduce", torch.ones(1), f"lonely.{rank}")
    hvd.shutdown()
    try:
        lonely.result()  # raises: it was still waiting for the others when the engine stopped
        report["lonely_done"] = "completed"
    except Exception as exc:  # noqa: BLE001 - the test checks the kind
        report["lonely_done"] = type(exc).__name__
    hvd.init()
    report["after_reinit"] = session.engine().inflight_names()
    hvd.shutdown()
    report["want"] = _expected_grads(size) if rank == 0 else None  # torch is loaded here already
    return report


def _expected_grads(size):
    """The averaged gradients of _threads_and_hooks' model, computed in one process."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    out = []
    for step in range(6):
        model.zero_grad()
        for r in range(size):
            x = torch.from_numpy(np.random.default_rng([step, r]).normal(size=(4, 6)))
            (model(x).pow(2).sum() / size).backward()
        out.append([p.grad.numpy().copy() for p in model.parameters()])
    return out


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_threads_and_hooks_submit_at_once_and_nothing_leaks(backend):
    out = run_ranks(_threads_and_hooks, 2, init="accord", env={"ACCORD_CPU_BACKEND": backend}, timeout=150)
    want = out[0]["want"]
    for rank, rep in enumerate(out):
        assert rep["hung"] == [] and rep["side_hung"] == [], (rank, rep["hung"], rep["side_hung"])
        assert rep["thread_errors"] == [] and rep["side_errors"] == [], (rank, rep["thread_errors"], rep["side_errors"])
        for step, (got, exp) in enumerate(zip(rep["grads"], want)):
            for g, e in zip(got, exp):
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12, err_msg=f"rank {rank} step {step}")
        assert rep["mismatch"] == "MismatchError" and rep["refused"] == "ValueError", rep
        # joined ranks contribute zeros (as in Horovod): rank 0's extras sum to its own ones
        assert rep["join"][0] == out[0]["join"][0] in range(3), rep["join"]
        assert rep["join"][1] == ([[1.0] * 3] * 3 if rank == 0 else []), rep["join"]
        assert rep["lonely_done"] == "ShutdownError", rep["lonely_done"]
        for when in ("after_threads", "after_hooks", "after_errors", "after_join", "after_reinit"):
            assert rep[when] == [], (rank, when, rep[when])
