"""Host discovery for elastic jobs: ``--host-discovery-script`` (Horovod's contract).

The script is run through the shell, periodically (``--discovery-interval``); what it prints
on stdout is the set of hosts the job may use now, one per line: ``host:slots``, or a bare
``host`` that gets ``--slots-per-host`` slots, read as ``-H`` reads its items (IPv6 addresses in
brackets, ``[::1]:2``; slot counts in plain digits). Blank lines and ``#`` comments are skipped; a
host named twice keeps the last count. Output that is not of this form, a non-zero exit or a
script that does not answer within its timeout is a :class:`DiscoveryError`, naming the script
and what it did; the launcher then warns and keeps the hosts it has (see
:mod:`accord.run.elastic.driver`). The parsing is pure; :class:`DiscoveryPoller` runs the script
on a thread, so a hanging script never blocks the launcher's watch loop.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

from accord.errors import ConfigError, LaunchError, with_hint
from accord.run.spec.assignment import MAX_WORKERS
from accord.run.spec.hosts import HostSlots, check_name, is_plain_count, split_host_item

_STDERR_TAIL = 400  # characters of the script's stderr quoted in a warning


class DiscoveryError(LaunchError):
    """The discovery script failed, hung or printed something that is not a host list."""


def parse_discovery_output(text: str, default_slots: int | None, script: str) -> list[HostSlots]:
    """The hosts in a discovery script's output, in the order printed.

    Example: ``parse_discovery_output("h1:2\\nh2\\n", 4, "./d.sh")`` -> h1 with 2 slots, h2 with 4.

    Raises:
        DiscoveryError: a line that is not ``host`` or ``host:slots`` (slots a positive
            integer), or a bare host without ``--slots-per-host``.
    """
    found: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"line {number} {raw.strip()[:80]!r}"
        try:
            name, slots_text = split_host_item(line, "discovery")
            host = check_name(name.strip(), "discovery")
        except ConfigError:
            raise DiscoveryError(_garbage(script, where, "not a host name")) from None
        if slots_text is None:
            if default_slots is None:
                raise DiscoveryError(with_hint(
                    f"host discovery script {script!r} printed {where} without a slot count",
                    "print host:slots lines, or pass --slots-per-host N for bare host names"))
            found[host] = default_slots
            continue
        # plain digits, as -H takes them (int() alone also takes "+2", "1_0" and other scripts' digits)
        slots = int(slots_text.strip()) if is_plain_count(slots_text.strip()) else 0
        if not 0 < slots <= MAX_WORKERS:  # a huge count would be planned as that many workers
            raise DiscoveryError(_garbage(script, where, f"slots must be a positive integer (at most {MAX_WORKERS})"))
        found[host] = slots
    return [HostSlots(h, s) for h, s in found.items()]


def _garbage(script: str, where: str, why: str) -> str:
    return with_hint(f"host discovery script {script!r} printed {where}: {why}",
                     "the script must print one 'host:slots' (or 'host') line per usable host")


def run_discovery(script: str, default_slots: int | None, timeout: float,
                  cwd: str | None = None) -> list[HostSlots]:
    """Run the script once (``sh -c script``) and parse what it printed.

    Raises:
        DiscoveryError: it could not be started, exited non-zero, did not finish within
            ``timeout`` seconds (it and its children are killed), or printed garbage.
    """
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                start_new_session=True)
    except OSError as exc:
        raise DiscoveryError(with_hint(f"host discovery script {script!r} could not be started: {exc}",
                                       "check the path and that /bin/sh exists")) from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        raise DiscoveryError(with_hint(
            f"host discovery script {script!r} did not finish within {timeout:g}s (killed)",
            "make the script answer quickly; it runs every --discovery-interval")) from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        raise DiscoveryError(with_hint(
            f"host discovery script {script!r} failed with exit code {proc.returncode}"
            + (f": {tail}" if tail else ""),
            "run the script by hand; it must exit 0 and print host:slots lines"))
    return parse_discovery_output(out.decode("utf-8", "replace"), default_slots, script)


@dataclass(frozen=True)
class DiscoveryResult:
    """One run of the script: the hosts, or the error it gave; ``at`` is time.monotonic()."""

    hosts: list[HostSlots] | None
    error: DiscoveryError | None
    at: float


class DiscoveryPoller:
    """Runs the discovery every ``interval`` seconds on a daemon thread; :meth:`results`
    returns what came in since the last call (oldest first)."""

    def __init__(self, find: Callable[[], list[HostSlots]], interval: float) -> None:
        self._find = find
        self._interval = interval
        self._results: queue.Queue[DiscoveryResult] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="accord-host-discovery", daemon=True)

    def start(self) -> "DiscoveryPoller":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                result = DiscoveryResult(self._find(), None, time.monotonic())
            except DiscoveryError as exc:
                result = DiscoveryResult(None, exc, time.monotonic())
            self._results.put(result)
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def results(self) -> list[DiscoveryResult]:
        """Every result since the last call."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        """Stop polling (a script running now is left to finish or time out)."""
        self._stop.set()
