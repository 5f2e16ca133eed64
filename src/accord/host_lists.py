"""SLURM's compressed host lists (``node[01-03],x``) and task counts (``2(x3),1``), expanded, and
the port a step's ranks meet on when no one gave one.

Pure functions of text, in the base layer: the launcher's agents (``accordrun --nproc-per-node`` in
an ``srun`` step) and the workers' environment detection (:mod:`accord.runtime.environments`) both
read SLURM's variables.
"""
from __future__ import annotations

import itertools
import re
from typing import Mapping

from accord.config import int_variable
from accord.errors import with_hint

__all__ = ["expand_nodelist", "expand_tasks_per_node", "slurm_step_port"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list: ``"node[01-03],x"`` -> ``["node01", "node02", "node03", "x"]``.

    Supports several bracket groups per name (``r[1-2]n[1-2]``, expanded as a product), lists
    and ranges inside brackets (``[1,3-5]``) and keeps zero padding.

    Raises:
        ValueError: unbalanced brackets or a range that is not ``low-high`` with low <= high.
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        parts: list[list[str]] = []
        pos = 0
        while pos < len(item):
            if item[pos] == "[":
                end = item.index("]", pos)
                parts.append(_expand_group(item[pos + 1:end], text))
                pos = end + 1
            else:
                nxt = item.find("[", pos)
                nxt = len(item) if nxt < 0 else nxt
                parts.append([item[pos:nxt]])
                pos = nxt
        hosts.extend("".join(p) for p in itertools.product(*parts))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                break
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(with_hint(f"unbalanced brackets in SLURM node list {text!r}",
                                   "pass a list like 'node[01-03],other'"))
    items.append("".join(current))
    return [i for i in items if i]


def _expand_group(group: str, text: str) -> list[str]:
    out: list[str] = []
    for piece in group.split(","):
        match = _RANGE.match(piece.strip())
        if not match:
            raise ValueError(with_hint(f"bad range {piece!r} in SLURM node list {text!r}",
                                       "ranges look like 01-03 or 7"))
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(with_hint(f"descending range {piece!r} in SLURM node list {text!r}",
                                       "write ranges low-high"))
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        ValueError: an item is not ``N`` or ``N(xM)``.
    """
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(with_hint(f"bad SLURM_TASKS_PER_NODE item {item!r} in {text!r}",
                                       "expected items like 2 or 2(x3)"))
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


SLURM_PORT_BASE = 20000  # below Linux's ephemeral range (32768-60999)


def slurm_step_port(env: Mapping[str, str]) -> int | None:
    """The port of an ``srun`` step's rendezvous without MASTER_PORT: ``20000 + 10 * (job id mod
    1000) + (step id mod 10)``, the same on every task of the step (the workers' store when srun
    starts them, the agents' endpoint when it starts one agent per node); steps and jobs that run at
    once on a node get different ones. None outside a SLURM job.

    Args:
        env: the environment (``SLURM_JOB_ID``, ``SLURM_STEP_ID``; a batch script's step counts as 0).

    Returns:
        A port in 20000..29999, or None when ``SLURM_JOB_ID`` is not set.

    Raises:
        ConfigError: ``SLURM_JOB_ID`` or ``SLURM_STEP_ID`` is set but not an integer.
    """
    job = int_variable(env, "SLURM_JOB_ID")
    if job is None:
        return None
    step = int_variable(env, "SLURM_STEP_ID") or 0
    return SLURM_PORT_BASE + 10 * (job % 1000) + step % 10
