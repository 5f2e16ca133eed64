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
