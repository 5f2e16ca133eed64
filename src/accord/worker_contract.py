"""What a worker and its launcher agree on besides the environment: check-in and error files,
and the program a parameter server runs (:func:`server_command`).

Both sides import this module from below (the launcher in :mod:`accord.run`, the worker side in
:mod:`accord.runtime`), so neither reaches into the other; the environment variables themselves
are documented in :mod:`accord.run.spec.worker_env`.

Check-in: a worker that uses accord's init sets the store key ``CHECKIN_KEY.format(rank=r)``
(``accord/checkin/<rank>``) once it has reached the launcher's store; the launcher's
``--start-timeout`` watches these keys.

Error files: when ``ACCORD_ERROR_FILE`` is set (accordrun sets it for every local worker), the
worker writes the exception's type, message and traceback as JSON to that path; the launcher's
root-cause report shows it instead of guessing from stderr. Two ways in:

- :func:`install` (accord's bootstrap calls it): a ``sys.excepthook`` that records, then hands
  over to the previous hook (so the traceback is still printed).
- :func:`record`: a decorator for entry points of scripts that do not call accord's init::

      from accord.worker_contract import record

      @record
      def main(): ...

The file format (one JSON object): ``{"type", "message", "traceback", "timestamp", "pid"}``.

Shared-memory segments (the ``shm`` backend, :mod:`accord.comm.shm.segment`) are files named
``accord-shm-<pid of their creator>-<random>`` in :func:`shm_segment_dir`. The creator's peers
unlink one once they have mapped it; a creator killed before it shared the name leaves the file,
and its launcher removes it (:func:`remove_shm_segments`) once the process has exited.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import traceback
from types import TracebackType
from typing import Any, Callable, TypeVar

from accord import settings

CHECKIN_KEY = "accord/checkin/{rank}"  # the store key a worker sets once it has connected
# The program of one parameter server (``python -m`` it): the launcher starts it without
# importing the parameter-server package, which imports the launcher's nothing either.
SERVER_MODULE = "accord.kvstore.server"

# Elastic jobs (hvd.elastic.run under accordrun): the store keys launcher and workers share.
# Workers are named by a stable member id (their first rank; later workers get the next ids).
ELASTIC_UPDATES_KEY = "accord/elastic/updates"  # counter, bumped on every host change
ELASTIC_UPDATE_KEY = "accord/elastic/update/{n}"  # what change n was: "added" or "removed"
ELASTIC_LEAVING_KEY = "accord/elastic/leaving/{member}"  # the launcher removes this member
ELASTIC_DEAD_KEY = "accord/elastic/dead/{member}"  # the launcher saw this member's process end
ELASTIC_LAUNCHED_KEY = "accord/elastic/launched"  # counter of workers the launcher added
ELASTIC_LAUNCH_KEY = "accord/elastic/launch/{n}"  # the member id of added worker n
ELASTIC_JOINERS_KEY = "accord/elastic/joiners"  # counter of workers that asked to join
ELASTIC_JOINER_KEY = "accord/elastic/joiner/{n}"  # the member id of joiner n
ELASTIC_LATEST_KEY = "accord/elastic/latest"  # counter: the last re-formation published
ELASTIC_MEMBERS_KEY = "accord/elastic/e{epoch}/members"  # JSON of re-formation ``epoch``

SHM_SEGMENT_PREFIX = "accord-shm-"  # then the creator's pid, "-", a random part

F = TypeVar("F", bound=Callable[..., Any])
_INSTALLED_MARK = "_accord_error_file_hook"


def error_payload(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    """The JSON-ready description of an exception."""
    return {
        "type": f"{exc_type.__module__}.{exc_type.__qualname__}" if exc_type.__module__ != "builtins"
        else exc_type.__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc_type, exc, tb)),
        "timestamp": time.time(),
        "pid": os.getpid(),
    }


def write_error(exc: BaseException, path: str | None = None) -> str | None:
    """Write ``exc`` to ``path`` (default: ``ACCORD_ERROR_FILE``); return the path or None.

    The first error wins: an existing file is not overwritten, so the root cause survives
    errors raised while the process shuts down.
    """
    target = path if path is not None else settings.error_file()
    if not target or os.path.exists(target):
        return None
    payload = error_payload(type(exc), exc, exc.__traceback__)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
        os.replace(tmp, target)  # readers never see half a file
    except OSError:
        return None  # reporting must never replace the real error with its own
    return target


def read_error_file(path: str) -> dict[str, Any] | None:
    """Read an error file; None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def install() -> None:
    """Record uncaught exceptions in ``ACCORD_ERROR_FILE`` (idempotent; chains the previous hook)."""
    previous = sys.excepthook
    if getattr(previous, _INSTALLED_MARK, False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):
            exc.__traceback__ = tb
            write_error(exc)
        previous(exc_type, exc, tb)

    setattr(hook, _INSTALLED_MARK, True)
    sys.excepthook = hook


def record(fn: F) -> F:
    """Decorator: an exception escaping ``fn`` is written to the error file, then re-raised."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SystemExit:
            raise
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt):
                write_error(exc)
            raise

    return wrapper  # type: ignore[return-value]


def server_command(python: str | None = None) -> list[str]:
    """The argv of one parameter server (this Python unless ``python`` is given)."""
    return [python or sys.executable, "-m", SERVER_MODULE]


def shm_segment_dir() -> str:
    """Where shared-memory segments are created: /dev/shm if usable, else the temporary directory."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def remove_shm_segments(pid: int) -> list[str]:
    """Remove the shared-memory segments process ``pid`` created and left behind (call it once
    that process has exited: a live one may still be sharing the name); return their paths."""
    directory = shm_segment_dir()
    prefix = f"{SHM_SEGMENT_PREFIX}{pid}-"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(path)
    return removed
