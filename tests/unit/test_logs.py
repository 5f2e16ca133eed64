"""ACCORD_LOG_LEVEL / HOROVOD_LOG_LEVEL set the level of accord's loggers."""
import logging

import pytest

from accord.errors import ConfigError
from accord.logs import apply_log_level


@pytest.fixture
def accord_logger():
    logger = logging.getLogger("accord")
    level, handlers = logger.level, list(logger.handlers)
    root_handlers = list(logging.getLogger().handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logging.getLogger().handlers[:] = root_handlers


def test_level_from_horovod_name_and_messages_reach_stderr(monkeypatch, accord_logger, capsys):
    logging.getLogger().handlers[:] = []  # a program that configured no logging
    monkeypatch.setenv("HOROVOD_LOG_LEVEL", "debug")
    assert apply_log_level() == logging.DEBUG
    assert accord_logger.level == logging.DEBUG
    logging.getLogger("accord.engine").debug("negotiated %d names", 3)
    assert "[accord DEBUG accord.engine] negotiated 3 names" in capsys.readouterr().err
    apply_log_level()  # idempotent: one handler, not two
    assert len([h for h in accord_logger.handlers if h.get_name() == "accord-stderr"]) == 1


def test_default_hides_info_and_error_level_hides_warnings(monkeypatch, accord_logger, capsys):
    logging.getLogger().handlers[:] = []
    monkeypatch.delenv("HOROVOD_LOG_LEVEL", raising=False)
    monkeypatch.delenv("ACCORD_LOG_LEVEL", raising=False)
    assert apply_log_level() == logging.WARNING
    logging.getLogger("accord.engine").info("not shown")
    monkeypatch.setenv("ACCORD_LOG_LEVEL", "error")
    apply_log_level()
    logging.getLogger("accord.engine").warning("not shown either")
    logging.getLogger("accord.engine").error("shown")
    err = capsys.readouterr().err
    assert "not shown" not in err and "shown" in err


def test_bad_level_is_a_config_error(monkeypatch, accord_logger):
    monkeypatch.setenv("ACCORD_LOG_LEVEL", "chatty")
    with pytest.raises(ConfigError, match="HINT"):
        apply_log_level()
