"""Which pending requests a rank must announce in a full exchange (controller thread only).

A request that matches a response cache entry (same name and signature) only counts in the
negotiation vector; one that does not is announced in a full exchange. The vector does not
name a peer's uncached requests, so one case needs care: a peer has announced a name with
another signature (a mismatch, or arguments it refused, see
:meth:`~accord.engine.request.Request.refuse`) and this rank submits the name later with the
cached signature. Counted only, the ranks would see partial counts and nothing else until the
stall inspector's next full exchange (60 s by default): a hang instead of an error at once. So
the controller remembers the names peers announced that it had not submitted at the last full
exchange (:func:`awaited_names`), and a request under one of them asks for a full exchange
(:func:`classify`).
"""
from __future__ import annotations

from typing import AbstractSet, Iterable, Sequence

from accord.engine.negotiation.negotiate import Partial, ResponseCache
from accord.engine.request import Request


def classify(pending: Sequence[Request], cache: ResponseCache,
             awaited: AbstractSet[str]) -> tuple[dict[int, Request], bool, bool]:
    """(pending requests that match a cache entry by id; whether a full exchange is needed to
    announce a request; whether announced requests wait without a cache entry)."""
    by_id: dict[int, Request] = {}
    unknown = uncached = False
    for r in pending:
        i = cache.id_of(r.name, r.signature)
        if i is not None:
            by_id[i] = r
            if awaited and not r.announced and r.name in awaited:  # (an empty set costs nothing)
                unknown = True
        elif not r.announced:
            unknown = True
        else:
            uncached = True
    return by_id, unknown, uncached


def awaited_names(partial: Iterable[Partial], rank: int) -> frozenset[str]:
    """The names of a full exchange's decision that other members submitted and ``rank`` had
    not (yet)."""
    return frozenset(p.name for p in partial if rank in p.missing)
