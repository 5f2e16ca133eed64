"""``--timeline-filename`` (or ``timeline.filename`` of ``--config-file``) checked on the launch
host before anything starts.

Rank 0 opens the timeline file when its engine starts (``hvd.init()``) and the job fails there
when it cannot. The launcher can only look at its own files, so the path is checked only when
rank 0 starts on this host, and only what is certainly wrong is refused (exit 2): a path that is
an existing folder, or one below an existing file (no folder can be made there). A folder that
does not exist yet is a warning, not an error: the program may create it before ``hvd.init()``.
When rank 0 starts on another host, this host's files say nothing about that host's: nothing is
checked and nothing is said.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from accord.config import DYNAMIC_TIMELINE
from accord.errors import ConfigError, with_hint
from accord.run.spec.hosts import is_local

if TYPE_CHECKING:
    from accord.run.config.launch_config import LaunchConfig

FLAG = "--timeline-filename"


def _nearest_existing(path: str) -> str:
    """The closest folder above ``path`` (an absolute path) that exists, or the first thing
    above it that exists and is not a folder."""
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return parent


def check_path(path: str) -> list[str]:
    """Check a timeline path on this host (made absolute: the walk up to an existing folder
    needs a root to end at); return warnings (a missing folder).

    Raises:
        ConfigError: ``path`` is an existing folder, or something above it is a file.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise ConfigError(with_hint(
            f"{FLAG} {path!r} is a folder on this host, where rank 0 runs; rank 0 writes the timeline "
            "to a file of that name",
            f"name a file, e.g. {FLAG} {os.path.join(path, 'timeline.json')}"))
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        raise ConfigError(with_hint(
            f"{FLAG} {path!r}: {existing!r} is a file on this host, where rank 0 runs, so no folder "
            "can hold the timeline there",
            f"name a file in a folder, e.g. {FLAG} {os.path.join(os.path.dirname(existing), 'timeline.json')}"))
    folder = os.path.dirname(path)
    if existing != folder:
        return [f"{FLAG} {path}: the folder {folder} does not exist on this host, where rank 0 runs; "
                f"rank 0 cannot write the timeline unless the program creates it before hvd.init() "
                f"(mkdir -p {folder})"]
    return []


def check(cfg: LaunchConfig) -> list[str]:
    """Check the job's timeline path when its first rank 0 starts on this host (see the module
    docstring); return warnings.

    Raises:
        ConfigError: a path that is certainly unusable on this host.
    """
    path = cfg.tuning.timeline_filename
    # No slot yet (a discovery script that printed no host): rank 0's host is not known.
    if not path or path == DYNAMIC_TIMELINE or not cfg.slots or not is_local(cfg.slots[0].hostname):
        return []
    return check_path(path)
