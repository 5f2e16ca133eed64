"""The engine's settings, read once from accord.config at init."""
from __future__ import annotations

import math
from dataclasses import dataclass

from accord import config
from accord.config import DYNAMIC_TIMELINE
from accord.errors import ConfigError, with_hint


@dataclass(frozen=True)
class EngineSettings:
    """Typed engine tuning. Times are seconds (``cycle_time`` too, unlike the ms variable)."""

    fusion_threshold: int = 64 * 1024 * 1024
    # A cycle gathers requests for at most cycle_time after the first, and starts earlier once
    # none arrived for quiet_time, early_start_bytes are queued (0: never; -1: the fusion
    # threshold), or a caller waits on a handle. See default_cycle_times for the defaults.
    cycle_time: float = 0.001
    quiet_time: float = 0.0
    early_start_bytes: int = -1
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time: float = 60.0
    stall_shutdown_time: float = config.STALL_SHUTDOWN_DEFAULT_S  # 0: never
    collective_timeout: float = 60.0
    # How often an engine with nothing to do still joins a negotiation, so that peers waiting
    # on it notice stalls and shutdowns. Each tick costs one tiny allreduce (~1 ms of CPU on
    # Gloo here), so an idle engine stays near 0.1% of a core. See ``tick``.
    idle_interval: float = 1.0
    # Upper bound of the pause between cycles while requests wait on peers without progress
    # (grows from cycle_time): bounds both the spinning CPU and the added latency.
    max_backoff: float = 0.01
    cache_capacity: int = 1024
    # Allreduce CPU tensors of the global set within each host, then across hosts (Horovod's
    # HOROVOD_HIERARCHICAL_ALLREDUCE; the session builds the communicators). Forced on by
    # hierarchical_allreduce; with hierarchical_auto (the variable unset) the layout decides
    # (comm.hierarchical.auto_hierarchy), and allreduces below hierarchical_min_bytes run flat.
    hierarchical_allreduce: bool = False
    hierarchical_auto: bool = False
    hierarchical_min_bytes: int = 1024 * 1024
    # Python's thread switch interval while the engine runs, seconds (0: leave it alone).
    # Measured across 2 simulated hosts (160 x 100 KB submitted at once, then synchronized):
    # at Python's 5 ms the engine thread waits on the submitting thread for the GIL after
    # every collective step, and a step took 210-220 ms; at 1 ms 195-205 ms.
    switch_interval: float = 0.001

    def __post_init__(self) -> None:
        if self.fusion_threshold < 0:
            raise ConfigError(with_hint(f"fusion threshold must be >= 0 bytes, got {self.fusion_threshold}",
                                        "set ACCORD_FUSION_THRESHOLD to a byte count (0 turns fusion off)"))
        if self.early_start_bytes < -1:
            raise ConfigError(with_hint(f"early start bytes must be -1, 0 or positive, got {self.early_start_bytes}",
                                        "use -1 (the fusion threshold), 0 (never) or a byte count"))
        if self.quiet_time < 0:
            raise ConfigError(with_hint(f"quiet time must be >= 0, got {self.quiet_time * 1e3} ms",
                                        "set ACCORD_CYCLE_QUIET_TIME to milliseconds, e.g. 0 or 0.2"))
        if self.cache_capacity < 1:
            raise ConfigError(with_hint(f"cache capacity must be >= 1, got {self.cache_capacity}",
                                        "set ACCORD_CACHE_CAPACITY to a count of names, e.g. 1024"))
        if self.hierarchical_min_bytes < 0:
            raise ConfigError(with_hint(f"hierarchical min bytes must be >= 0, got {self.hierarchical_min_bytes}",
                                        "set ACCORD_HIERARCHICAL_MIN_BYTES to a byte count, e.g. 65536"))
        if self.switch_interval < 0:
            raise ConfigError(with_hint(f"GIL switch interval must be >= 0, got {self.switch_interval * 1e3} ms",
                                        "set ACCORD_GIL_SWITCH_INTERVAL to milliseconds, e.g. 1, or 0 to leave "
                                        "Python's setting alone"))
        if self.cycle_time < 0:
            raise ConfigError(with_hint(f"cycle time must be >= 0, got {self.cycle_time * 1e3} ms",
                                        "set ACCORD_CYCLE_TIME to milliseconds, e.g. 1"))

    @property
    def start_bytes(self) -> int:
        """Queued bytes that start a cycle at once (0: never)."""
        return self.fusion_threshold if self.early_start_bytes < 0 else self.early_start_bytes

    @property
    def timeline_at_start(self) -> str | None:
        """The timeline file to open when the engine starts: None when unset or ``DYNAMIC``."""
        return None if not self.timeline or self.timeline == DYNAMIC_TIMELINE else self.timeline

    @property
    def tick(self) -> float:
        """Idle tick actually used: also short enough for the stall inspector to act on time
        and for a peer blocked in a negotiation to stay far from the collective timeout."""
        tick = min(self.idle_interval, self.collective_timeout / 4)
        if not self.stall_check_disable and self.stall_check_time > 0:
            tick = min(tick, self.stall_check_time / 4)
        return max(tick, 0.01)

    @property
    def stall_horizon(self) -> float:
        """Seconds within which a name that waits on peers must reach the stall inspector: the
        check time, or the shutdown time where that is shorter; infinite with the inspector off."""
        if self.stall_check_disable or self.stall_check_time <= 0:
            return math.inf
        if self.stall_shutdown_time > 0:
            return min(self.stall_check_time, self.stall_shutdown_time)
        return self.stall_check_time

    @classmethod
    def from_config(cls, cpu_backend: str | None = None, **overrides) -> "EngineSettings":
        """Read ACCORD_FUSION_THRESHOLD, ACCORD_CYCLE_TIME and ACCORD_CYCLE_QUIET_TIME (ms), ACCORD_TIMELINE,
        ACCORD_STALL_*, ACCORD_COLLECTIVE_TIMEOUT, ACCORD_CACHE_CAPACITY, ACCORD_HIERARCHICAL_ALLREDUCE,
        ACCORD_HIERARCHICAL_MIN_BYTES (and their Horovod aliases); ``overrides`` win. Cycle times
        that are not set default by ``cpu_backend`` (see :func:`default_cycle_times`)."""
        cycle, quiet, early = default_cycle_times(cpu_backend)
        set_cycle, set_quiet = config.get("ACCORD_CYCLE_TIME"), config.get("ACCORD_CYCLE_QUIET_TIME")
        if set_cycle is not None:
            cycle = set_cycle / 1000.0
        quiet = min(quiet, cycle) if set_quiet is None else set_quiet / 1000.0
        hierarchical = config.get("ACCORD_HIERARCHICAL_ALLREDUCE")  # None: decided by the layout
        values = dict(
            fusion_threshold=config.get("ACCORD_FUSION_THRESHOLD"),
            cycle_time=cycle,
            quiet_time=quiet,
            early_start_bytes=early,
            timeline=config.get("ACCORD_TIMELINE"),
            timeline_mark_cycles=config.get("ACCORD_TIMELINE_MARK_CYCLES"),
            stall_check_disable=config.get("ACCORD_STALL_CHECK_DISABLE"),
            stall_check_time=config.get("ACCORD_STALL_CHECK_TIME_SECONDS"),
            stall_shutdown_time=config.get("ACCORD_STALL_SHUTDOWN_TIME_SECONDS"),
            collective_timeout=config.get("ACCORD_COLLECTIVE_TIMEOUT"),
            switch_interval=config.get("ACCORD_GIL_SWITCH_INTERVAL") / 1000.0,
            # Horovod's 0 turns its cache off; accord's negotiation always keeps one entry.
            cache_capacity=config.get("ACCORD_CACHE_CAPACITY") or 1,
            hierarchical_allreduce=bool(hierarchical),
            hierarchical_auto=hierarchical is None,
            hierarchical_min_bytes=config.get("ACCORD_HIERARCHICAL_MIN_BYTES"),
        )
        values.update(overrides)
        return cls(**values)


