"""What the accord process group reads from :mod:`accord.config`: which engine settings the
``timeout`` of ``init_process_group`` may set (those the user did not set)."""
from __future__ import annotations

from typing import Any

from accord import config

# A warning about a stalled collective comes this long before the timeout ends it (at most).
_WARN_BEFORE_S = 60.0


def engine_overrides(timeout_s: float) -> dict[str, Any]:
    """Engine settings for a job whose default group has ``timeout_s``: a collective that cannot
    complete within it fails on every rank (the stall shutdown), and the communicators wait as
    long for a peer. Variables the user set win (ACCORD_COLLECTIVE_TIMEOUT,
    ACCORD_STALL_SHUTDOWN_TIME_SECONDS, ACCORD_STALL_CHECK_TIME_SECONDS)."""
    overrides: dict[str, Any] = {}
    if not config.is_set("ACCORD_COLLECTIVE_TIMEOUT"):
        overrides["collective_timeout"] = timeout_s
    if not config.is_set("ACCORD_STALL_SHUTDOWN_TIME_SECONDS"):
        overrides["stall_shutdown_time"] = timeout_s
        if not config.is_set("ACCORD_STALL_CHECK_TIME_SECONDS"):
            overrides["stall_check_time"] = min(_WARN_BEFORE_S, timeout_s / 2)
    return overrides
