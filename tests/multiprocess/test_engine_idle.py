"""An idle engine on the default one-host backend (shm) uses under 1% of a core, and the
worker's log level comes from ACCORD_LOG_LEVEL / HOROVOD_LOG_LEVEL."""
import pytest

from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)


def _idle(rank, size):
    import logging
    import time

    from accord.engine import session

    session.init()
    backend = session.backend_name("cpu")
    level = logging.getLogger("accord").level
    time.sleep(1.0)  # let start-up work (the first negotiations) pass
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(3.0)
    share = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    session.shutdown()
    return backend, level, share


def test_idle_shm_engine_stays_under_one_percent_of_a_core():
    import logging

    out = run_ranks(_idle, 2, init="accord", timeout=45,
                    env={"ACCORD_CPU_BACKEND": "auto", "HOROVOD_LOG_LEVEL": "info"})
    for backend, level, share in out:
        assert backend == "shm"
        assert level == logging.INFO
        assert share < 0.01, f"an idle rank used {share:.2%} of a core"
