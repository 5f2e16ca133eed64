"""The engine's settings, read once from accord.config at init."""
from __future__ import annotations

from dataclasses import dataclass

from accord import config
from accord.errors import ConfigError, with_hint


@dataclass(frozen=True)
class EngineSettings:
    """Typed engine tuning. Times are seconds (``cycle_time`` too, unlike the ms variable)."""

    fusion_threshold: int = 64 * 1024 * 1024
    cycle_time: float = 0.001
    # A cycle starts once no request arrived for this long (or cycle_time after the first).
    # 0 (the default) starts it as soon as the queue stops growing: measured here, waiting
    # longer only added latency (GIL hand-offs), and requests that arrive while a cycle runs
    # are fused into the next one anyway.
    quiet_time: float = 0.0
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time: float = 60.0
    stall_shutdown_time: float = 0.0
    collective_timeout: float = 60.0
    # How often an engine with nothing to do still joins a negotiation, so that peers waiting
    # on it notice stalls and shutdowns. Each tick costs one tiny allreduce (~1 ms of CPU on
    # Gloo here), so an idle engine stays near 0.1% of a core. See ``tick``.
    idle_interval: float = 1.0
    # Upper bound of the pause between cycles while requests wait on peers without progress
    # (grows from cycle_time): bounds both the spinning CPU and the added latency.
    max_backoff: float = 0.01
    cache_capacity: int = 1024

    def __post_init__(self) -> None:
        if self.fusion_threshold < 0:
            raise ConfigError(with_hint(f"fusion threshold must be >= 0 bytes, got {self.fusion_threshold}",
                                        "set ACCORD_FUSION_THRESHOLD to a byte count (0 turns fusion off)"))
        if self.quiet_time < 0:
            raise ConfigError(with_hint(f"quiet time must be >= 0, got {self.quiet_time * 1e3} ms",
                                        "set ACCORD_CYCLE_QUIET_TIME to milliseconds, e.g. 0 or 0.2"))
        if self.cycle_time < 0:
            raise ConfigError(with_hint(f"cycle time must be >= 0, got {self.cycle_time * 1e3} ms",
                                        "set ACCORD_CYCLE_TIME to milliseconds, e.g. 1"))

    @property
    def tick(self) -> float:
        """Idle tick actually used: also short enough for the stall inspector to act on time
        and for a peer blocked in a negotiation to stay far from the collective timeout."""
        tick = min(self.idle_interval, self.collective_timeout / 4)
        if not self.stall_check_disable and self.stall_check_time > 0:
            tick = min(tick, self.stall_check_time / 4)
        return max(tick, 0.01)

    @classmethod
    def from_config(cls, **overrides) -> "EngineSettings":
        """Read ACCORD_FUSION_THRESHOLD, ACCORD_CYCLE_TIME and ACCORD_CYCLE_QUIET_TIME (ms), ACCORD_TIMELINE, ACCORD_STALL_*,
        ACCORD_COLLECTIVE_TIMEOUT (and their Horovod aliases); ``overrides`` win."""
        values = dict(
            fusion_threshold=config.get("ACCORD_FUSION_THRESHOLD"),
            cycle_time=config.get("ACCORD_CYCLE_TIME") / 1000.0,
            quiet_time=config.get("ACCORD_CYCLE_QUIET_TIME") / 1000.0,
            timeline=config.get("ACCORD_TIMELINE"),
            timeline_mark_cycles=config.get("ACCORD_TIMELINE_MARK_CYCLES"),
            stall_check_disable=config.get("ACCORD_STALL_CHECK_DISABLE"),
            stall_check_time=config.get("ACCORD_STALL_CHECK_TIME_SECONDS"),
            stall_shutdown_time=config.get("ACCORD_STALL_SHUTDOWN_TIME_SECONDS"),
            collective_timeout=config.get("ACCORD_COLLECTIVE_TIMEOUT"),
        )
        values.update(overrides)
        return cls(**values)
