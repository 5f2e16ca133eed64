"""The shm backend: the same check suite as gloo on 2 and 3 ranks, large tensors through the
chunk pipeline, setup refusals, mismatches, dead and hung peers, no busy waiting, no leftovers.

Expected values are computed with numpy (see tests/helpers/comm_checks.py). Several checks
share one set of ranks (a rank costs ~1 s to start).
"""
import ctypes
import glob
import mmap
import os
import threading

import numpy as np
import pytest
from helpers import groups
from helpers.dying_ranks import run_ranks_with_deaths
from helpers.ranks import run_ranks

# Forces every pipeline path with a handful of elements: 2-3 ranks' slots of 64-192 bytes
# (so the suite's 80-element tensors take several chunks), reductions split across ranks.
TINY = {"chunk_bytes": 64, "direct_max_ranks": 1, "split_min_bytes": 0}


def _large_checks(comm, rank, size, tag):
    """Multi-chunk tensors (default 1 MB slots) for every op, against numpy."""
    import torch

    from accord.comm import ReduceOp

    failures = []

    def same(what, got, want):
        if not np.array_equal(np.asarray(got), want):
            failures.append(f"[{tag} rank {rank}] {what}: got {np.asarray(got).ravel()[:6]}, want {want.ravel()[:6]}")

    rng = [np.random.default_rng(100 + r) for r in range(size)]
    ins = [g.integers(-1000, 1000, size=1_000_003).astype(np.float32) for g in rng]  # 4 MB: 4+ chunks
    t = torch.from_numpy(ins[rank].copy())
    comm.allreduce(t, ReduceOp.SUM)
    same("allreduce float32 SUM", t.numpy(), np.sum(ins, axis=0, dtype=np.float32))
    longs = [np.arange(300_001, dtype=np.int64) * (r + 1) % 7919 for r in range(size)]
    t = torch.from_numpy(longs[rank].copy())
    comm.allreduce(t, ReduceOp.MAX)
    same("allreduce int64 MAX", t.numpy(), np.maximum.reduce(longs))
    t = torch.from_numpy(ins[rank].copy())
    comm.reduce(t, ReduceOp.MIN, size - 1)
    if comm.rank == size - 1:
        same("reduce float32 MIN", t.numpy(), np.minimum.reduce(ins))
    rows = [np.full((700_001, 3), r + 1, dtype=np.int32) for r in range(size)]
    out = comm.reduce_scatter(torch.from_numpy(rows[rank]), ReduceOp.SUM)
    counts = [len(p) for p in np.array_split(np.arange(700_001), size)]
    same("reduce_scatter int32 SUM", out.numpy(), np.full((counts[comm.rank], 3), sum(range(1, size + 1))))
    payload = np.random.default_rng(7).integers(0, 256, size=3 * 2**20 + 5, dtype=np.uint8)
    t = torch.from_numpy(payload.copy() if comm.rank == 0 else np.zeros_like(payload))
    comm.broadcast(t, 0)
    same("broadcast 3 MB", t.numpy(), payload)
    parts = [np.arange(r * 1_000_000, r * 1_000_000 + 400_000 * (r + 1), dtype=np.int64) for r in range(size)]
    same("allgather ragged", comm.allgather(torch.from_numpy(parts[comm.rank])).numpy(), np.concatenate(parts))
    splits = [[(i + j) * 70_000 + 1 for j in range(size)] for i in range(size)]
    data = [np.arange(sum(s), dtype=np.float64) + 1e7 * i for i, s in enumerate(splits)]
    got, received = comm.alltoall(torch.from_numpy(data[comm.rank]), splits[comm.rank])
    me = comm.rank
    want = np.concatenate([data[i][sum(splits[i][:me]):sum(splits[i][:me + 1])] for i in range(size)])
    same("alltoall uneven", got.numpy(), want)
    same("alltoall received", received.numpy(), np.array([splits[i][me] for i in range(size)]))
    return failures


