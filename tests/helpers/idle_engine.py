"""Whether an idle engine is idle, read from its own state instead of its CPU time (which a busy
machine inflates: benchmarks/idle_engine_cpu.py measures that).

An idle controller must (1) sleep on its condition between ticks, and (2) wake only for its
idle tick: one cycle (one small negotiation) per ``settings.tick`` seconds. :func:`watch_idle`
samples every controller of this rank over a window, on the rank itself; :func:`check_idle`
asserts both on what it returns. Neither depends on how fast the machine is: a loaded machine
stretches the window, and the number of ticks it allows grows with it.
"""
from __future__ import annotations

import time
from typing import Any

from helpers.stacks import blocked_on

# Cycles a window may hold beyond seconds / tick: one already under way when it opens, one
# that starts just before it closes.
SLACK = 2


def controllers(engine: Any) -> dict[int, Any]:
    """The engine's controllers by process set id (a private field, read by tests only)."""
    return dict(engine._controllers)


def watch_idle(engine: Any, seconds: float = 3.0, interval: float = 0.05) -> dict:
    """Watch this rank's engine, which must have nothing to do, for ``seconds``.

    Returns (picklable) ``{"tick", "seconds", "samples", "sets": {set id: {"cycles",
    "negotiations", "parked"}}}``: the cycles and negotiations each controller ran meanwhile,
    and in how many of the samples its thread was blocked on its condition.
    """
    ctrls = controllers(engine)
    before = {i: (c.cycles, c.negotiations) for i, c in ctrls.items()}
    parked = dict.fromkeys(ctrls, 0)
    samples = 0
    start = time.monotonic()
    while samples == 0 or time.monotonic() - start < seconds:
        for i, c in ctrls.items():
            parked[i] += blocked_on(c.thread, c.cond)
        samples += 1
        time.sleep(interval)
    elapsed = time.monotonic() - start
    return {"tick": engine.settings.tick, "seconds": elapsed, "samples": samples,
            "sets": {i: {"cycles": c.cycles - before[i][0], "negotiations": c.negotiations - before[i][1],
                         "parked": parked[i]} for i, c in ctrls.items()}}


def check_idle(idle: dict, set_ids: list[int] | None = None) -> None:
    """Assert what :func:`watch_idle` saw: every controller (of ``set_ids``, when given: then
    exactly those) ran no more cycles and negotiations than its ticks allow, and was found
    blocked on its condition. A thread that spins never is; one that wakes too often
    (pausing, but not for a tick) runs too many cycles."""
    sets = {int(k): v for k, v in idle["sets"].items()}
    if set_ids is not None:
        assert sorted(sets) == sorted(set_ids), (sorted(sets), set_ids)
    allowed = idle["seconds"] / idle["tick"] + SLACK
    for set_id, s in sets.items():
        assert s["cycles"] <= allowed and s["negotiations"] <= allowed, (
            f"set {set_id}: {s['cycles']} cycles, {s['negotiations']} negotiations in "
            f"{idle['seconds']:.1f}s with a {idle['tick']}s tick (at most {allowed:.1f})", idle)
        assert s["parked"] >= 1, (f"set {set_id}: its thread was never found blocked on its condition "
                                  f"in {idle['samples']} samples", idle)
