"""An idle engine on the default one-host backend (shm) does not spin: its thread sleeps on its
condition and runs no more cycles than its idle tick asks for (read from the engine's state,
not from CPU time, which a busy machine distorts: benchmarks/idle_engine_cpu.py measures the
CPU share); the worker's log level comes from ACCORD_LOG_LEVEL / HOROVOD_LOG_LEVEL."""
import pytest
from helpers.idle_engine import check_idle
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)


def _idle(rank, size):
    import logging

    from helpers.idle_engine import watch_idle

    from accord.engine import session

    session.init()
    engine = session.engine()
    backend = session.backend_name("cpu")
    level = logging.getLogger("accord").level
    # both ranks past init: the start-up negotiations are over before the window opens
    session.synchronize(session.submit("barrier", None, None))
    idle = watch_idle(engine, seconds=3.0)
    session.shutdown()
    return backend, level, idle


def test_idle_shm_engine_sleeps_between_ticks():
    import logging

    out = run_ranks(_idle, 2, init="accord", timeout=75,
                    env={"ACCORD_CPU_BACKEND": "auto", "HOROVOD_LOG_LEVEL": "info"})
    for backend, level, idle in out:
        assert backend == "shm"
        assert level == logging.INFO
        assert idle["tick"] == 1.0  # the default idle interval: 3 s allow at most 5 cycles
        check_idle(idle, set_ids=[0])
