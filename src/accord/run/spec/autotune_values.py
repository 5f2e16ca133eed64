"""The values of horovodrun's autotune settings: the ``--autotune-*`` flags and the ``autotune``
section of ``--config-file``.

accord has no autotuner and ignores these settings (with one warning), but a value that no
autotuner could use (0 or -2 samples, a noise of NaN or below 0, "three") is a mistake in the
command line all the same: it is refused as other bad input is, exit 2 with a HINT, before
anything starts. The HINT gives horovodrun's default.
"""
from __future__ import annotations

import argparse
import math
import re
from typing import Any

from accord.errors import ConfigError, with_hint

# argparse dest -> (the flag, "count" or "noise", horovodrun's default)
SETTINGS: dict[str, tuple[str, str, str]] = {
    "hvd_autotune_warmup_samples": ("--autotune-warmup-samples", "count", "3"),
    "hvd_autotune_steps_per_sample": ("--autotune-steps-per-sample", "count", "10"),
    "hvd_autotune_bayes_opt_max_samples": ("--autotune-bayes-opt-max-samples", "count", "20"),
    "hvd_autotune_gaussian_process_noise": ("--autotune-gaussian-process-noise", "noise", "0.8"),
}
# A count as typed: digits only (int() alone would also take "+3", " 3", "1_0").
_DIGITS = re.compile(r"[0-9]+")


def _count(value: Any) -> int | None:
    """The count ``value`` holds (text of digits or an int, not a bool), else None."""
    if isinstance(value, bool):  # YAML's true would otherwise be 1
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def _noise(value: Any) -> float | None:
    """The number ``value`` holds (text or a number, not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_value(dest: str, value: Any, where: str) -> None:
    """Refuse an autotune setting no autotuner could use; ``where`` names it in the message
    (the flag, or the config file's key). Other dests and None pass.

    Raises:
        ConfigError: a count that is not a whole number >= 1, or a noise that is not a finite
            number >= 0.
    """
    if dest not in SETTINGS or value is None:
        return
    flag, kind, default = SETTINGS[dest]
    if kind == "count":
        count = _count(value)
        if count is None or count < 1:
            raise ConfigError(with_hint(
                f"{where} must be a whole number >= 1 written in digits, got {value!r}",
                f"use a count such as {default} (horovodrun's default for {flag}); accord's engine "
                "has no autotuner and ignores it"))
        return
    noise = _noise(value)
    if noise is None or not math.isfinite(noise) or noise < 0:
        raise ConfigError(with_hint(
            f"{where} must be a finite number >= 0, got {value!r}",
            f"use a value such as {default} (horovodrun's default for {flag}); accord's engine has "
            "no autotuner and ignores it"))


def check_flags(ns: argparse.Namespace) -> None:
    """Check the ``--autotune-*`` values on ``ns`` (see :func:`check_value`)."""
    for dest, (flag, _, _) in SETTINGS.items():
        check_value(dest, getattr(ns, dest, None), flag)