def _many_checks(comm, rank, size, tag):
    """allreduce_many: tensors of awkward sizes (empty ones too) straddling chunk boundaries,
    in place and into separate outputs, against numpy."""
    import torch

    from accord.comm import ReduceOp

    failures = []
    sizes = [0, 1, 17, 300_001, 0, 5, 262_144, 3]
    ins = [[np.random.default_rng(1000 * r + i).integers(-50, 50, size=n).astype(np.float32)
            for i, n in enumerate(sizes)] for r in range(size)]
    for op, fn in ((ReduceOp.SUM, np.add), (ReduceOp.MAX, np.maximum)):
        mine = [torch.from_numpy(a.copy()) for a in ins[rank]]
        separate = [torch.full_like(t, -7.0) for t in mine]
        comm.allreduce_many(mine, separate, op)
        comm.allreduce_many(mine, mine, op)
        for i in range(len(sizes)):
            want = ins[0][i]
            for r in range(1, size):
                want = fn(want, ins[r][i])
            for what, got in (("in place", mine[i]), ("separate", separate[i])):
                if not np.array_equal(got.numpy(), want):
                    failures.append(f"[{tag} rank {rank}] allreduce_many {op.name} {what} tensor {i} "
                                    f"({sizes[i]} elements): got {got.numpy()[:4]}, want {want[:4]}")
        if not np.array_equal(separate[1].numpy(), mine[1].numpy()):
            failures.append(f"[{tag} rank {rank}] separate outputs differ from in-place results")
    # a postscale, in place and into separate outputs: the bits of numpy's sum times 0.25
    mine = [torch.from_numpy(a.copy()) for a in ins[rank]]
    separate = [torch.empty_like(t) for t in mine]
    comm.allreduce_many(mine, separate, ReduceOp.SUM, postscale=0.25)
    comm.allreduce_many(mine, mine, ReduceOp.SUM, postscale=0.25)
    for i in range(len(sizes)):
        want = sum(ins[r][i] for r in range(size)) * np.float32(0.25)
        for what, got in (("in place", mine[i]), ("separate", separate[i])):
            if not np.array_equal(got.numpy(), want):
                failures.append(f"[{tag} rank {rank}] allreduce_many SUM postscale {what} tensor {i}: "
                                f"got {got.numpy()[:4]}, want {want[:4]}")
    try:
        comm.allreduce_many([torch.zeros(3, dtype=torch.int32)], [torch.zeros(3, dtype=torch.int32)],
                            ReduceOp.SUM, postscale=0.5)
        failures.append(f"[{tag}] allreduce_many scaled integer outputs")
    except ValueError as exc:
        if "HINT:" not in str(exc) or "int32" not in str(exc):
            failures.append(f"[{tag}] the integer postscale error names neither dtype nor hint: {exc}")
    if not comm.supports_allreduce_many(torch.float32, ReduceOp.SUM) or comm.supports_allreduce_many(
            torch.float32, ReduceOp.AVERAGE):
        failures.append(f"[{tag}] supports_allreduce_many: want float32 SUM yes, AVERAGE no (emulated)")
    try:
        comm.allreduce_many([torch.zeros(3)], [torch.zeros(4)], ReduceOp.SUM)
        failures.append(f"[{tag}] allreduce_many accepted outputs of the wrong size")
    except ValueError:
        pass
    return failures


def _suite(rank, size):
    from helpers.comm_checks import run_checks

    from accord.comm import get_backend
    from accord.comm.shm.backend import ShmBackend

    count, failures = run_checks(get_backend("shm"), rank, size)
    n, f = run_checks(ShmBackend(**TINY), rank, size)
    count, failures = count + n, failures + f
    if size == 2:  # the Gloo-barrier fallback moves the same data
        n, f = run_checks(ShmBackend(sync="gloo", chunk_bytes=256), rank, size)
        count, failures = count + n, failures + f
    paths = []
    for kwargs, tag in (({}, "default"), ({"direct_max_ranks": 1}, "split")):
        comm = groups.create(ShmBackend(**kwargs), range(size))
        paths.append(comm.segment_path)
        failures += _large_checks(comm, rank, size, tag)
        failures += _many_checks(comm, rank, size, tag)
        comm.close()
    comm = groups.create(ShmBackend(chunk_bytes=4096, direct_max_ranks=1, split_min_bytes=0), range(size))
    failures += _many_checks(comm, rank, size, "4 KB split")
    comm.close()
    return count, failures, paths, os.getpid()


@pytest.mark.timeout(100)
@pytest.mark.parametrize("size", [2, 3])
def test_shm_collectives(size):
    results = run_ranks(_suite, size, timeout=90)
    failures = [f for _, fails, _, _ in results for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:60])
    counts = [n for n, _, _, _ in results]
    assert min(counts) > 2 * 250, counts  # every rank ran the whole suite, twice or more
    paths = {p for _, _, ps, _ in results for p in ps}
    assert len(paths) == 2 and not any(os.path.exists(p) for p in paths), paths
    for _, _, _, pid in results:  # every segment was unlinked during setup: none is left
        assert not glob.glob(f"/dev/shm/accord-shm-{pid}-*")


