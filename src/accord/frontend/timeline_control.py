"""Horovod's ``start_timeline`` / ``stop_timeline``, for every frontend: the engine's
chrome://tracing timeline, switched on and off while the job runs."""
from __future__ import annotations

from accord import engine
from accord.frontend.queries import NOT_INITIALIZED


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a chrome://tracing timeline of the engine to ``file_path`` (rank 0).

    Args:
        file_path: the JSON file to write (open it in chrome://tracing or Perfetto).
        mark_cycles: also mark each engine cycle's start (Horovod's ``HOROVOD_TIMELINE_MARK_CYCLES``).

    Raises:
        ValueError: accord is not initialized (Horovod's message).
    """
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    engine.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Finish and close the timeline file.

    Raises:
        ValueError: accord is not initialized (Horovod's message).
    """
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    engine.stop_timeline()
