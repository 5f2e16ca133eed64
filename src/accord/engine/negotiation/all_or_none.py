"""A grouped call runs all of its requests or none (pure logic, used by
:func:`accord.engine.negotiation.negotiate.decide`).

A grouped call (``grouped_allreduce`` and the like) is one request per tensor, each under its
own name (:mod:`accord.engine.naming`). When one of them fails in the negotiation (arguments a
rank refused, a shape or dtype that differs between ranks), the others must not run: an
in-place grouped allreduce would raise with part of its tensors already reduced, which the
caller cannot undo. Horovod treats a group as one unit too. So a full exchange's decision that
fails a member also fails every other member of its group, on every rank alike (decided from
the exchanged data only).

That decision is the only place needed, because a group's members are decided together:

- on each rank they are pending together, from the same cycle on: the caller queues them
  all at once under the controller's lock (``Controller.put``), and the controller's thread
  (``Intake.take``) and a caller running a planned cycle (``CallerRuns.run_here``) take the
  whole queue;
- so a full exchange sees every member on the same ranks, and a member can only fail once all
  ranks have submitted it: its siblings are then decided in the same exchange;
- a member that is not what the response cache holds (refused, or mismatched on some rank) is
  announced in a full exchange before any cycle can count its siblings ready without one
  (:mod:`accord.engine.negotiation.announce`), and a planned cycle completes nothing unless every rank
  has every request of the plan (:mod:`accord.engine.cycle.plan`).
"""
from __future__ import annotations

from typing import AbstractSet, Iterable, Mapping

from accord.engine.naming import Group
from accord.errors import with_hint


def group_failures(ready_ops: Mapping[str, str], errors: Mapping[str, str], invalid: AbstractSet[str],
                   groups: Iterable[Mapping[str, Group]]) -> tuple[dict[str, str], set[str]]:
    """The errors of ready requests whose group has a failed member, and which of them are
    invalid-argument errors (those whose first failed member's error is one).

    ``ready_ops``: ready name -> its op; ``errors``: the failed names' messages (``invalid``:
    those that are InvalidArgumentError, the rest MismatchError); ``groups``: per member of
    the exchange, name -> (key, size) of its grouped requests.
    """
    if not errors:
        return {}, set()
    key_of: dict[str, str] = {}
    for member in groups:
        for name, (key, _) in member.items():
            key_of.setdefault(name, key)
    failed: dict[str, list[str]] = {}
    for name in errors:
        key = key_of.get(name)
        if key is not None:
            failed.setdefault(key, []).append(name)
    out: dict[str, str] = {}
    out_invalid: set[str] = set()
    for name, op in ready_ops.items():
        key = key_of.get(name)
        if key is not None and key in failed:
            culprits = sorted(failed[key], key=_member_order)
            out[name] = sibling_message(name, op, key, culprits, errors[culprits[0]])
            if culprits[0] in invalid:
                out_invalid.add(name)
    return out, out_invalid


def _member_order(name: str) -> tuple[int, str]:
    # A group's names differ only in their index (``g_2of12`` / ``g_10of12``): shorter first,
    # then alphabetical, is their order in the call.
    return len(name), name


def sibling_message(name: str, op: str, key: str, culprits: list[str], first_error: str) -> str:
    """E.g. "allreduce 'g_1of2' did not run: its group 'g' runs all of its tensors or none, and
    its member 'g_2of2' failed on every rank:" + that member's error, its HINT extended."""
    what, _, hint = first_error.partition("\nHINT: ")
    which = ("member " if len(culprits) == 1 else "members ") + ", ".join(repr(c) for c in culprits)
    fix = (f"no tensor of the group was changed; fix {culprits[0]!r} as the error says and call the "
           "group again")
    return with_hint(f"{op} {name!r} did not run: its group {key!r} runs all of its tensors or none, and "
                     f"its {which} failed on every rank:\n{what}",
                     f"{hint.strip()}; {fix}" if hint else fix)
