"""Bad input to torch.distributed on the accord backend, as a torchrun script meets it: torchrun's
environment and agent-hosted store (helpers.ranks ``init="torchrun"``), plain
``init_process_group("accord")`` in the script.

- A collective that one rank calls differently (shape, dtype, op, scale factor, root) raises on
  every rank, fast (within 5 s of a 60 s timeout), naming the ranks and what each passed.
- An op a dtype cannot take raises a clear error on every rank, and the ranks stay in step.
- A collective on a destroyed group raises.
- A rank that dies while the others wait in all_reduce fails them well within the timeout, and
  nothing is left behind.
- ``init_process_group(timeout=...)`` bounds a collective that a rank never calls.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import pytest
from helpers import leftovers
from helpers.dying_ranks import run_ranks_with_deaths
from helpers.marks import mark, wait_marked
from helpers.ranks import run_ranks
from helpers.stacks import wait_until
from helpers.torch_features import premul_factor_readable, torch_release

pytestmark = pytest.mark.timeout(120)



def _init(timeout_s: float | None) -> None:
    """What the script does: ``init_process_group("accord")`` on env://, with ``timeout_s`` or
    torch's default."""
    from datetime import timedelta

    import torch.distributed as dist

    import accord.distributed  # noqa: F401 (names the backend where torch does not autoload it)

    kwargs = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    dist.init_process_group("accord", **kwargs)


def _ranks_text(ranks: list[int]) -> str:
    """How accord's messages name a set of ranks ("rank 2", "ranks 0, 1")."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _outcome(fn: Callable[[], Any]) -> tuple[str, bool, float, str]:
    """(exception type or "returned", is a RuntimeError or ValueError, seconds from the call, message)."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the parent judges it)
        return type(exc).__name__, isinstance(exc, (RuntimeError, ValueError)), time.monotonic() - start, str(exc)
    return "returned", False, time.monotonic() - start, ""


def _bad_calls(rank: int, size: int) -> dict[str, Any]:
    """Each bad call on every rank, with what its message must say; then a good one."""
    import torch
    import torch.distributed as dist

    _init(60)
    odd = size - 1  # the rank that passes something else
    others, everyone = _ranks_text(list(range(odd))), list(range(size))
    me_odd = rank == odd
    red = dist.ReduceOp
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    cases: dict[str, tuple[Callable[[], Any], list[str]]] = {
        # one rank differs from the others
        "all_reduce shape": (lambda: dist.all_reduce(torch.ones(3 if me_odd else 4)),
                             ["shapes", f"{others} sent [4]", f"rank {odd} sent [3]"]),
        "all_reduce dtype": (lambda: dist.all_reduce(torch.ones(4, dtype=torch.float64 if me_odd else torch.float32)),
                             ["data types", f"{others} sent float32", f"rank {odd} sent float64"]),
        "all_reduce op": (lambda: dist.all_reduce(torch.ones(4), op=red.MAX if me_odd else red.SUM),
                          ["reduce ops", f"{others} sent SUM", f"rank {odd} sent MAX"]),
        "all_reduce premul factor": (
            lambda: dist.all_reduce(torch.ones(4), op=dist._make_nccl_premul_sum(3.0 if me_odd else 2.0)),
            ["prescale factors", f"{others} sent 2.0", f"rank {odd} sent 3.0"]),
        "all_reduce refused on one rank": (
            lambda: dist.all_reduce(torch.ones(4), op=red.BAND if me_odd else red.SUM),
            [f"invalid arguments on ranks [{odd}]", "float32", "BAND"]),
        "broadcast src": (lambda: dist.broadcast(torch.ones(4), src=1 if me_odd else 0),
                          ["root ranks", f"{others} sent 0", f"rank {odd} sent 1"]),
        "all_gather dtype": (
            lambda: dist.all_gather([torch.ones(2, dtype=torch.int64 if me_odd else torch.int32) for _ in everyone],
                                    torch.ones(2, dtype=torch.int64 if me_odd else torch.int32)),
            ["allgather data types", f"{others} sent int32", f"rank {odd} sent int64"]),
        "reduce_scatter_tensor shape": (
            lambda: rs_single(torch.ones(2 + me_odd), torch.ones(size * (2 + me_odd))),
            ["reducescatter shapes", f"{others} sent", f"rank {odd} sent"]),
        # every rank asks for what the dtype cannot do
        "all_reduce AVG bool": (lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=red.AVG),
                                [f"invalid arguments on ranks {everyone}", "bool", "AVERAGE"]),
        "all_reduce BAND float32": (lambda: dist.all_reduce(torch.ones(4), op=red.BAND),
                                    [f"invalid arguments on ranks {everyone}", "float32", "BAND"]),
        "reduce BOR float64": (lambda: dist.reduce(torch.ones(4, dtype=torch.float64), dst=0, op=red.BOR),
                               [f"invalid arguments on ranks {everyone}", "float64", "BOR"]),
        "reduce_scatter_tensor BXOR bfloat16": (
            lambda: rs_single(torch.ones(2, dtype=torch.bfloat16), torch.ones(2 * size, dtype=torch.bfloat16),
                              op=red.BXOR),
            [f"invalid arguments on ranks {everyone}", "bfloat16", "BXOR"]),
        "all_reduce MIN complex64": (lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=red.MIN),
                                     ["MIN", "complex"]),  # refused by torch itself, before the backend
        "all_reduce SUM float4": (
            lambda: dist.all_reduce(torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)),
            [f"invalid arguments on ranks {everyone}", "float4_e2m1fn_x2"]),
    }
    if not hasattr(torch, "float4_e2m1fn_x2"):
        del cases["all_reduce SUM float4"]
    if not premul_factor_readable():  # torch 2.4: the factor cannot be read, so no rank can compare it
        cases["all_reduce premul factor"] = (
            cases["all_reduce premul factor"][0],
            [f"invalid arguments on ranks {everyone}", "PREMUL_SUM with a factor", "HINT:"])
    got = {name: (_outcome(call), wanted) for name, (call, wanted) in cases.items()}
    after = torch.full((2,), float(rank + 1))
    dist.all_reduce(after)  # still in step after the errors
    return {"cases": got, "after": after.tolist()}


