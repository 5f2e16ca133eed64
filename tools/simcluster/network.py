"""The simulated network: one switch namespace with a bridge, one veth link per host, tbf limits.

Host ``i`` (1-based) gets ``eth0`` with address ``10.77.0.<i>/24`` inside its own namespace; the
other end of its link (``v<i>``) is a port of bridge ``br0`` in the switch namespace. Nothing is
added to the machine's own network namespace, so the cluster is invisible from it and cannot
reach anything outside. A rate limit is a ``tbf`` qdisc on both ends of a host's link (egress in
each direction); this kernel has no ``netem``, so there is no added latency or loss.
"""
from __future__ import annotations

import re
import subprocess

SUBNET = "10.77.0"
HOST_IF = "eth0"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit|bps)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one ip/tc command; raise with its stderr when it fails and ``check`` is set."""
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"simulated cluster: `{' '.join(argv)}` failed ({out.returncode}): "
                           f"{out.stderr.strip()}")
    return out


def parse_rate(text: str | None) -> int | None:
    """``"1gbit"``, ``"10Gbit"``, ``"500mbit"`` -> bits per second; None/"" /"unlimited" -> None."""
    if text is None or str(text).strip().lower() in ("", "none", "unlimited", "0"):
        return None
    match = _RATE.match(str(text).strip())
    if not match:
        raise ValueError(f"cannot read link rate {text!r}; write e.g. 1gbit, 10gbit, 500mbit or unlimited")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def address(index: int) -> str:
    """The address of host ``index`` (1-based)."""
    return f"{SUBNET}.{index}"


def create_switch(netns: str) -> None:
    """The switch namespace with its bridge, up."""
    sh("ip", "netns", "add", netns)
    sh("ip", "-n", netns, "link", "set", "lo", "up")
    sh("ip", "-n", netns, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", netns, "link", "set", "br0", "up")


def create_host_netns(netns: str, switch: str, index: int) -> None:
    """A host namespace with loopback and ``eth0`` plugged into the switch."""
    sh("ip", "netns", "add", netns)
    sh("ip", "-n", netns, "link", "set", "lo", "up")
    port = f"v{index}"
    sh("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", HOST_IF, "netns", netns)
    sh("ip", "-n", switch, "link", "set", port, "master", "br0", "up")
    sh("ip", "-n", netns, "addr", "add", f"{address(index)}/24", "dev", HOST_IF)
    sh("ip", "-n", netns, "link", "set", HOST_IF, "up")


def set_plugged(switch: str, index: int, plugged: bool) -> None:
    """Plug or unplug host ``index``'s cable at the switch (unplugged: packets vanish)."""
    sh("ip", "-n", switch, "link", "set", f"v{index}", "up" if plugged else "down")


def _tbf(netns: str, dev: str, bits: int | None) -> None:
    if bits is None:
        sh("tc", "-n", netns, "qdisc", "del", "dev", dev, "root", check=False)
        return
    # burst: at least 4 ms of traffic (the kernel's timer granularity at HZ=250) and 64 KiB, so
    # that the shaper is not the one that limits below the configured rate
    burst = max(64 * 1024, bits // 8 // 250)
    sh("tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit",
       "burst", str(burst), "latency", "100ms")


def set_rate(netns: str, switch: str, index: int, bits: int | None) -> None:
    """Limit host ``index``'s link to ``bits`` per second each way (None: unlimited)."""
    _tbf(netns, HOST_IF, bits)
    _tbf(switch, f"v{index}", bits)
