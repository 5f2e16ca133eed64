"""What ``RayExecutor.create_settings`` returns: Horovod's ``MiniSettings``, the settings of one job.

Same names and defaults as horovod.ray's. ``timeout_s`` is how long every rank has to reach the
rendezvous (``ACCORD_START_TIMEOUT`` of the workers); ``placement_group_timeout_s`` how long
``start()`` waits for Ray to find the resources of every worker; ``nics`` names the network
interface the workers bind and advertise (``ACCORD_INTERFACE``; one name, as accord binds one).
``ssh_identity_file`` and ``ssh_str`` are accepted and unused: Ray places the workers, nothing
is started over ssh, so no private key is written anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from accord.errors import ConfigError, with_hint


@dataclass
class RaySettings:
    """The settings of one :class:`~accord.ray.RayExecutor` job (mutable, as Horovod's)."""

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: set[str] | None = None
    verbose: int = 1
    ssh_identity_file: str | None = None
    ssh_port: int | None = None
    elastic: bool = False  # set by the executor, as Horovod's

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_group_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ConfigError(with_hint(f"RayExecutor.create_settings: {name} must be a positive "
                                            f"number of seconds, got {value!r}", f"pass {name}=30"))
        if self.nics is not None and len(self.nics) > 1:
            raise ConfigError(with_hint(f"RayExecutor.create_settings: nics names {sorted(self.nics)}; "
                                        "accord binds and advertises one interface",
                                        "pass nics={'eth0'} (one name), or leave nics out"))

    def worker_variables(self) -> dict[str, str]:
        """What these settings add to every worker's environment."""
        env = {"ACCORD_START_TIMEOUT": f"{float(self.timeout_s):g}"}
        if self.nics:
            env["ACCORD_INTERFACE"] = next(iter(self.nics))
        return env


def create_settings(timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                    placement_group_timeout_s: float = 100, nics: Iterable[str] | None = None) -> RaySettings:
    """Horovod's ``RayExecutor.create_settings`` (``ssh_str``, the key's text, is dropped)."""
    del ssh_str
    return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                       nics=None if nics is None else set(nics), ssh_identity_file=ssh_identity_file)