def _hosts(rank, size):
    import torch

    from accord.comm import ReduceOp, get_backend
    from accord.comm.shm.backend import ShmBackend
    from accord.errors import BackendError

    with pytest.raises(BackendError) as info:  # ACCORD_HOSTNAME differs per rank
        groups.create(get_backend("shm"), range(size))
    text = str(info.value)
    assert "span 2 hosts: rank 0 on 'host0', rank 1 on 'host1'" in text and "HINT:" in text
    only_me = groups.create(get_backend("shm"), [1])  # one host: fine; rank 0 is not a member
    assert (only_me is None) == (rank == 0)
    comm = groups.create(ShmBackend(hostnames=["box", "box"]), range(size))  # the caller knows better
    t = torch.full((3,), float(rank + 1))
    comm.allreduce(t, ReduceOp.SUM)
    assert t.tolist() == [3.0, 3.0, 3.0]
    return True


@pytest.mark.timeout(60)
def test_members_on_different_hosts_are_refused():
    assert run_ranks(_hosts, 2, timeout=50, per_rank_env=lambda r: {"ACCORD_HOSTNAME": f"host{r}"}) == [True, True]


def _mismatch_and_close(rank, size):
    import torch

    from accord.comm import ReduceOp
    from accord.comm.shm.backend import ShmBackend
    from accord.errors import MismatchError, RankFailedError

    comm = groups.create(ShmBackend(), range(size))
    with pytest.raises(MismatchError) as info:
        comm.allreduce(torch.ones(4 + rank), ReduceOp.SUM)
    assert ("rank 0 called allreduce (16 bytes, float32 SUM), rank 1 called allreduce (20 bytes, "
            "float32 SUM)") in str(info.value) and "HINT:" in str(info.value)
    with pytest.raises(MismatchError, match="rank 1 called broadcast"):
        if rank == 0:
            comm.allreduce(torch.ones(2), ReduceOp.MAX)
        else:
            comm.broadcast(torch.ones(2), 0)
    t = torch.ones(2)
    comm.allreduce(t, ReduceOp.SUM)  # still in step after both mismatches
    assert t.tolist() == [2.0, 2.0]
    # A waiting rank sleeps in the kernel (a futex), not spinning, and wakes only at the end of
    # each of its wait's slices: rank 1 watches rank 0's main thread in /proc while rank 0
    # waits for it in a barrier (counts and states, which a busy machine does not change).
    pids = comm.allgather(torch.tensor([os.getpid()])).tolist()
    if rank == 1:
        from helpers.proc_state import watch_sleeper

        from accord.comm.shm.sync import _SLICE_S

        seen = watch_sleeper(pids[0], pid=pids[0], seconds=1.0)
        assert seen["asleep_in_futex"], seen  # a thread that spins is never found asleep
        # one sleep per slice (plus a few: the wait began within the window); a thread that
        # polled would go to sleep hundreds of times a second
        assert seen["sleeps"] <= seen["seconds"] / _SLICE_S + 5, seen
    comm.barrier()
    # A rank that closes makes peers still waiting on it raise at once, not at the timeout: the
    # message says the peer aborted (the 90 s timeout, beyond run_ranks' 50 s, would say "timed out").
    if rank == 1:
        comm.close()
        return "closed"
    with pytest.raises(RankFailedError) as info:
        comm.allreduce(torch.ones(2), ReduceOp.SUM)
    return str(info.value)


@pytest.mark.timeout(60)
def test_mismatches_raise_everywhere_and_waiting_does_not_spin():
    results = run_ranks(_mismatch_and_close, 2, timeout=50, env={"ACCORD_COLLECTIVE_TIMEOUT": "90"})
    assert results[1] == "closed"
    assert results[0].startswith("allreduce failed on rank 0 (shm communicator over ranks [0, 1]): "
                                 "peer rank 1 aborted"), results[0]
    assert "HINT:" in results[0]


