"""An idle engine on the default one-host backend (shm) does not spin: its thread sleeps in the
kernel and it runs no more cycles than its idle tick asks for (read from the engine's state,
not from CPU time, which a busy machine distorts); the worker's log level comes from
ACCORD_LOG_LEVEL / HOROVOD_LOG_LEVEL."""
import pytest
from helpers.proc_state import check_idle
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)


def _idle(rank, size):
    import logging
    import time

    from helpers.proc_state import engine_thread_id, sample_states

    from accord.engine import session

    session.init()
    engine = session.engine()
    backend = session.backend_name("cpu")
    level = logging.getLogger("accord").level
    time.sleep(0.5)  # let start-up work (the first negotiations) pass
    cycles, wall = engine.stats()["cycles"], time.monotonic()
    states = sample_states(engine_thread_id(), samples=40, interval=0.05)
    idle = {"cycles": engine.stats()["cycles"] - cycles, "seconds": time.monotonic() - wall,
            "tick": engine.settings.tick, "states": states}
    session.shutdown()
    return backend, level, idle


def test_idle_shm_engine_sleeps_between_ticks():
    import logging

    out = run_ranks(_idle, 2, init="accord", timeout=75,
                    env={"ACCORD_CPU_BACKEND": "auto", "HOROVOD_LOG_LEVEL": "info"})
    for backend, level, idle in out:
        assert backend == "shm"
        assert level == logging.INFO
        check_idle(idle)
