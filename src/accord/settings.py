"""The settings the base modules read, typed: the log level (:mod:`accord.logs`) and the error
file (:mod:`accord.worker_contract`).

Each is its own function, read when asked: a worker's error file is looked up while an exception
is being reported (and a malformed log level must not stop that), and a test or a launcher may
change either variable between two calls. The other packages keep theirs in their own
``settings`` module (:mod:`accord.engine.settings`, :mod:`accord.runtime.settings`, ...).
"""
from __future__ import annotations

from accord import config


def log_level() -> str:
    """ACCORD_LOG_LEVEL (HOROVOD_LOG_LEVEL): the level name, lower case (``config.LOG_LEVELS`` keys).

    Raises:
        ConfigError: the variable names no level.
    """
    return config.get("ACCORD_LOG_LEVEL")


def error_file() -> str | None:
    """ACCORD_ERROR_FILE: where this worker writes the exception that ends it, or None."""
    return config.get("ACCORD_ERROR_FILE")
