"""Files accord writes in folders the user names (per-rank output, timelines), opened so that a
link another user planted there cannot turn the write into one of someone else's files.

The folder the user names is taken as given (symbolic links in it are the user's choice). Each
folder accord enters or creates below it is opened with ``O_NOFOLLOW | O_DIRECTORY`` (one
``openat`` per component, so no path is resolved twice), the file with ``O_NOFOLLOW |
O_NONBLOCK`` (a FIFO cannot stall the open), and both are checked on the open descriptor:
owned by this process's effective user, the file regular with a single link. Only then is the
file truncated. Anything else is refused with a :class:`~accord.errors.ConfigError` naming the
path and what was found: a job run as root would otherwise overwrite whatever file the link
points at.
"""
from __future__ import annotations

import os
import stat
from typing import IO, Sequence

from accord.errors import ConfigError, with_hint

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)


def _refuse(what: str, path: str, found: str) -> ConfigError:
    return ConfigError(with_hint(
        f"{what}: {path} {found}; accord does not write through it (a link or file another user "
        "put in the folder would make this job overwrite the file it points at)",
        f"remove {path}, or name a folder only you can write to"))


def _owner_problem(st: os.stat_result) -> str | None:
    euid = os.geteuid()
    return None if st.st_uid == euid else f"is owned by uid {st.st_uid}, not by this process's uid {euid}"


def _enter(parent_fd: int, name: str, path: str, what: str) -> int:
    """Open (creating it if missing) folder ``name`` under ``parent_fd`` without following a link."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(what, path, "is a symbolic link") from None
        raise _refuse(what, path, f"cannot be opened as a folder ({exc.strerror})") from None
    problem = _owner_problem(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        raise _refuse(what, path, problem)
    return fd


def open_for_writing(base: str, parts: Sequence[str], what: str, mode: str = "wb",
                     buffering: int = -1, encoding: str | None = None) -> IO:
    """Open ``base/parts[0]/.../parts[-1]`` for writing from its start, creating the folders
    and the file that are missing (see the module doc for what is refused).

    Args:
        base: the folder the user named (followed as given).
        parts: the folders below it and the file's name, one component each.
        what: the flag or variable the path came from, for the error.

    Raises:
        ConfigError: a component is a link, not a folder or not a regular file, is owned by
            another user, or the file has other links.
        OSError: the folder or file cannot be created or opened (permissions, a missing base).
    """
    *folders, name = parts
    dir_fd = os.open(base, _DIR_FLAGS)
    path = base
    try:
        for folder in folders:
            path = os.path.join(path, folder)
            inner = _enter(dir_fd, folder, path, what)
            os.close(dir_fd)
            dir_fd = inner
        path = os.path.join(path, name)
        try:
            fd = os.open(name, _FILE_FLAGS, 0o666, dir_fd=dir_fd)
        except OSError as exc:
            if os.path.islink(path):
                raise _refuse(what, path, "is a symbolic link") from None
            if exc.errno is not None and os.path.exists(path) and not os.path.isfile(path):
                raise _refuse(what, path, "is not a regular file") from None
            raise
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        problem = (None if stat.S_ISREG(st.st_mode) else "is not a regular file") or _owner_problem(st) or (
            None if st.st_nlink == 1 else f"has {st.st_nlink} hard links")
        if problem is not None:
            raise _refuse(what, path, problem)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, buffering=buffering, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise
