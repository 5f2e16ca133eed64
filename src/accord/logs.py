"""accord's log output in worker processes: the level ACCORD_LOG_LEVEL (HOROVOD_LOG_LEVEL) names.

Everything accord logs goes through loggers under ``accord``. Python shows only warnings and
errors when a program configured no logging, so a level below warning also gets a stderr
handler, unless the program set up logging of its own (root handlers), which then shows them.
"""
from __future__ import annotations

import logging

from accord import config

_HANDLER_NAME = "accord-stderr"


def apply_log_level() -> int:
    """Set the ``accord`` logger to ACCORD_LOG_LEVEL and make its messages visible; return the level.

    Raises:
        ConfigError: the variable names no level.
    """
    level = config.LOG_LEVELS[config.get("ACCORD_LOG_LEVEL")]
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
