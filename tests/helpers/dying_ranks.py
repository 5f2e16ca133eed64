"""Test-only: run ranks where some are *expected* to die or hang, keeping the hard timeout.

``run_ranks_with_deaths(fn, nprocs, dying, *args)`` behaves like helpers.ranks.run_ranks with
init="torch" (or ``init="torchrun"``), except that ranks in ``dying`` must not return a result (they die or hang: that
is the point of the test; they are killed once the survivors are done) and the survivors'
results are returned as {rank: value}. Reuses the
harness's rank entry point, environment and hang report; every process is killed at the end.
"""
from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
from typing import Any, Callable

from helpers.ranks import RanksFailed, _context, _hang_report, _rank_main, agent_store, rank_env


def run_ranks_with_deaths(fn: Callable[..., Any], nprocs: int, dying: set[int], *args: Any,
                          timeout: float = 60.0, env: dict[str, str] | None = None,
                          init: str = "torch") -> dict[int, Any]:
    """Run ``fn(rank, nprocs, *args)``; ranks in ``dying`` must die, the others must return."""
    assert init in ("torch", "torchrun"), init
    ctx = _context()
    results = ctx.Queue()
    store = agent_store(nprocs)
    tmp = tempfile.mkdtemp(prefix="accord-ranks-")
    stack_files = [os.path.join(tmp, f"stacks.{r}") for r in range(nprocs)]
    procs = []
    try:
        for rank in range(nprocs):
            p = ctx.Process(target=_rank_main, daemon=True,
                            args=(fn, rank, nprocs, args, rank_env(rank, nprocs, init, store.port, env), init,
                                  store.port, results, stack_files[rank]))
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout
        got: dict[int, tuple[str, Any]] = {}
        survivors = set(range(nprocs)) - dying
        while not survivors <= set(got):
            if time.monotonic() > deadline:
                raise RanksFailed(_hang_report(procs, got, timeout, stack_files))
            try:
                rank, status, value = results.get(timeout=0.2)
                got[rank] = (status, value)
            except queue.Empty:
                lost = [r for r in survivors - set(got) if procs[r].exitcode is not None]
                if lost:
                    time.sleep(0.5)
                    while True:
                        try:
                            rank, status, value = results.get_nowait()
                            got[rank] = (status, value)
                        except queue.Empty:
                            break
                    for r in lost:
                        got.setdefault(r, ("error", f"rank {r} exited with {procs[r].exitcode} without a result"))
        problems = {r: v for r, (s, v) in got.items() if s == "error"}
        problems.update({r: f"rank {r} was expected to die but returned {got[r][1]!r}" for r in dying if r in got})
        if problems:
            text = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(problems.items()))
            raise RanksFailed(f"{len(problems)} of {nprocs} ranks failed:\n{text}")
        return {r: got[r][1] for r in sorted(survivors)}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        del store
        shutil.rmtree(tmp, ignore_errors=True)  # the stack dumps were read by _hang_report


# What Gloo says when a peer's process ended under a collective (its sockets closed); a wait
# that ran out says "Timed out" instead.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def peer_gone(message: str) -> bool:
    """True when ``message`` says a peer's connection closed, and not that a wait timed out."""
    return any(text in message for text in PEER_GONE) and "Timed out" not in message
