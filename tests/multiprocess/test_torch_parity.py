"""Horovod parity that scripts notice: error types, broadcast_optimizer_state's
gradients, and a failed rank releasing a peer that waits in join(). Real ranks; the Horovod
behaviour each check holds accord to is listed in docs/horovod-parity.md."""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(150)


def _errors_and_optimizer_state(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    out = {}

    def caught(fn):
        """The exception ``fn`` raises: it must be a RuntimeError, as Horovod's is."""
        with pytest.raises(RuntimeError) as info:
            fn()
        return type(info.value).__name__, isinstance(info.value, ValueError)

    t = torch.ones(4, 3)
    only0 = hvd.add_process_set([0])
    checks = {
        "reducescatter_adasum": lambda: hvd.reducescatter(t, op=hvd.Adasum),
        "reducescatter_max": lambda: hvd.reducescatter(t, op=hvd.Max),
        "alltoall_splits_sum": lambda: hvd.alltoall(t, splits=[1, 1]),
        "alltoall_splits_count": lambda: hvd.alltoall(t, splits=[4]),
        # raised at synchronize() on every rank (as Horovod's core does), not at submission
        "allgather_scalar": lambda: hvd.synchronize(hvd.allgather_async(torch.tensor(1.0))),
        "allgather_scalar_autograd": lambda: hvd.allgather(torch.tensor(1.0)),  # Horovod: IndexError
        "broadcast_root_outside": lambda: hvd.broadcast(t, root_rank=size + 3),
        "unregistered_set": lambda: hvd.allreduce(t, process_set=hvd.ProcessSet([0, 1])),
    }
    if rank == 1:
        checks["not_a_member"] = lambda: hvd.allreduce(t, process_set=only0)
    out["errors"] = {k: caught(f) for k, f in checks.items()}
    # a name in flight twice: ValueError in Horovod, accord's is both
    h = hvd.allreduce_async(t, name="dup")
    out["errors"]["duplicate_name"] = caught(lambda: hvd.allreduce_async(t, name="dup"))
    hvd.synchronize(h)
    # errors found across ranks: HorovodInternalError (a RuntimeError) on every rank
    out["mismatch"] = caught(lambda: hvd.allreduce(torch.ones(2 + rank), name="mm"))
    # what Horovod raises as a plain ValueError stays one
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())
    hvd.barrier(process_set=only0) if rank == 0 else None
    hvd.remove_process_set(only0)

    # broadcast_optimizer_state on an optimizer without state: zero .grad on parameters that
    # require grad (None on frozen ones), parameters unchanged, root's state everywhere
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for p in model[1].parameters():
        p.requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9, weight_decay=0.5)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["grads"] = [None if p.grad is None else (list(p.grad.shape), float(p.grad.abs().sum()))
                    for p in model.parameters()]
    out["params_unchanged"] = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    out["lr"] = opt.param_groups[0]["lr"]
    out["momentum_buffers"] = sorted(k for s in opt.state.values() for k in s)
    hvd.shutdown()
    return out


def test_error_types_and_optimizer_state_match_horovod():
    results = run_ranks(_errors_and_optimizer_state, 2, init="accord", timeout=60)
    for rank, res in enumerate(results):
        names = set(res["errors"])
        assert names >= {"reducescatter_adasum", "alltoall_splits_sum", "allgather_scalar",
                         "broadcast_root_outside", "unregistered_set", "duplicate_name"}
        for what, (cls, is_value_error) in res["errors"].items():
            assert cls == "InvalidArgumentError" and is_value_error, (rank, what, cls)
        assert res["mismatch"] == ("MismatchError", False)
        assert res["grads"] == [([2, 3], 0.0), ([2], 0.0), None, None]
        assert res["params_unchanged"]
        assert res["lr"] == pytest.approx(0.1)  # root's options
        assert res["momentum_buffers"] == ["momentum_buffer", "momentum_buffer"]
    assert "not_a_member" in results[1]["errors"]


