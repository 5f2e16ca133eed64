"""Stall inspector decisions and engine settings (pure logic, no processes)."""
import logging

import pytest

from accord.engine.cycle.stall import StallInspector
from accord.engine.negotiation.negotiate import Partial
from accord.engine.settings import EngineSettings
from accord.errors import ConfigError, StallError

pytestmark = pytest.mark.timeout(10)


def test_due_only_after_check_time_and_at_most_once_per_interval():
    s = StallInspector(check_time=10.0)
    assert not s.due(now=100.0, oldest_submitted=None)  # nothing pending
    assert not s.due(now=100.0, oldest_submitted=95.0)  # 5 s < 10 s
    assert s.due(now=100.0, oldest_submitted=90.0)
    assert not s.due(now=105.0, oldest_submitted=90.0)  # checked 5 s ago
    assert s.due(now=110.0, oldest_submitted=90.0)
    assert not StallInspector(10.0, disabled=True).due(now=1e6, oldest_submitted=0.0)


def test_due_again_right_when_shutdown_is_due():
    s = StallInspector(check_time=10.0, shutdown_time=12.0)
    assert s.due(now=100.0, oldest_submitted=90.0)  # age 10: next look at age 12, not 20
    assert not s.due(now=101.9, oldest_submitted=90.0)
    assert s.due(now=102.0, oldest_submitted=90.0)


def test_review_logs_missing_ranks_rate_limited_and_returns_stall_error(caplog):
    s = StallInspector(check_time=1.0, shutdown_time=3.0)
    young = Partial("young", 0, (0,), (1,), 0.5)
    old = Partial("grad.w", 0, (0, 2), (1,), 1.5)
    with caplog.at_level(logging.WARNING, logger="accord.engine"):
        assert s.review([young, old], now=10.0) is None
        assert s.review([young, old], now=10.5) is None  # already warned within check_time
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "'grad.w': submitted by ranks [0, 2] (1.5 s), missing on ranks [1]" in text
    assert "young" not in text and "HINT:" in text
    error = s.review([Partial("grad.w", 0, (0, 2), (1,), 3.2)], now=12.0)
    assert isinstance(error, StallError) and "Stall shutdown" in str(error) and "grad.w" in str(error)
    assert StallInspector(1.0).review([Partial("x", 0, (0,), (1,), 99.0)], now=1.0) is None  # no shutdown


def test_settings_from_config_with_horovod_aliases(monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.setenv("ACCORD_FUSION_THRESHOLD", "1024")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "2")
    s = EngineSettings.from_config()
    assert s.cycle_time == 0.005 and s.fusion_threshold == 1024 and s.stall_check_time == 2.0
    assert s.tick == 0.5  # a quarter of the stall check time, below the 1 s idle interval
    assert EngineSettings(stall_check_disable=True).tick == 1.0
    assert EngineSettings.from_config(fusion_threshold=0).fusion_threshold == 0
    assert s.quiet_time == 0.0005  # default on gloo/mpi: a cycle starts 0.5 ms after the last arrival
    monkeypatch.setenv("ACCORD_CYCLE_QUIET_TIME", "0.25")
    assert EngineSettings.from_config().quiet_time == 0.00025
    with pytest.raises(ConfigError, match="ACCORD_CYCLE_QUIET_TIME"):
        EngineSettings(quiet_time=-1)
    with pytest.raises(ConfigError, match="HINT"):
        EngineSettings(fusion_threshold=-1)


def test_cycle_time_defaults_follow_the_cpu_backend(monkeypatch):
    monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
    monkeypatch.delenv("ACCORD_CYCLE_TIME", raising=False)
    monkeypatch.delenv("ACCORD_CYCLE_QUIET_TIME", raising=False)
    # gloo/mpi (and unknown): a burst is one cycle (0.5 ms quiet), held 30 ms at most
    for backend in ("gloo", "mpi", None):
        s = EngineSettings.from_config(cpu_backend=backend)
        assert (s.cycle_time, s.quiet_time) == (0.030, 0.0005)
        assert s.start_bytes == s.fusion_threshold  # a full fusion buffer goes at once
    # shm: gather until a caller waits or a buffer fills, one second at most
    s = EngineSettings.from_config(cpu_backend="shm")
    assert (s.cycle_time, s.quiet_time, s.start_bytes) == (1.0, 1.0, 0)
    assert EngineSettings(fusion_threshold=7, early_start_bytes=5).start_bytes == 5
    # a cycle time the user sets wins, and bounds the quiet time it did not set
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    s = EngineSettings.from_config(cpu_backend="shm")
    assert (s.cycle_time, s.quiet_time) == (0.005, 0.005)
    monkeypatch.setenv("ACCORD_CYCLE_QUIET_TIME", "2")
    assert EngineSettings.from_config(cpu_backend="shm").quiet_time == 0.002
    assert EngineSettings.from_config(cpu_backend="shm", cycle_time=0.25).cycle_time == 0.25


def test_settings_read_cache_capacity_and_hierarchical_aliases(monkeypatch):
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "16")
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1")
    s = EngineSettings.from_config()
    assert s.cache_capacity == 16 and s.hierarchical_allreduce is True
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "0")  # Horovod: no cache; accord keeps one entry
    assert EngineSettings.from_config().cache_capacity == 1
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "-3")
    with pytest.raises(ConfigError, match="ACCORD_CACHE_CAPACITY"):
        EngineSettings.from_config()
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY")
    monkeypatch.delenv("HOROVOD_HIERARCHICAL_ALLREDUCE")
    s = EngineSettings.from_config()
    assert s.cache_capacity == 1024 and s.hierarchical_allreduce is False


def test_by_default_a_rank_that_never_submits_stops_the_job_after_30_minutes(monkeypatch):
    """Horovod's default (0) let such a job wait forever; accord's is torch's 30 minutes, and 0
    (accord's or Horovod's variable) still waits forever."""
    for name in ("ACCORD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    s = EngineSettings.from_config()
    assert s.stall_shutdown_time == 1800.0 and EngineSettings().stall_shutdown_time == 1800.0
    inspector = StallInspector(s.stall_check_time, s.stall_shutdown_time, s.stall_check_disable)
    waiting = Partial("grad.w", 0, (0, 2), (1,), 1799.0)
    assert inspector.review([waiting], now=2000.0) is None  # warned only
    error = inspector.review([Partial("grad.w", 0, (0, 2), (1,), 1800.5)], now=2001.0)
    assert isinstance(error, StallError), error
    assert "'grad.w': submitted by ranks [0, 2] (1800.5 s), missing on ranks [1]" in str(error)
    assert "HINT:" in str(error) and "ACCORD_STALL_SHUTDOWN_TIME_SECONDS" in str(error)
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0")
    never = EngineSettings.from_config()
    assert never.stall_shutdown_time == 0.0
    forever = StallInspector(never.stall_check_time, never.stall_shutdown_time)
    assert forever.review([Partial("grad.w", 0, (0, 2), (1,), 1e6)], now=1e6) is None


def test_the_stall_warning_says_when_the_job_will_stop(caplog):
    with caplog.at_level(logging.WARNING, logger="accord.engine"):
        StallInspector(60.0, 1800.0).review([Partial("x", 0, (0,), (1,), 61.0)], now=100.0)
        StallInspector(60.0, 0.0).review([Partial("x", 0, (0,), (1,), 61.0)], now=100.0)
    stops, never = (r.getMessage() for r in caplog.records)
    assert "the job stops with a StallError once a name has waited 1800 s" in stops
    assert "ACCORD_STALL_SHUTDOWN_TIME_SECONDS=0 lets the job wait forever" in never
