"""Peak memory of a measured run: CUDA's max allocated, or the process's resident set (RSS).

RSS is sampled after every step from ``/proc/self/statm`` (cheap: one small read), so the peak
belongs to this run and not to an earlier one in the same process; where ``/proc`` is missing
the process-lifetime peak from ``getrusage`` is used instead.
"""
from __future__ import annotations

import os
import resource

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MB = 1024 * 1024


def current_rss_bytes() -> int | None:
    """Resident set size of this process now, or None where /proc is unavailable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def lifetime_peak_rss_bytes() -> int:
    """The largest RSS this process ever had (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryMeter:
    """Tracks one run's peak memory on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "cuda_max_allocated" if self.cuda else "rss"
        self._peak = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            self._device = device
        self.sample()

    def sample(self) -> None:
        """Record the memory in use now."""
        if self.cuda:
            return  # CUDA keeps its own running maximum
        rss = current_rss_bytes()
        self._peak = max(self._peak, rss if rss is not None else lifetime_peak_rss_bytes())

    def peak_mb(self) -> float:
        """Peak so far, in MiB."""
        if self.cuda:
            return torch.cuda.max_memory_allocated(self._device) / MB
        return self._peak / MB

    def describe(self) -> str:
        """"peak RSS 812 MB" / "peak CUDA 5120 MB" for the per-interval lines."""
        return f"peak {'CUDA' if self.cuda else 'RSS'} {self.peak_mb():.0f} MB"
