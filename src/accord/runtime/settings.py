"""The runtime's settings, typed: what bootstrap, environment detection and elastic admission
read from the environment, one frozen record per reader.

Each record is built where its reader needs it, not at import: bootstrap builds its own at every
``init()``, and an elastic worker reads :class:`ElasticSettings` again at each re-formation. The
worker-contract records parse a given environment (``config.snapshot()``), so that detection
stays a pure function of that mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from accord import config


@dataclass(frozen=True)
class BootstrapSettings:
    """What one bootstrap uses: timeouts in seconds and the interface a multi-host store binds."""

    start_timeout: float  # every rank must reach the rendezvous within it
    collective_timeout: float  # the default process group's timeout
    interface: str | None  # ACCORD_INTERFACE: a name (eth0) or an address; None: unset

    @classmethod
    def from_config(cls, start_timeout: float | None = None) -> "BootstrapSettings":
        """Read ACCORD_START_TIMEOUT (unless ``start_timeout`` is given), ACCORD_COLLECTIVE_TIMEOUT
        and ACCORD_INTERFACE (with their Horovod and MXNet aliases).

        Raises:
            ConfigError: a timeout is not a finite number.
        """
        start = config.get("ACCORD_START_TIMEOUT") if start_timeout is None else start_timeout
        return cls(start_timeout=float(start), collective_timeout=float(config.get("ACCORD_COLLECTIVE_TIMEOUT")),
                   interface=config.get("ACCORD_INTERFACE"))


@dataclass(frozen=True)
class ElasticSettings:
    """An elastic worker's settings (accordrun writes them for ``--min-np`` and host discovery)."""

    member_id: int | None  # ACCORD_ELASTIC_ID: stable across re-formations; None outside the driver
    timeout: float  # seconds ranks wait for each other to regroup, or a joiner to be admitted
    min_np: int  # the fewest workers a re-formation waits for (1 when unset)

    @classmethod
    def from_config(cls) -> "ElasticSettings":
        """Read ACCORD_ELASTIC_ID, ACCORD_ELASTIC_TIMEOUT (HOROVOD_ELASTIC_TIMEOUT) and ACCORD_ELASTIC_MIN_NP.

        Raises:
            ConfigError: one of them is set to text its parser rejects.
        """
        return cls(member_id=config.get("ACCORD_ELASTIC_ID"), timeout=float(config.get("ACCORD_ELASTIC_TIMEOUT")),
                   min_np=config.get("ACCORD_ELASTIC_MIN_NP") or 1)


def joins_running_job() -> bool:
    """ACCORD_ELASTIC_JOIN: this worker was added to a running elastic job and must be admitted.

    Raises:
        ConfigError: the variable is not a boolean.
    """
    return bool(config.get("ACCORD_ELASTIC_JOIN"))


def marked_elastic() -> bool:
    """ACCORD_ELASTIC (HOROVOD_ELASTIC): the launcher marked this worker as part of an elastic job.

    Raises:
        ConfigError: the variable is not a boolean.
    """
    return bool(config.get("ACCORD_ELASTIC"))


@dataclass(frozen=True)
class AccordPlace:
    """Where accord's own contract (accordrun, accord.spawn) puts this worker; None: not given."""

    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    cross_rank: int | None
    cross_size: int | None
    store_addr: str | None
    store_port: int | None

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> "AccordPlace | None":
        """Read ACCORD_RANK/SIZE (HOROVOD_*) from ``env``; None when either is unset. Only then
        the local and cross values and ACCORD_STORE_ADDR/PORT, so that a launcher that sets none
        of accord's names is never refused for them.

        Raises:
            ConfigError: one of them is set but not an integer.
        """
        rank, size = config.get("ACCORD_RANK", env), config.get("ACCORD_SIZE", env)
        if rank is None or size is None:
            return None
        addr, port = config.get("ACCORD_STORE_ADDR", env), config.get("ACCORD_STORE_PORT", env)
        return cls(rank=rank, size=size,
                   local_rank=config.get("ACCORD_LOCAL_RANK", env), local_size=config.get("ACCORD_LOCAL_SIZE", env),
                   cross_rank=config.get("ACCORD_CROSS_RANK", env), cross_size=config.get("ACCORD_CROSS_SIZE", env),
                   store_addr=addr, store_port=port)


@dataclass(frozen=True)
class HostAndSecret:
    """What applies whatever the launcher: the host name override and where the job secret is."""

    hostname: str | None  # ACCORD_HOSTNAME (HOROVOD_HOSTNAME)
    secret_hex: str | None  # ACCORD_JOB_SECRET
    secret_file: str | None  # ACCORD_SECRET_FILE

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> "HostAndSecret":
        """Read ACCORD_HOSTNAME, ACCORD_JOB_SECRET and ACCORD_SECRET_FILE from ``env`` (default:
        this process's environment, now)."""
        return cls(hostname=config.get("ACCORD_HOSTNAME", env), secret_hex=config.get("ACCORD_JOB_SECRET", env),
                   secret_file=config.get("ACCORD_SECRET_FILE", env))