@pytest.mark.parametrize("size", [2, 3])
def test_bad_calls_raise_on_every_rank_fast(size):
    per_rank = run_ranks(_bad_calls, size, init="torchrun", timeout=90)
    problems = []
    for rank, out in enumerate(per_rank):
        for name, ((kind, runtime, _seconds, message), wanted) in out["cases"].items():
            where = f"rank {rank} {name}"
            if not runtime:
                problems.append(f"{where}: {kind} instead of a RuntimeError/ValueError {message[:200]}")
                continue
            missing = [w for w in wanted if w not in message]
            if missing:
                problems.append(f"{where}: message lacks {missing}: {message}")
            if "complex" not in name and "HINT:" not in message:
                problems.append(f"{where}: message has no HINT: {message}")
        if out["after"] != [size * (size + 1) / 2] * 2:
            problems.append(f"rank {rank}: all_reduce after the errors gave {out['after']}")
    assert not problems, "\n".join(problems)


def _after_destroy(rank: int, size: int) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    from accord import engine

    _init(60)
    world = dist.group.WORLD
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=sub)
    if rank == 0:
        dist.send(torch.ones(2), 1)  # the pair's direct link exists, and must go with the group
    else:
        dist.recv(torch.ones(2), 0)
    dist.destroy_process_group(sub)
    out = {
        "sub through torch": _outcome(lambda: dist.all_reduce(torch.ones(2), group=sub)),
        "sub held": _outcome(lambda: sub.allreduce([torch.ones(2)]).wait()),
        "world still works": _outcome(lambda: dist.all_reduce(torch.ones(2))),
    }
    dist.destroy_process_group()
    out["world through torch"] = _outcome(lambda: dist.all_reduce(torch.ones(2)))
    out["world held"] = _outcome(lambda: world.allreduce([torch.ones(2)]).wait())
    out["barrier"] = _outcome(lambda: dist.barrier())
    out["send"] = _outcome(lambda: world.send([torch.ones(2)], 1 - rank, 0))
    out["engine running"] = engine.is_initialized()
    out["accord threads gone"] = wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("accord")], 5.0, 0.05)
    return out