def _peer_dies(rank, size, how):
    import signal

    import torch

    from accord.comm import ReduceOp, get_backend
    from accord.errors import RankFailedError

    comm = groups.create(get_backend("shm"), range(size))
    t = torch.ones(3)
    comm.allreduce(t, ReduceOp.SUM)
    assert t.tolist() == [float(size)] * 3
    if rank == 1:
        os.kill(os.getpid(), getattr(signal, how))
    with pytest.raises(RankFailedError) as info:
        comm.allreduce(torch.ones(1 << 20), ReduceOp.SUM)
    with pytest.raises(RankFailedError, match="unusable after an earlier failure"):
        comm.broadcast(torch.ones(2), 0)
    return {"message": str(info.value), "leftovers": glob.glob(f"{comm.segment_path}*")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, limit", [("SIGKILL", "90"), ("SIGSTOP", "2")])
def test_lost_peer_raises_rank_failed(how, limit):
    results = run_ranks_with_deaths(_peer_dies, 2, {1}, how, timeout=50,
                                    env={"ACCORD_COLLECTIVE_TIMEOUT": limit})
    res = results[0]
    assert res["message"].startswith("allreduce failed on rank 0 (shm communicator over ranks [0, 1]): ")
    assert "HINT:" in res["message"] and "ACCORD_COLLECTIVE_TIMEOUT" in res["message"]
    assert res["leftovers"] == []
    if how == "SIGKILL":  # a dead process is noticed from /proc, long before the 90 s limit
        # (which run_ranks' 50 s never reaches, and whose message says "timed out")
        assert "peer rank 1 (pid " in res["message"] and "exited" in res["message"], res
        assert "timed out" not in res["message"], res
    else:  # a stopped process still exists: what ends the wait is ACCORD_COLLECTIVE_TIMEOUT,
        # and the error names the peer that did not arrive (the launcher's report reads it)
        assert "timed out after 2s (ACCORD_COLLECTIVE_TIMEOUT)" in res["message"], res
        assert "barrier of ranks [0, 1]: peer rank(s) [1] did not answer while rank 0 waited" in res["message"], res


@pytest.mark.timeout(60)
def test_a_barrier_timeout_names_the_peer_that_did_not_arrive():
    """Rank 1 of 3 is stopped (SIGSTOP): the survivor whose wait times out names rank 1, not a
    count; the other learns of that survivor's abort."""
    results = run_ranks_with_deaths(_peer_dies, 3, {1}, "SIGSTOP", timeout=50,
                                    env={"ACCORD_COLLECTIVE_TIMEOUT": "2"})
    messages = [res["message"] for res in results.values()]
    timed_out = [m for m in messages if "timed out after 2s (ACCORD_COLLECTIVE_TIMEOUT)" in m]
    assert timed_out, messages
    for m in timed_out:
        assert "in the shm barrier of ranks [0, 1, 2]: peer rank(s) [1] did not answer" in m, m


def _through_the_engine(rank, size):
    import torch

    import accord.torch as hvd
    from accord.comm.shm.backend import ShmCommunicator
    from accord.engine import session

    hvd.init()
    try:
        assert isinstance(session.communicator(0, "cpu"), ShmCommunicator)
        got = hvd.allreduce(torch.arange(6.0) * (rank + 1), op=hvd.Sum, name="x")
        assert got.tolist() == [float(v * 3) for v in range(6)]
        assert hvd.allgather(torch.full((rank + 1, 2), rank)).tolist() == [[0, 0], [1, 1], [1, 1]]
        assert hvd.broadcast(torch.full((2,), float(rank)), root_rank=1).tolist() == [1.0, 1.0]
        assert session.backend_name("cpu") == "shm" and hvd.gloo_enabled() and not hvd.mpi_enabled()
        # A batch of gradients goes through allreduce_many: no fusion buffer, exact averages.
        grads = [torch.arange(n, dtype=torch.float32) * (rank + 1) for n in (5, 70_000, 1, 33)]
        handles = [hvd.allreduce_async_(g, name=f"g{i}", op=hvd.Average) for i, g in enumerate(grads)]
        outs = [hvd.synchronize(h) for h in handles]
        for g, out, n in zip(grads, outs, (5, 70_000, 1, 33)):
            assert out is g and torch.equal(g, torch.arange(n, dtype=torch.float32) * 1.5)
        assert session.engine().stats()["fusion_allocations"] == 0
    finally:
        hvd.shutdown()
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env", [{}, {"ACCORD_CPU_BACKEND": "shm"}], ids=["auto", "explicit"])
def test_selected_by_default_on_one_host_and_by_accord_cpu_backend(env):
    assert run_ranks(_through_the_engine, 2, init="accord", timeout=50, env=env) == [True, True]


@pytest.mark.timeout(30)
def test_futex_barrier_keeps_threads_in_step():
    """Two threads as two ranks on one anonymous mapping: nobody passes a barrier early."""
    from accord.comm.shm.segment import ABORT_OFFSET, COUNTER_OFFSET
    from accord.comm.shm.sync import FutexBarrier, PeerWatch, futex

    assert futex() is not None  # Linux x86-64/arm64: the fast path is available
    buffer = mmap.mmap(-1, 4096)
    progress = [ctypes.c_uint32.from_buffer(buffer, 1024 + 64 * r) for r in (0, 1)]  # checked by the other
    rounds, errors = 3000, []

    def rank_main(me):
        barrier = FutexBarrier(buffer, COUNTER_OFFSET, ABORT_OFFSET, 2, (0, 1), me, 10.0,
                               50e-6 if me else 0.0, PeerWatch([]))
        for i in range(rounds):
            progress[me].value = i + 1
            barrier.wait()
            if progress[1 - me].value < i + 1:
                errors.append(f"rank {me} passed barrier {i} before its peer arrived")
            barrier.wait()  # nobody starts round i + 1 before both checked round i
        barrier.close()

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"accord-test-barrier-{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert ctypes.c_uint32.from_buffer(buffer, COUNTER_OFFSET).value == 2 * 2 * rounds
    progress.clear()  # the views pin the mapping: drop them before closing it
    buffer.close()


def test_segment_layout_keeps_areas_apart():
    from accord.comm.shm.segment import ABORT_OFFSET, COUNTER_OFFSET, Layout

    lay = Layout(3, 4096)
    areas = sorted([lay.slot(b, r) for b in (0, 1) for r in range(3)] + [lay.result(b) for b in (0, 1)])
    assert areas[0] == lay.header and lay.header % 4096 == 0
    assert all(b - a == 4096 for a, b in zip(areas, areas[1:])) and areas[-1] + 4096 == lay.total
    metas = [lay.meta(b, r) for b in (0, 1) for r in range(3)]
    assert max(metas) + 40 <= lay.header and min(metas) > ABORT_OFFSET > COUNTER_OFFSET
    assert len({m // 128 for m in metas}) == 3  # one record (two cache lines) per rank


def _voted(rank, size, chunk):
    import torch

    from accord.comm import ReduceOp
    from accord.comm.shm.backend import ShmBackend

    comm = groups.create(ShmBackend(chunk_bytes=chunk), range(size))
    out = {}
    for n in (5, 3 * chunk // 4 + 7):  # one chunk, and several (the vote is read after the first barrier)
        src = torch.arange(n, dtype=torch.float32) + rank
        want = (torch.arange(n, dtype=torch.float64) * size + sum(range(size))).tolist()
        dst = torch.full((n,), -1.0)
        ran = comm.allreduce_voted([src], [dst], ReduceOp.SUM, 0)
        out[f"{n}: all for"] = (ran, dst.tolist() == want, src.tolist() == (torch.arange(n) + rank).float().tolist())
        # the last rank votes against: nothing is written anywhere, in place or not
        inplace = src.clone()
        ran_out = comm.allreduce_voted([src], [dst.fill_(-1.0)], ReduceOp.SUM, int(rank == size - 1))
        ran_in = comm.allreduce_voted([inplace], [inplace], ReduceOp.SUM, 7 if rank == size - 1 else 0)
        out[f"{n}: one against"] = (ran_out, ran_in, dst.eq(-1.0).all().item(), inplace.tolist() == src.tolist())
        # and the communicator is still in step with its peers afterwards
        after = torch.full((n,), float(rank + 1))
        comm.allreduce(after, ReduceOp.SUM)
        out[f"{n}: after"] = after.eq(size * (size + 1) / 2).all().item()
    comm.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_voted_allreduce_writes_nothing_unless_every_rank_votes_for(size):
    chunk = 4096
    for res in run_ranks(_voted, size, chunk, timeout=60):
        for n in (5, 3 * chunk // 4 + 7):
            assert res[f"{n}: all for"] == (True, True, True), res
            assert res[f"{n}: one against"] == (False, False, True, True), res
            assert res[f"{n}: after"], res