def _failed_rank_releases_join(rank, size):
    import accord.torch as hvd

    hvd.init()
    if rank == 1:
        from helpers.stacks import wait_until

        from accord.engine import session

        # fail only once rank 0 waits in join(): this rank's engine has seen it join (read
        # from the global controller's join state, a private field)
        join_state = session.engine()._global.join_state
        assert wait_until(lambda: 0 in join_state._seen, timeout=60), "rank 0 never joined"
        try:
            assert 1 == 2, "a test assertion fails on rank 1"
        except AssertionError:
            hvd.shutdown()  # what a test's teardown (or the atexit hook) does
        return None
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.join()
    # the next collectives and shutdown raise or return at once: nothing hangs
    with pytest.raises(hvd.HorovodInternalError) as after:
        hvd.barrier()
    hvd.shutdown()
    return {"message": str(info.value), "after_message": str(after.value)}


def test_a_failed_ranks_shutdown_releases_a_peer_waiting_in_join():
    # the 90 s collective timeout outlasts run_ranks' 80 s: rank 0 returns only if released
    res = run_ranks(_failed_rank_releases_join, 2, init="accord", timeout=80,
                    env={"ACCORD_COLLECTIVE_TIMEOUT": "90"})[0]
    # released by rank 1's shutdown (a collective timeout would name the failed collective)
    assert "join() on rank 0 was waiting for the other ranks when the accord engine shut down" \
        in res["message"], res["message"]
    assert "HINT:" in res["message"]
    assert "Timed out" not in res["message"] + res["after_message"], res


def _sets_that_differ_by_rank(rank, size):
    import torch

    import accord.torch as hvd
    from accord.engine import session

    # what ProcessSet(MPI.COMM_WORLD.Split(color=rank % 2)) gives: each rank names its own group
    parity = hvd.ProcessSet([r for r in range(size) if r % 2 == rank % 2])
    hvd.init(process_sets=[parity])
    got = {"id": parity.process_set_id, "table": {k: list(v) for k, v in session.process_sets().items()},
           "sum": hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=parity).item()}
    try:  # a duplicate (the global set) raises and leaves accord initialized, as in Horovod
        hvd.init(process_sets=[parity, hvd.ProcessSet(list(range(size)))])
        got["duplicate"] = None
    except ValueError as exc:
        got["duplicate"] = str(exc)
    got["initialized"] = hvd.is_initialized()
    got["after"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
    hvd.shutdown()
    return got


def test_init_registers_every_ranks_sets_when_ranks_pass_different_ones():
    """Horovod's split-communicator pattern: each rank passes only its own group's set; every
    rank ends with the union, numbered the same everywhere (rank 0's sets first)."""
    results = run_ranks(_sets_that_differ_by_rank, 3, init="accord", timeout=90)
    table = {0: [0, 1, 2], 1: [0, 2], 2: [1]}
    for rank, got in enumerate(results):
        assert got["table"] == table, got
        assert got["id"] == (2 if rank == 1 else 1), got
        assert got["sum"] == (1.0 if rank == 1 else 2.0), got
        assert "process_sets entry number 1 is a duplicate" in got["duplicate"], got
        assert got["initialized"] and got["after"] == 3.0, got


def _dynamic_timeline(rank, size, workdir):
    import os

    import torch

    import accord.torch as hvd

    os.chdir(workdir)  # where a timeline named by the variable's value would land
    hvd.init()
    hvd.allreduce(torch.ones(2), name="before.start")
    hvd.start_timeline(os.path.join(workdir, "chosen.json"))
    hvd.allreduce(torch.ones(2), name="while.recording")
    hvd.stop_timeline()
    hvd.barrier()
    hvd.shutdown()
    return True


def test_timeline_dynamic_writes_no_file_until_start_timeline(tmp_path):
    """HOROVOD_TIMELINE=DYNAMIC (Horovod's test_torch.py sets it) enables the timeline API; it
    is not a file name: the only file is the one start_timeline() names (rank 0 writes it)."""
    import json

    env = {"HOROVOD_TIMELINE": "DYNAMIC"}
    assert run_ranks(_dynamic_timeline, 2, str(tmp_path), init="accord", env=env, timeout=60) == [True] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chosen.json"]
    doc = json.loads((tmp_path / "chosen.json").read_text())
    rows = " ".join(e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name")
    assert "while.recording" in rows and "before.start" not in rows, rows