@pytest.mark.timeout(60)
def test_collective_after_destroy_raises():
    for rank, out in enumerate(run_ranks(_after_destroy, 2, init="torchrun", timeout=45)):
        assert out["world still works"][0] == "returned", (rank, out)
        for name in ("sub through torch", "world through torch", "barrier"):
            kind, runtime, _, message = out[name]
            if name == "sub through torch" and torch_release() < (2, 5):
                # torch 2.4's own lookup of a destroyed group fails before the backend is reached
                assert kind == "TypeError" and "None" in message, (rank, name, out[name])
                continue
            assert runtime and "not" in message and "initialized" in message, (rank, name, out[name])
        for name in ("sub held", "world held", "send"):
            kind, runtime, _, message = out[name]
            assert kind == "ShutdownError" and "after it was destroyed" in message, (rank, name, out[name])
        assert out["engine running"] is False and out["accord threads gone"], (rank, out)


def _new_segments(before: set[str]) -> set[str]:
    return leftovers.shm_segments() - before


def _dies_mid_all_reduce(rank: int, size: int, folder: str) -> tuple:
    import torch
    import torch.distributed as dist

    _init(None)  # torch's default timeout (minutes): the error must come from the death
    dying = size - 1
    t = torch.ones(4)
    dist.all_reduce(t)  # the job is up: every link is made
    if rank == dying:
        assert wait_marked(folder, *[f"waiting {r}" for r in range(dying)], timeout=30)
        os._exit(3)
    work = dist.all_reduce(t, async_op=True)
    mark(folder, f"waiting {rank}")  # in flight here: the peer dies only after this
    return _outcome(work.wait)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.timeout(90)
def test_rank_dying_mid_all_reduce_fails_the_others(size, tmp_path):
    before = leftovers.shm_segments()
    survivors = run_ranks_with_deaths(_dies_mid_all_reduce, size, {size - 1}, str(tmp_path),
                                      init="torchrun", timeout=60)
    dead = size - 1
    for rank, (kind, runtime, _seconds, message) in survivors.items():
        assert runtime, (rank, kind, message)
        assert "exited" in message or "aborted" in message, (rank, message)
    # the first rank to notice names the one that died; others may hear it from that rank
    assert any(f"rank {dead}" in m and "exited" in m for _, _, _, m in survivors.values()), survivors
    assert wait_until(lambda: not _new_segments(before), 5.0, 0.1), _new_segments(before)


def _one_rank_absent(rank: int, size: int, folder: str, absent: int) -> tuple:
    import torch
    import torch.distributed as dist

    _init(5)
    t = torch.ones(4)
    dist.all_reduce(t)
    callers = [r for r in range(size) if r != absent]
    if rank == absent:  # alive, but never calls the collective the others wait in
        assert wait_marked(folder, *[f"raised {r}" for r in callers], timeout=60)
        return ("absent",) + _outcome(lambda: dist.all_reduce(t))
    got = _outcome(lambda: dist.all_reduce(t))
    mark(folder, f"raised {rank}")
    return ("caller",) + got


@pytest.mark.timeout(90)
def test_init_timeout_bounds_a_collective_one_rank_never_calls(tmp_path):
    absent = 1
    per_rank = run_ranks(_one_rank_absent, 3, str(tmp_path), absent, init="torchrun", timeout=75)
    for rank, (role, kind, runtime, seconds, message) in enumerate(per_rank):
        assert runtime, (rank, role, kind, message)
        if role == "caller":
            # not before the 5 s timeout (run_ranks' 75 s bounds the other side: no hang)
            assert seconds >= 4.0, f"rank {rank} raised after {seconds:.1f} s: {message}"
            assert "5.0 s" in message and f"missing on ranks [{absent}]" in message, (rank, message)
        else:
            # the job is stopped: the late rank's call fails at once instead of waiting alone
            # (a rank left to wait alone would time out naming the callers as missing instead)
            assert f"missing on ranks [{absent}]" in message, (rank, seconds, message)
