"""SLURM's compressed host lists (``node[01-03],x``) and task counts (``2(x3),1``), expanded.

Pure text functions, in the base layer: the launcher's agents (``accordrun --nproc-per-node`` in an
``srun`` step) and the workers' environment detection (:mod:`accord.runtime.environments`) both
read SLURM's variables.
"""
from __future__ import annotations

import itertools
import re

from accord.errors import with_hint

__all__ = ["expand_nodelist", "expand_tasks_per_node"]

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