# The shm backend's transfers are this process's own CPU work (copies and sums in shared
# memory): overlapping them with backward takes the cores from the computation, and every
# extra cycle costs a negotiation and barrier hand-offs between busy cores. So on shm the
# engine gathers until a caller waits (synchronize, poll), with one second as the bound for
# requests nobody waits on, and a full fusion buffer does not start a cycle early. Measured
# on 2 ranks x 1 thread, ResNet-50 (161 gradients, 102 MB): 123 cycles per step at 1 ms cost
# 0.15 of the step over no communication, one cycle at synchronize() 0.09, and starting a
# cycle at the first full 64 MB buffer 0.15 again. Gloo and MPI move data through the network
# stack, where starting early overlaps transfers with backward as in Horovod (a full buffer
# goes at once). There a cycle starts once nothing new arrived for half a millisecond: requests
# that keep coming faster than that (a loop submitting a step's gradients, small layers'
# gradients back to back) are one burst, and cutting a burst costs a cycle, whose negotiation
# across hosts is a network round trip. Measured on 2 simulated hosts x 2 ranks, 1 Gbit/s,
# 160 x 100 KB submitted in a loop: Horovod's 1 ms cycle made every step two negotiated cycles
# (195-199 ms); gathering the burst made it one, planned after three steps (182-194 ms); the
# 26 M MLP across the same hosts, accord vs DDP: 1.23-1.25x before, 1.28x after. The 30 ms cap
# bounds how long a steady stream is held.
_SHM_CYCLE_S = 1.0
_NETWORK_CYCLE_S = 0.030
_NETWORK_QUIET_S = 0.0005


def default_cycle_times(cpu_backend: str | None) -> tuple[float, float, int]:
    """(cycle_time s, quiet_time s, early_start_bytes) for a job whose CPU tensors use ``cpu_backend``."""
    if cpu_backend == "shm":
        return _SHM_CYCLE_S, _SHM_CYCLE_S, 0
    return _NETWORK_CYCLE_S, _NETWORK_QUIET_S, -1
