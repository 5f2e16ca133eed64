"""The one table of tuning options: accordrun's flag, ``accord.spawn``'s keyword, the
:class:`Tuning` field and the worker variable, declared once per option.

``accordrun --cycle-time-ms 2`` and ``accord.spawn(fn, cycle_time_ms=2)`` both become
``ACCORD_CYCLE_TIME=2`` in every worker. To add a tuning option: a row here and the variable in
:mod:`accord.config` (the CLI flag, the spawn keyword and the environment follow from the row).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Mapping

from accord import config
from accord.errors import ConfigError, with_hint


def render_number(value: float) -> str:
    """Render 5.0 as "5" and 0.5 as "0.5" (both parse as the variable's type)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _mebibytes_to_bytes(value: float) -> str:
    return str(int(round(value * 1024 * 1024)))


# The largest fusion buffer accepted, in MiB: 2**20 MiB is 1 TiB, beyond any device's memory
# and far below where the byte count (MiB * 2**20) would overflow the engine's int64.
MAX_FUSION_MB = 2 ** 20
_FUSION_BOUND = (MAX_FUSION_MB, "that is 1 TiB, and every rank holds a fusion buffer of this size in "
                                "memory, more than any device has (Horovod's default is 64 MiB)")


@dataclass(frozen=True)
class TuningOption:
    """One row of the table.

    ``name`` is the :class:`Tuning` field, the spawn keyword and the argparse dest. ``kind``:
    ``float``, ``int``, ``str``, ``flag`` (on when given: the variable gets ``flag_value``) or
    ``level`` (an int, 0 = off). ``minimum``: ``">0"`` or ``">=0"`` for numbers; ``maximum``:
    the largest number accepted and why, for the message. ``cli``: False
    when accordrun's flag for it lives with another group of :mod:`accord.run.cli` (it still maps
    to the variable here).
    """

    name: str
    variable: str
    kind: str
    help: str
    render: Callable[[Any], str] = str
    minimum: str | None = None
    cli: bool = True
    flag_value: str = "1"
    maximum: tuple[float, str] | None = None

    @property
    def flag(self) -> str:
        """accordrun's flag: the name with dashes."""
        return "--" + self.name.replace("_", "-")

    def given(self, value: Any) -> bool:
        """Whether ``value`` sets the variable (None, False and level 0 leave it unset)."""
        return bool(value) if self.kind in ("flag", "level") else value is not None

    def to_env(self, value: Any) -> str:
        """The variable's text for ``value``."""
        if self.kind == "flag":
            return self.flag_value
        if self.kind == "level":
            return str(int(value))
        return self.render(value)


OPTIONS: tuple[TuningOption, ...] = (
    TuningOption("fusion_threshold_mb", "ACCORD_FUSION_THRESHOLD", "float",
                 f"fusion buffer size in MiB, 0 to {MAX_FUSION_MB} (0: no fusion)", _mebibytes_to_bytes,
                 ">=0", maximum=_FUSION_BOUND),
    TuningOption("cycle_time_ms", "ACCORD_CYCLE_TIME", "float", "engine cycle time in milliseconds",
                 render_number, ">0"),
    TuningOption("timeline_filename", "ACCORD_TIMELINE", "str", "write a chrome://tracing timeline here"),
    TuningOption("stall_check_warning_time_seconds", "ACCORD_STALL_CHECK_TIME_SECONDS", "float",
                 "warn after this long stalled", render_number, ">0"),
    TuningOption("stall_check_shutdown_time_seconds", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS", "float",
                 "fail after this long stalled", render_number, ">=0"),
    TuningOption("no_stall_check", "ACCORD_STALL_CHECK_DISABLE", "flag", "turn the stall inspector off"),
    TuningOption("hierarchical_allreduce", "ACCORD_HIERARCHICAL_ALLREDUCE", "flag",
                 "allreduce within hosts, then across"),
    TuningOption("no_hierarchical_allreduce", "ACCORD_HIERARCHICAL_ALLREDUCE", "flag",
                 "never allreduce hierarchically (default: chosen by timing on several hosts)",
                 flag_value="0"),
    TuningOption("timeline_mark_cycles", "ACCORD_TIMELINE_MARK_CYCLES", "flag",
                 "mark engine cycles in the timeline"),
    TuningOption("cache_capacity", "ACCORD_CACHE_CAPACITY", "int",
                 "tensor names whose agreed signature the engine remembers", minimum=">=0"),
    TuningOption("gloo_timeout_seconds", "ACCORD_COLLECTIVE_TIMEOUT", "float",
                 "seconds a collective waits for a peer before the rank counts as lost",
                 render_number, ">0"),
    # Flags that accordrun shows with other groups (output, rendezvous):
    TuningOption("log_level", "ACCORD_LOG_LEVEL", "str", "accord's log level in workers", cli=False),
    TuningOption("network_interface", "ACCORD_INTERFACE", "str", "interface to bind and advertise",
                 cli=False),
    TuningOption("verbose", "ACCORD_VERBOSE", "level", "say what the launcher does", cli=False),
    TuningOption("start_timeout", "ACCORD_START_TIMEOUT", "float",
                 "seconds for every rank to check in at the rendezvous", render_number, ">0", cli=False),
)
BY_NAME: dict[str, TuningOption] = {o.name: o for o in OPTIONS}

_DEFAULTS = {"flag": False, "level": 0}

Tuning = make_dataclass(
    "Tuning",
    [(o.name, Any, field(default=_DEFAULTS.get(o.kind))) for o in OPTIONS],
    frozen=True,
)
Tuning.__module__ = __name__
Tuning.__doc__ = ("Tuning options given on the command line or to accord.spawn (one field per row "
                  "of OPTIONS); None / False / 0 leave the worker's default.")


def tuning_env(tuning: Any) -> dict[str, str]:
    """The worker variables of the options ``tuning`` sets (only the ones given)."""
    env: dict[str, str] = {}
    for option in OPTIONS:
        value = getattr(tuning, option.name)
        if option.given(value):
            env[option.variable] = option.to_env(value)
    return env


def check_number(value: float | None, flag: str, minimum: str | None) -> None:
    """Refuse NaN, infinity and values below ``minimum`` (``">0"`` / ``">=0"``) with a HINT."""
    if value is None:
        return
    if not math.isfinite(value):
        raise ConfigError(with_hint(f"{flag} must be a finite number, got {value!r}",
                                    f"pass {flag} with a number such as 5"))
    if minimum is None:
        return
    if value < 0 or (value == 0 and minimum == ">0"):
        bound = "> 0" if minimum == ">0" else ">= 0"
        raise ConfigError(with_hint(f"{flag} must be {bound}, got {value:g}", f"pass {flag} with a value {bound}"))


def check_maximum(value: float, option: TuningOption) -> None:
    """Refuse a number above ``option.maximum``, saying why the bound is there."""
    if option.maximum is None or value <= option.maximum[0]:
        return
    bound, why = option.maximum
    raise ConfigError(with_hint(f"{option.flag} must be at most {render_number(bound)}: {why}; got {value:.15g}",
                                f"pass {option.flag} with a value of at most {render_number(bound)}"))


def make_tuning(values: Mapping[str, Any], where: str) -> Any:
    """A :class:`Tuning` from ``{option name: value}``, numbers checked.

    Raises:
        ConfigError: an unknown option name (``where`` says whose), or a bad number.
    """
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise ConfigError(with_hint(f"{where} got unknown tuning options {unknown}",
                                    f"use some of {sorted(BY_NAME)}"))
    for name, value in values.items():
        option = BY_NAME[name]
        if option.kind in ("float", "int") and value is not None:
            check_number(float(value), option.flag, option.minimum)
            check_maximum(float(value), option)
    by_variable: dict[str, list[str]] = {}
    for name, value in values.items():
        if BY_NAME[name].given(value):
            by_variable.setdefault(BY_NAME[name].variable, []).append(BY_NAME[name].flag)
    clashes = [flags for flags in by_variable.values() if len(flags) > 1]
    if clashes:
        raise ConfigError(with_hint(f"{where}: {' and '.join(clashes[0])} contradict each other",
                                    "give only one of them"))
    return Tuning(**values)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """accordrun's tuning flags (the rows shown in the tuning group)."""
    for option in OPTIONS:
        if not option.cli:
            continue
        if option.kind == "flag":
            group.add_argument(option.flag, action="store_true", help=option.help)
        else:
            kind = {"float": config.finite_float, "int": int}.get(option.kind, str)
            group.add_argument(option.flag, type=kind, help=option.help)
