import pytest

from accord import config
from accord.errors import ConfigError


def test_default_when_unset():
    assert config.get("ACCORD_FUSION_THRESHOLD", {}) == 64 * 1024 * 1024
    assert config.get("ACCORD_STALL_CHECK_TIME_SECONDS", {}) == 60.0


def test_horovod_alias_accepted_and_accord_name_wins():
    env = {"HOROVOD_FUSION_THRESHOLD": "1024"}
    assert config.get("ACCORD_FUSION_THRESHOLD", env) == 1024
    env["ACCORD_FUSION_THRESHOLD"] = "2048"
    assert config.get("ACCORD_FUSION_THRESHOLD", env) == 2048


def test_mxnet_aliases():
    assert config.get("ACCORD_INTERFACE", {"DMLC_INTERFACE": "eth1"}) == "eth1"
    assert config.get("ACCORD_VERBOSE", {"PS_VERBOSE": "1"}) == 1  # a level since PS_VERBOSE=2


def test_bad_value_names_variable_and_hint():
    with pytest.raises(ConfigError) as info:
        config.get("ACCORD_CYCLE_TIME", {"HOROVOD_CYCLE_TIME": "fast"})
    text = str(info.value)
    assert "HOROVOD_CYCLE_TIME='fast'" in text and "HINT:" in text


def test_unknown_variable_is_a_key_error():
    with pytest.raises(KeyError):
        config.get("ACCORD_NOPE", {})


def test_every_variable_documented():
    for var in config.VARIABLES.values():
        assert var.doc and var.name.startswith("ACCORD_")


def test_horovod_log_level_names_parse_to_logging_levels():
    import logging

    assert config.get("ACCORD_LOG_LEVEL", {}) == "warning"
    assert config.get("ACCORD_LOG_LEVEL", {"HOROVOD_LOG_LEVEL": "DEBUG"}) == "debug"
    assert config.LOG_LEVELS["debug"] == logging.DEBUG and config.LOG_LEVELS["warning"] == logging.WARNING
    assert config.LOG_LEVELS["trace"] < logging.DEBUG and config.LOG_LEVELS["fatal"] == logging.CRITICAL
    with pytest.raises(ConfigError, match="(?s)HOROVOD_LOG_LEVEL='loud'.*HINT"):
        config.get("ACCORD_LOG_LEVEL", {"HOROVOD_LOG_LEVEL": "loud"})


def test_more_horovod_aliases():
    assert config.get("ACCORD_TIMELINE", {"HOROVOD_TIMELINE": "/tmp/t.json"}) == "/tmp/t.json"
    assert config.get("ACCORD_STALL_SHUTDOWN_TIME_SECONDS",
                      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "7.5"}) == 7.5
    assert config.get("ACCORD_HIERARCHICAL_ALLREDUCE", {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}) is True
    assert config.get("ACCORD_HIERARCHICAL_ALLREDUCE", {}) is None  # unset: chosen by the layout
    assert config.get("ACCORD_CACHE_CAPACITY", {"HOROVOD_CACHE_CAPACITY": "64"}) == 64
    assert config.get("ACCORD_CACHE_CAPACITY", {}) == 1024


def test_horovod_cpu_operations_and_gloo_timeout_aliases(monkeypatch):
    from accord.comm import backend_name_for
    from accord.comm.backend import get_backend

    assert config.get("ACCORD_CPU_BACKEND", {"HOROVOD_CPU_OPERATIONS": "gloo"}) == "gloo"
    assert config.get("ACCORD_COLLECTIVE_TIMEOUT", {"HOROVOD_GLOO_TIMEOUT_SECONDS": "12"}) == 12.0
    monkeypatch.delenv("ACCORD_CPU_BACKEND", raising=False)
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "GLOO")  # Horovod's docs write it in capitals
    assert get_backend(backend_name_for("cpu", single_host=True)).name == "gloo"
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "AUTO")
    assert backend_name_for("cpu", single_host=False) == "gloo"


def test_set_variables_carries_the_aliases_along(monkeypatch):
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "3")
    monkeypatch.setenv("HOROVOD_RANK", "2")
    monkeypatch.setenv("ACCORD_LOCAL_SIZE", "3")
    monkeypatch.setenv("ACCORD_RANK", "2")
    monkeypatch.delenv("HOROVOD_SIZE", raising=False)
    config.set_variables({"ACCORD_LOCAL_SIZE": None, "ACCORD_RANK": "1", "ACCORD_SIZE": "2"})
    env = config.snapshot()
    assert "ACCORD_LOCAL_SIZE" not in env and "HOROVOD_LOCAL_SIZE" not in env
    assert config.get("ACCORD_LOCAL_SIZE") is None  # no stale alias to fall back to
    assert env["ACCORD_RANK"] == env["HOROVOD_RANK"] == "1"  # a present alias is updated
    assert env["ACCORD_SIZE"] == "2" and "HOROVOD_SIZE" not in env  # absent ones stay absent
    config.set_variables({"ACCORD_SIZE": None})
