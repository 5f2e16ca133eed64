"""Python's thread switch interval while the engine runs (ACCORD_GIL_SWITCH_INTERVAL): set at
start, restored at shutdown, left alone at 0; bad values refused with a hint. Real ranks."""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)


def _intervals(rank, size, setting):
    import sys

    from helpers.engine_comm import start_engine

    sys.setswitchinterval(0.004)  # a value of the script's own, to be restored
    overrides = {} if setting is None else {"switch_interval": setting}
    eng = start_engine(rank, size, **overrides)
    during = sys.getswitchinterval()
    eng.shutdown()
    return during, sys.getswitchinterval()


@pytest.mark.parametrize("setting, expected", [(None, 0.001), (0.0005, 0.0005), (0.0, 0.004)])
def test_switch_interval_set_while_running_and_restored(setting, expected):
    for during, after in run_ranks(_intervals, 2, setting, timeout=60):
        assert during == pytest.approx(expected)
        assert after == pytest.approx(0.004)


def test_environment_variable_read_in_milliseconds_and_checked(monkeypatch):
    from accord.engine.settings import EngineSettings
    from accord.errors import ConfigError

    monkeypatch.setenv("ACCORD_GIL_SWITCH_INTERVAL", "2.5")
    assert EngineSettings.from_config().switch_interval == pytest.approx(0.0025)
    monkeypatch.setenv("ACCORD_GIL_SWITCH_INTERVAL", "-1")
    with pytest.raises(ConfigError, match="HINT:.*ACCORD_GIL_SWITCH_INTERVAL"):
        EngineSettings.from_config()
    monkeypatch.setenv("ACCORD_GIL_SWITCH_INTERVAL", "fast")
    with pytest.raises(ConfigError, match="ACCORD_GIL_SWITCH_INTERVAL"):
        EngineSettings.from_config()
