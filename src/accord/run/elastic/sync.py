"""``--sync-dst-dir`` in an elastic job: the working folder reaches a host before its first worker.

The launcher copies to the job's first hosts before anything starts (:mod:`accord.run.processes.folder_copy`).
A host the discovery script prints later is copied to when the elastic driver
(:mod:`accord.run.elastic.driver`) is about to start its first worker there.

The copies run in the background (:meth:`HostCopies.begin`): an rsync takes seconds, during
which the driver keeps reaping failures, following the hosts and answering signals. A host gets
its workers at the driver's first turn after its copy succeeded (:meth:`HostCopies.finished`).
A failed copy to a host the running job grows onto is handled as a worker that could not be
started there (a warning, the host blacklisted; it is copied to again if it comes back); while
the job waits for its first ``-np`` slots (no worker runs yet) it fails the job, as a failed
copy at the launch does.

Each host is copied to once; every name of this machine is one host, "this host"
(:func:`accord.run.spec.hosts.is_local`), as at the launch.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Protocol, Sequence

from accord.errors import LaunchError
from accord.run.elastic.plan import plan_changes
from accord.run.processes.folder_copy import Copy
from accord.run.spec.hosts import HostSlots, is_local


class Copier(Protocol):
    """What :class:`HostCopies` copies with (:class:`accord.run.processes.folder_copy.FolderCopy`)."""

    @property
    def timeout(self) -> float: ...  # seconds one copy may take

    def start(self, host: str | None) -> Copy | None: ...

    def error(self, failed: Sequence[str]) -> LaunchError: ...


def host_key(host: str) -> str | None:
    """The copy ``host`` needs: None for every name of this machine, else the host itself."""
    return None if is_local(host) else host


class HostCopies:
    """The hosts of an elastic job that hold the copy, and the copies running (module docstring).

    Args:
        copier: starts and describes copies.
        copied: hosts copied to already (the job's first hosts, copied at the launch).
        clock: seconds, for the copies' timeout (``copier.timeout``).
    """

    def __init__(self, copier: Copier, copied: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._copier = copier
        self._copied: set[str | None] = {host_key(h) for h in copied}
        self._running: dict[str | None, tuple[str, Copy, float]] = {}  # key: (host named, copy, since)
        self._ended: list[tuple[str, LaunchError | None]] = []
        self._clock = clock

    def copied(self, host: str) -> bool:
        """True when ``host`` holds the copy (its workers may start)."""
        return host_key(host) in self._copied

    def begin(self, hosts: Sequence[str]) -> list[str]:
        """Start copying, in the background, to each of ``hosts`` that neither holds the copy nor
        is being copied to; return the hosts a copy started for. A copy that cannot even start
        (rsync missing) is reported by the next :meth:`finished`."""
        begun = []
        for host in dict.fromkeys(hosts):
            key = host_key(host)
            if key in self._copied or key in self._running:
                continue
            try:
                copy = self._copier.start(key)
            except LaunchError as exc:
                self._ended.append((host, exc))
                continue
            if copy is None:  # nothing to copy (this host, where the copy's folder is the source)
                self._copied.add(key)
                continue
            self._running[key] = (host, copy, self._clock())
            begun.append(host)
        return begun

    def finished(self) -> list[tuple[str, LaunchError | None]]:
        """The copies that ended since the last call: ``(host, None)`` for a host that now holds
        the copy, ``(host, error)`` for a failed one (the host may be tried again later). A copy
        running longer than the copier's timeout is stopped and failed."""
        now = self._clock()
        ended, self._ended = self._ended, []
        for key, (host, copy, since) in list(self._running.items()):
            if not copy.done():
                if now - since <= self._copier.timeout:
                    continue
                copy.stop()
            del self._running[key]
            failure = copy.failure()
            if failure is None:
                self._copied.add(key)
                ended.append((host, None))
            else:
                ended.append((host, self._copier.error([failure])))
        return ended

    # --- what the elastic driver asks --------------------------------------------------------
    def first_hosts_ready(self, hosts: Sequence[str], announce: Callable[[list[str]], None]) -> bool:
        """True once every one of ``hosts`` (the first workers') holds the copy; the copies they
        still need begin (``announce`` gets the hosts a copy began for).

        Raises:
            LaunchError: a copy to one of them failed (the job fails to start, as when a copy at
                the launch fails).
        """
        announce(self.begin(hosts))
        for host, error in self.finished():
            if error is not None and host in hosts:  # another host's is tried again when it is needed
                raise error
        return all(self.copied(h) for h in hosts)

    def hosts_ready(self, usable: Sequence[HostSlots], active: Sequence[tuple[int, str]], max_np: int | None,
                    failed: Callable[[str, LaunchError], None], blocked: Callable[[], set[str]],
                    announce: Callable[[list[str]], None]) -> list[HostSlots]:
        """The ``usable`` hosts that may get workers now: those holding the copy or already
        running workers (``active``: ``(id, host)`` of the running ones). Copies begin for the
        others the plan would give workers; a failed copy goes to ``failed`` (the driver
        blacklists the host, as for a worker that cannot be started), and ``blocked()`` then
        names the hosts left out."""
        for host, error in self.finished():
            if error is not None:
                failed(host, error)
        left_out = blocked()
        usable = [h for h in usable if h.hostname not in left_out]
        announce(self.begin(plan_changes(usable, list(active), max_np).start))
        running = {host for _, host in active}
        return [h for h in usable if h.hostname in running or self.copied(h.hostname)]

    def close(self) -> None:
        """Stop the copies still running (the job is over)."""
        for _, copy, _ in self._running.values():
            copy.stop()
            copy.failure()  # closes its message file
        self._running.clear()
