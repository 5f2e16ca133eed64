"""Paddle-style progress output: ``step 400/938 - loss: 0.1245 - acc: 0.8618 - 5ms/step``.

On a terminal (and ``verbose=1``) the line is redrawn in place with a bar; anywhere else (a log
file, a pipe, accordrun's prefixed output) each update is a new line, so logs stay readable.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Sequence

Values = Sequence[tuple[str, float]]


def format_value(value: float) -> str:
    """Four decimals, or scientific notation for tiny magnitudes (Paddle's rule)."""
    value = float(value)
    return f"{value:.4f}" if value == 0 or abs(value) > 1e-3 else f"{value:.4e}"


def format_time_per_step(seconds: float, unit: str = "step") -> str:
    """``5ms/step``, ``2s/step`` or ``450us/step``."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.0f}s/{unit}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/{unit}"
    return f"{seconds * 1e6:.0f}us/{unit}"


def format_values(values: Values) -> str:
    """`` - loss: 0.1245 - acc: 0.8618`` (empty when there are no values)."""
    return "".join(f" - {name}: {format_value(v)}" for name, v in values)


def is_tty(stream: IO[str]) -> bool:
    """True when ``stream`` is an interactive terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real file
        return False


class ProgressBar:
    """Report ``step current/total`` with values and the mean time per step.

    Args:
        total: steps in the loop (None when unknown).
        verbose: 1 = bar redrawn in place when ``stream`` is a terminal, else lines; 2 = lines.
        stream: where to write (default: ``sys.stdout`` at construction).
        width: characters of the bar.
        tty: override terminal detection (tests).
    """

    def __init__(self, total: int | None, verbose: int = 1, stream: IO[str] | None = None,
                 width: int = 30, tty: bool | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.width = width
        self.in_place = verbose == 1 and (is_tty(self.stream) if tty is None else tty)
        self.start = time.perf_counter()
        self._drawn = False

    def _bar(self, current: int) -> str:
        if not self.total:
            return ""
        done = int(self.width * min(current, self.total) / self.total)
        if done >= self.width:
            return " [" + "=" * self.width + "]"
        return " [" + "=" * done + ">" + "." * (self.width - done - 1) + "]"

    def line(self, current: int, values: Values, seconds_per_step: float | None = None) -> str:
        """The text of one update (without a line ending)."""
        if seconds_per_step is None:
            seconds_per_step = (time.perf_counter() - self.start) / max(current, 1)
        total = f"/{self.total}" if self.total else ""
        bar = self._bar(current) if self.in_place else ""
        return (f"step {current}{total}{bar}{format_values(values)}"
                f" - {format_time_per_step(seconds_per_step)}")

    def update(self, current: int, values: Values, seconds_per_step: float | None = None) -> None:
        """Write the state after ``current`` steps."""
        text = self.line(current, values, seconds_per_step)
        if self.in_place:
            self.stream.write("\r" + text + "\x1b[K")  # clear what a longer earlier line left
            self._drawn = True
            if self.total and current >= self.total:
                self.finish()
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End an in-place bar with a newline (no-op for line output)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
