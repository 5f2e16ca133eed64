"""Checks of single accordrun flag values: numbers, ports and counts in range, and flags that
name something (a file, an address) given empty. Each raises ConfigError with a HINT (exit 2)."""
from __future__ import annotations

import argparse

from accord.errors import ConfigError, with_hint
from accord.run.assignment import check_count
from accord.run.tuning import check_number


def positive(value: float | None, flag: str, allow_zero: bool = False) -> None:
    """Refuse a number flag below 0 (or at 0 unless ``allow_zero``)."""
    check_number(value, flag, ">=0" if allow_zero else ">0")


def port(value: int | None, flag: str) -> int:
    """A port flag: 0 (a free port) when not given; refused outside 0..65535."""
    if value is None:
        return 0
    if not 0 <= value <= 65535:
        raise ConfigError(with_hint(f"{flag} must be between 0 and 65535, got {value}",
                                    f"pass {flag} 0 (or leave it out) for a free port"))
    return value


def count(text: str | None, flag: str) -> int:
    """A non-negative integer flag given as text (so that "two" and "-1" get a precise HINT)."""
    if text is None:
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(with_hint(f"{flag} must be a whole number >= 0, got {text!r}",
                                    f"pass {flag} 0 (no servers, the default) or a count, e.g. {flag} 2"))
    check_count(value, flag)  # a placement list of that length is built next
    return value


# Flags whose value names something: an empty one (often an unset shell variable) is a mistake,
# not a request for the default, which leaving the flag out gives.
_NAMING_FLAGS = (("master_addr", "--master-addr"), ("network_interface", "--network-interface"),
                 ("output_filename", "--output-filename"), ("timeline_filename", "--timeline-filename"))


def no_empty_values(ns: argparse.Namespace) -> None:
    """Refuse a flag of :data:`_NAMING_FLAGS` given as an empty or blank value."""
    for dest, flag in _NAMING_FLAGS:
        value = getattr(ns, dest, None)
        if value is not None and not value.strip():
            raise ConfigError(with_hint(f"{flag} is empty, got {value!r}",
                                        f"pass {flag} with a value, or leave it out for the default"))
