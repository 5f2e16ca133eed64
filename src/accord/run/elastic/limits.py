"""When an elastic job must give up, as horovodrun's: its workers re-formed more often than
``--reset-limit`` allows, or fewer than ``--min-np`` ran for longer than ``--elastic-timeout``.

A failure, then the removal of the other workers on its host, counts as one reset when the
workers took both changes in one re-formation (:meth:`JobLimits.count_reset`).
"""
from __future__ import annotations

from typing import Callable, Sequence

from accord.errors import with_hint
from accord.run.elastic.config import ElasticConfig
from accord.run.spec.hosts import HostSlots


class JobLimits:
    """The two limits' state: resets counted, and since when the job runs below ``min_np``."""

    def __init__(self, elastic: ElasticConfig, min_np: int, say: Callable[[str], None]) -> None:
        self.elastic = elastic
        self.min_np = min_np
        self.resets = 0
        self._say = say
        self._reset_at: int | None = None  # the workers' re-formation count when resets last grew
        self._below_since: float | None = None

    def count_reset(self, reformations: int) -> None:
        """Count a change of the workers as a reset, unless they have not re-formed (their
        count, ``reformations``) since the last one counted: they take both in one."""
        if self._reset_at is None or reformations > self._reset_at:
            self.resets += 1
            self._reset_at = reformations

    def reset_error(self) -> str | None:
        """The job's error once its resets exceed ``--reset-limit``, else None."""
        limit = self.elastic.reset_limit
        if limit is None or self.resets <= limit:
            return None
        return with_hint(f"error: the job's workers changed {self.resets} times (re-formations), more "
                         f"than --reset-limit {limit}",
                         "raise --reset-limit, or look at why hosts keep changing or failing")

    def size_error(self, alive: int, now: float, discovered: Sequence[HostSlots],
                   blocked: Sequence[str]) -> str | None:
        """The job's error once it has run below ``--min-np`` for ``--elastic-timeout`` (said
        once when it drops below), else None; ``alive`` counts the workers that stay."""
        if alive >= self.min_np:
            self._below_since = None
            return None
        timeout = self.elastic.elastic_timeout
        if self._below_since is None:
            self._below_since = now
            self._say(f"elastic: {alive} workers, below --min-np {self.min_np}; waiting up to "
                      f"--elastic-timeout {timeout:g}s for hosts")
            return None
        if now - self._below_since <= timeout:
            return None
        hosts = ", ".join(f"{h.hostname}:{h.slots}" for h in discovered) or "none"
        script = self.elastic.discovery_script
        return with_hint(
            f"error: the job stayed below --min-np {self.min_np} ({alive} workers) for "
            f"--elastic-timeout {timeout:g}s; discovered hosts: {hosts}; "
            f"blacklisted: {sorted(blocked) or 'none'}",
            (f"make {script!r} print more hosts" if script
             else "let blacklisted hosts come back (--blacklist-cooldown-range MIN MAX)")
            + ", lower --min-np, or raise --elastic-timeout")
