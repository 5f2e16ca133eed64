"""Names for a process group's calls: matched by their order, repeated while the program repeats.

torch.distributed matches collectives by their order: the n-th call on a group is one collective
on every rank. The engine matches requests by name, and it is fast for names that recur (its
response cache, then planned cycles that skip the negotiation: a training step repeats the same
calls). A name made from the call's number alone never recurs; a name made from the call's
arguments would turn a rank that passes other arguments into a stall instead of an error on every
rank. So names come from the order of the calls and the arguments of the calls *before* this one,
which every rank of a correct program shares:

- while the calls' descriptions (op, dtypes, shapes, ops, roots: :func:`describe`) so far show no
  repeating sequence, call ``n`` is named ``<group>.<n>``;
- once the last ``2p`` descriptions are one sequence of ``p`` twice (a training step of ``p``
  collectives, the smallest such ``p`` up to :data:`MAX_PERIOD`), the calls take the names
  ``<group>.s<p>.<k>``, ``k`` cycling through ``0 .. p-1``, for as long as each call repeats the
  one ``p`` calls before it; the first call that does not goes back to ``<group>.<n>``.

A name is decided before the call's own description counts, so a rank whose call differs from
its peers' still gets the same name as they do: the negotiation then reports the mismatch on
every rank, and each rank forgets its history (:meth:`GroupNames.forget`). Descriptions hold
only what a correct program passes alike on every rank (not the first dimension of ragged ops,
nor splits). A recurring name is only reused once its previous request has completed on this
rank (:class:`GroupNames` tells the caller which request to wait for first): every rank makes
the same calls in the same order, so that wait always ends.
"""
from __future__ import annotations

import collections
import enum
import weakref
from typing import Any, Hashable

MAX_PERIOD = 256  # the longest repeating sequence of calls that is recognised


class GroupNames:
    """The names of one process group's calls (see the module docstring). Not thread-safe: torch
    makes a group's calls from one thread at a time, in order (they must match the peers')."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._history: collections.deque[Hashable] = collections.deque(maxlen=2 * MAX_PERIOD)
        self._calls = 0
        self._period = 0  # the repeating sequence's length (0: none)
        self._phase = 0  # the next call's place in it
        # recurring name -> the work of its last request, weakly: a work pending in the engine is
        # held by its requests' callbacks, so one that is gone has completed; holding it here would
        # keep its outputs alive (a layer's gathered parameters, under FSDP) after the caller let go
        self._last: dict[str, weakref.ref] = {}

    def next(self, description: Hashable) -> str:
        """The name of the next call, whose arguments ``description`` gives."""
        self._calls += 1
        name = self._name()
        self._remember(description)
        return name

    def forget(self) -> None:
        """Start again from no history (a call failed: the ranks' arguments differed, so their
        histories may differ too). In a program that waits on each call, as most do after an
        error, every rank forgets at the same call, and the names agree again."""
        self._history.clear()
        self._period = self._phase = 0

    def previous_work(self, name: str) -> Any:
        """The work of the last request under recurring ``name`` (None for a name used once):
        the caller waits for it before submitting the name again. None too once nothing else
        holds that work (it has completed, see ``__init__``)."""
        ref = self._last.get(name)
        return None if ref is None else ref()

    def submitted(self, name: str, work: Any) -> None:
        """Record the work submitted under ``name`` (kept, weakly, for recurring names only)."""
        if ".s" in name[len(self.group):]:
            self._last[name] = weakref.ref(work)

    def _name(self) -> str:
        if self._period:
            return f"{self.group}.s{self._period}.{self._phase}"
        return f"{self.group}.{self._calls}"

    def _remember(self, description: Hashable) -> None:
        history = self._history
        if self._period and history[-self._period] == description:
            self._phase = (self._phase + 1) % self._period
        else:
            self._period = 0
            history.append(description)
            self._period = _period_of(history)
            self._phase = 0
            return
        history.append(description)


def _period_of(history: collections.deque) -> int:
    """The smallest ``p`` such that the last ``2p`` entries are one sequence twice (0: none)."""
    n = len(history)
    last = history[-1]
    for p in range(1, min(MAX_PERIOD, n // 2) + 1):
        if history[-1 - p] != last:
            continue
        if all(history[-1 - i] == history[-1 - i - p] for i in range(1, p)):
            return p
    return 0


# Ops whose first dimension, and splits, may differ between ranks of a correct program (the
# engine's ragged ops: only what follows dim 0 must agree).
_RAGGED = frozenset({"allgather", "alltoall", "gather", "scatter"})
_PER_RANK = frozenset({"splits"})


def describe(op: str, tensors: Any, **arguments: Any) -> Hashable:
    """What every rank of a correct program passes alike for this call (what the engine's
    negotiation compares): the op, each tensor's dtype and shape (without dim 0 for ragged ops),
    and the other arguments (reduce op, root, scale), not the per-rank splits."""
    ragged = op in _RAGGED
    shapes = tuple((str(t.dtype), tuple(t.shape[1:] if ragged else t.shape)) if t is not None else None
                   for t in tensors)
    rest = tuple(sorted((k, _hashable(v)) for k, v in arguments.items() if k not in _PER_RANK))
    return op, shapes, rest


def _hashable(value: Any) -> Hashable:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, (str, int, float, bool, type(None), enum.Enum)):
        return value
    return repr(value)
