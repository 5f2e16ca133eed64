"""accord's log output in worker processes: the level ACCORD_LOG_LEVEL (HOROVOD_LOG_LEVEL) names.

Everything accord logs goes through loggers under ``accord``. Python shows only warnings and
errors when a program configured no logging, so a level below warning also gets a stderr
handler, unless the program set up logging of its own (root handlers), which then shows them.
"""
from __future__ import annotations

import logging
import threading

from accord import config, settings

_HANDLER_NAME = "accord-stderr"


def apply_log_level() -> int:
    """Set the ``accord`` logger to ACCORD_LOG_LEVEL and make its messages visible; return the level.

    Raises:
        ConfigError: the variable names no level.
    """
    level = config.LOG_LEVELS[settings.log_level()]
    logger = logging.getLogger("accord")
    logger.setLevel(level)
    ours = [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]
    if level < logging.WARNING and not ours and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("[accord %(levelname)s %(name)s] %(message)s"))
        logger.addHandler(handler)
    for handler in ours:
        handler.setLevel(level)
    return level


class Refusals:
    """Counts refused peers or messages and logs the first few, then every ``every``-th with the
    running count, so that a flood of garbage cannot flood the log. Thread-safe."""

    def __init__(self, logger: logging.Logger, first: int = 5, every: int = 100) -> None:
        self._logger, self._first, self._every = logger, first, every
        self._lock = threading.Lock()
        self.count = 0

    def log(self, message: str, *args: object) -> None:
        """Count one refusal; log ``message % args`` (with the count) when it is due."""
        with self._lock:
            self.count += 1
            n = self.count
        if n <= self._first or n % self._every == 0:
            self._logger.warning(message + " (%d refused so far%s)", *args, n,
                                 "" if n < self._first else f"; logging every {self._every}th")
