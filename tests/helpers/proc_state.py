"""What a thread is doing, read from /proc instead of timed: "blocked in the kernel, waiting"
(state S, a wait channel such as futex_do_wait) or "running / runnable" (state R). A thread that
spins shows R however loaded the machine is; one that sleeps shows S. Tests use this in place of
CPU-share thresholds, which flake on a busy machine."""
from __future__ import annotations

import os
import time


def engine_thread_id() -> int:
    """The native id of this process's accord engine thread (found by its name)."""
    import threading

    return next(t.native_id for t in threading.enumerate() if t.name == "accord-engine")


def thread_state(tid: int, pid: int | None = None) -> tuple[str, str]:
    """(state letter, wait channel) of thread ``tid`` of process ``pid`` (default: this one)."""
    base = f"/proc/{pid or os.getpid()}/task/{tid}"
    with open(f"{base}/stat") as fh:
        state = fh.read().rsplit(")", 1)[1].split()[0]
    try:
        with open(f"{base}/wchan") as fh:
            wchan = fh.read().strip()
    except OSError:
        wchan = ""
    return state, wchan


def sample_states(tid: int, pid: int | None = None, samples: int = 20, interval: float = 0.05) -> list[tuple[str, str]]:
    """``samples`` readings of :func:`thread_state`, ``interval`` seconds apart."""
    out = []
    for _ in range(samples):
        out.append(thread_state(tid, pid))
        time.sleep(interval)
    return out


def mostly_sleeping(states: list[tuple[str, str]], share: float = 0.75) -> bool:
    """True when at least ``share`` of the readings found the thread asleep in the kernel."""
    asleep = sum(1 for s, _ in states if s in ("S", "D"))
    return asleep >= share * len(states)


def check_idle(idle: dict) -> None:
    """Assert an idle engine did not spin. ``idle``: ``states`` (its thread's
    :func:`sample_states`), ``cycles`` run and ``seconds`` elapsed meanwhile, and its idle
    ``tick`` (settings.tick, the idle interval in effect). It must have slept in the kernel (a futex: a condition
    wait, or a peer wait in a negotiation) and cycled no more often than the tick asks."""
    assert mostly_sleeping(idle["states"]), idle["states"]
    assert any("futex" in w for _, w in idle["states"]), idle["states"]
    assert idle["cycles"] <= idle["seconds"] / idle["tick"] + 2, idle
