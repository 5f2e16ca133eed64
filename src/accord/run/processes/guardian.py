"""Starting and stopping worker processes on this host, and the guardian.

Every worker starts in its own session (``start_new_session=True``), so it and everything it
starts share one process group that can be signalled as a whole (and a Ctrl-C in the terminal
reaches only the launcher, which forwards it).

Workers must not outlive the launcher, even when the launcher is SIGKILLed. We use a
*guardian*: a tiny Python process (:mod:`accord.run.processes.guardian_program`, standard
library only), in its own session, that reads a pipe from the launcher. The launcher writes
``+PGID`` for each worker group it starts. When the pipe reaches end-of-file without a ``q`` first (the launcher died),
the guardian sends SIGTERM to every group, waits the grace period and sends SIGKILL, then
removes the directories the launcher named with ``dPATH`` (the job's directory: error files,
parameter servers' Unix sockets), so that not even a SIGKILLed launcher leaves them. We chose
this over ``prctl(PR_SET_PDEATHSIG)``: that needs a ``preexec_fn`` (unsafe in a process with
threads, as accord.spawn's parent may be), follows the *thread* that forked rather than the
process, and reaches only the direct child, not the worker's own children.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable, Mapping, Sequence

# The guardian runs its own file by path in an isolated interpreter (-I -S), not as
# ``python -m accord...``: an isolated interpreter without site does not find accord at all
# (ModuleNotFoundError), and without -I -S the user's PYTHONPATH, PYTHONSTARTUP and site hooks
# run inside the watchdog, and it starts later (measured on 2 busy cores, 40 starts each: about
# 35-43 ms by path with -I -S, 51-67 ms with -m). It imports nothing of accord.
PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guardian_program.py")


class Guardian:
    """The launcher-death watchdog (see the module docstring)."""

    def __init__(self, grace: float) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", PROGRAM, str(grace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The guardian's process id."""
        return self._proc.pid

    def watch(self, pgid: int) -> None:
        """Kill process group ``pgid`` if the launcher dies."""
        self._send(f"+{pgid}\n")

    def remove_on_death(self, path: str) -> None:
        """Remove directory ``path`` if the launcher dies (after its processes are stopped)."""
        if "\n" in path:
            raise ValueError(f"a directory name with a newline cannot be sent to the guardian: {path!r}")
        self._send(f"d{path}\n")

    def forget(self, pgid: int) -> None:
        """Stop watching ``pgid`` (it has been dealt with)."""
        self._send(f"-{pgid}\n")

    def close(self) -> None:
        """Normal end: tell the guardian to exit without killing anything."""
        self._send("q\n")
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, text: str) -> None:
        if self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(text.encode())
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass  # guardian gone: nothing more we can do from here


def start_process(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None = None,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start one worker (or ssh client) in a new session with piped stdout/stderr.

    Raises:
        OSError: the executable does not exist or cannot run (FileNotFoundError, ...).
    """
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` is still running.

    Zombies do not count: an orphan is reaped by init, and some inits (in containers and
    micro-VMs) do that lazily, which would otherwise stretch every stop to the full grace.
    """
    if not signal_group(pgid, 0):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no procfs: trust the signal check
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # after the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def stop_groups(
    pgids: Iterable[int],
    grace: float,
    reap: Callable[[], bool] | None = None,
    first_signal: int = signal.SIGTERM,
    poll: float = 0.05,
) -> list[int]:
    """Send ``first_signal`` to every group, wait up to ``grace`` seconds, SIGKILL what is left.

    Args:
        reap: called while waiting, to collect exited children (an unreaped zombie still
            counts as a member of its group); returning True ends the grace period early.

    Returns:
        The groups that needed SIGKILL.
    """
    groups = [g for g in pgids if signal_group(g, first_signal)]
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
        if reap is not None and reap():
            break
        groups = [g for g in groups if group_alive(g)]
        if groups:
            time.sleep(poll)
    return [g for g in groups if signal_group(g, signal.SIGKILL)]
