"""Group sizes compared across ranks (pure logic, used by :func:`accord.engine.negotiation.negotiate.decide`).

Ranks that pass different numbers of tensors to a grouped call under one name submit different
request names (``g_1of2`` against ``g_1of3``), which alone would only stall. The negotiation
therefore compares the sizes under each group's key (:mod:`accord.engine.naming`); a request
that is not grouped is its own key with size 0, so one tensor against a group under the same
name is found too.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from accord.engine.naming import Group
from accord.errors import with_hint

Keys = dict[int, dict[str, str]]  # global rank -> {name: its group key}
Sizes = dict[str, dict[int, int]]  # group key -> {global rank: size}


def group_sizes(ranks: Sequence[int], pending: Sequence[Mapping[str, object]],
                groups: Sequence[Mapping[str, Group]]) -> tuple[Keys, Sizes]:
    """Every member's group key per pending name, and the sizes each key has on each member.

    ``ranks``: the members' global ranks; ``pending`` and ``groups`` (name -> (key, size) of
    grouped requests): per member, in the same order.
    """
    keys: Keys = {}
    sizes: Sizes = {}
    for rank, names, grouped in zip(ranks, pending, groups):
        mine = keys[rank] = {}
        for name in names:
            key, size = grouped.get(name, (name, 0))
            mine[name] = key
            sizes.setdefault(key, {})[rank] = size
    return keys, sizes


def group_size_problem(name_keys: set[str], sizes: Mapping[str, Mapping[int, int]], members: Sequence[int],
                       joined: set[int], op: str) -> str:
    """The error for a name whose group key (``name_keys``: its key on each holder) has
    different sizes on different ranks, once every member that has not joined holds the key;
    "" otherwise. Before that, the name waits as any partly submitted one does: reported
    earlier, a member submitting it later would wait for peers that have moved on. The error is
    certain, not a guess, since a rank holds one size per key at a time
    (:class:`accord.engine.naming.GroupsInFlight`)."""
    for key in sorted(name_keys):
        seen = sizes[key]
        if len(set(seen.values())) > 1 and all(r in seen or r in joined for r in members):
            return group_size_message(key, seen, op)
    return ""


def group_size_message(key: str, sizes: Mapping[int, int], op: str) -> str:
    """E.g. "Mismatched allreduce group sizes for 'allreduce.g': rank 0 sent a group of 2
    tensors, rank 1 sent a group of 3 tensors" + HINT."""
    by_size: dict[int, list[int]] = {}
    for r in sorted(sizes):
        by_size.setdefault(sizes[r], []).append(r)
    parts = []
    for size, ranks in by_size.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        what = "1 tensor without a group" if size == 0 else f"a group of {size} tensor{'s' * (size != 1)}"
        parts.append(f"{who} sent {what}")
    return with_hint(f"Mismatched {op} group sizes for {key!r}: " + ", ".join(parts),
                     "every rank must pass the same number of tensors to a grouped call under "
                     "one name; a list built from data, or from gradients that only some ranks "
                     "have (unused parameters), differs between ranks")
