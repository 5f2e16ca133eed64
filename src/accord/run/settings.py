"""The launcher's settings from its own environment, typed: what accordrun takes from variables
besides its flags (a flag, where there is one, wins).

Read from the environment the launcher was given (``config.snapshot()``, or a test's mapping),
so that building a launch stays a function of its inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from accord import config


@dataclass(frozen=True)
class LauncherSettings:
    """What the launcher's environment says about the job's network and verbosity."""

    interface: str | None  # ACCORD_INTERFACE (DMLC_INTERFACE, HOROVOD_GLOO_IFACE), unless --network-interface
    verbose: int  # ACCORD_VERBOSE (PS_VERBOSE): 0, 1, 2; --verbose makes it at least 1
    node_host: str | None  # ACCORD_NODE_HOST (DMLC_NODE_HOST): the user's address for servers to advertise

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "LauncherSettings":
        """Read ACCORD_INTERFACE, ACCORD_VERBOSE and ACCORD_NODE_HOST (and their aliases) from ``environ``.

        Raises:
            ConfigError: ACCORD_VERBOSE/PS_VERBOSE is neither a level nor a boolean.
        """
        return cls(interface=config.get("ACCORD_INTERFACE", environ),
                   verbose=int(config.get("ACCORD_VERBOSE", environ)),
                   node_host=config.get("ACCORD_NODE_HOST", environ))
