"""Deciding, identically on every rank, which named requests are ready (pure logic, no I/O).

Every cycle each rank contributes one small int vector to one SUM allreduce::

    [want_full_exchange, shutdown, joined, uncached_waiting, count_0 .. count_{k-1}]

where ``count_i`` is 1 when this rank has a pending request matching cache entry ``i`` (same
name and signature), and ``uncached_waiting`` is 1 when it waits on announced requests that have
no cache entry yet. Entry ``i`` is ready when its count equals its process set's size. When the
summed ``want_full_exchange`` is non-zero, every rank instead sends the (name, signature, age)
of all its pending requests, and the members of the process sets they use (JSON, never
pickle), and :func:`decide` works out, from the same data on every rank, what is ready, what is
mismatched and what is waiting on absent ranks. Nothing rank-local enters a decision: a rank
may register a process set a little later than its peers without the ranks diverging.
Steady state (the same names every step) therefore costs one small allreduce per cycle.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from accord.engine.naming import Group
from accord.engine.negotiation.all_or_none import group_failures
from accord.engine.negotiation.group_sizes import group_size_problem, group_sizes
from accord.engine.negotiation.join import joined_root_message
from accord.engine.negotiation.mismatch import mismatch_message
from accord.engine.negotiation.validate import refused_message, root_outside_message
from accord.engine.request import ROOTED_OPS, Op, Signature
from accord.errors import with_hint

WANT_FULL, SHUTDOWN, JOINED, UNCACHED = 0, 1, 2, 3
HEADER = 4  # slots before the per-entry counts

SetMap = Mapping[int, Sequence[int]]  # process set id -> its global ranks
Vector = Sequence[int]  # one rank's negotiation vector, or their sum


class ResponseCache:
    """Agreed (name, signature) pairs with ids that are equal on every rank.

    Every rank applies the same updates in the same order (only from :func:`decide`), so ids
    agree. When full, the least recently ready entry is replaced in place, which keeps the
    negotiation vector at most ``capacity`` long.
    """

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._names: list[str] = []
        self._sigs: list[Signature] = []
        self._sizes: list[int] = []  # members of the entry's process set
        self._last_used: list[int] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._names)

    def id_of(self, name: str, signature: Signature) -> int | None:
        """The entry id for exactly this (name, signature), or None."""
        i = self._index.get(name)
        return i if i is not None and self._sigs[i] == signature else None

    def touch(self, ids: Iterable[int], tick: int) -> None:
        """Record that these entries were ready at cycle ``tick`` (for eviction)."""
        for i in ids:
            self._last_used[i] = tick

    def set_size(self, i: int) -> int:
        """How many ranks must count entry ``i`` for it to be ready."""
        return self._sizes[i]

    def put(self, name: str, signature: Signature, set_size: int, tick: int,
            protected: set[int]) -> int | None:
        """Insert or update ``name``; return its id, or None when full of ``protected`` entries."""
        i = self._index.get(name)
        if i is None:
            if len(self._names) < self.capacity:
                i = len(self._names)
                self._names.append(name)
                self._sigs.append(signature)
                self._sizes.append(set_size)
                self._last_used.append(tick)
                self._index[name] = i
                return i
            candidates = [j for j in range(len(self._names)) if j not in protected]
            if not candidates:
                return None
            i = min(candidates, key=lambda j: (self._last_used[j], j))
            del self._index[self._names[i]]
            self._names[i] = name
            self._index[name] = i
        self._sigs[i] = signature
        self._sizes[i] = set_size
        self._last_used[i] = tick
        return i


def build_vector(cache_ids: Iterable[int], cache_size: int, *, want_full: bool, shutdown: bool,
                 joined: bool, uncached: bool = False) -> list[int]:
    """This rank's contribution to the negotiation allreduce."""
    vec = [0] * (HEADER + cache_size)
    vec[WANT_FULL], vec[SHUTDOWN], vec[JOINED] = int(want_full), int(shutdown), int(joined)
    vec[UNCACHED] = int(uncached)
    for i in cache_ids:
        vec[HEADER + i] = 1
    return vec


def ready_from_counts(sums: Sequence[int], cache: ResponseCache) -> list[int]:
    """Cache ids whose summed count equals their process set's size, in id order."""
    return [i for i in range(len(cache)) if sums[HEADER + i] and sums[HEADER + i] == cache.set_size(i)]


def steady(sums: Sequence[int], cache: ResponseCache) -> bool:
    """Whether a negotiation (without a full exchange) showed every member with exactly the
    same cached names pending: no shutdown, join or uncached requests, no partial counts."""
    if sums[WANT_FULL] or sums[SHUTDOWN] or sums[JOINED] or sums[UNCACHED]:
        return False
    return all(c == 0 or c == cache.set_size(i) for i, c in enumerate(sums[HEADER:HEADER + len(cache)]))


def peers_wait_on_me(sums: Sequence[int], mine: Vector, uncached_mine: bool) -> bool:
    """Whether another rank may be waiting for a request this rank has not submitted.

    ``mine`` is this rank's vector (from :func:`build_vector`). True when some cache entry was
    counted by others but not by this rank, or when another rank waits on uncached requests
    (conservative: their names are not in the vector). A rank that nobody waits on can block in
    the next negotiation straight away: its peers enter it as soon as they submit, so it neither
    spins nor adds latency. A rank that others wait on should instead sleep until its own caller
    submits something (see the engine's back-off).
    """
    if sums[UNCACHED] - int(uncached_mine) > 0:
        return True
    return any(total and not mine[HEADER + i] for i, total in enumerate(sums[HEADER:len(mine)]))


# --- full exchange --------------------------------------------------------------------------

Pending = dict[str, tuple[Signature, float]]  # name -> (signature, seconds pending)


def encode_pending(entries: Iterable[tuple[str, Signature, float]], sets: SetMap | None = None,
                   joined: bool = False, groups: Mapping[str, Group] | None = None) -> bytes:
    """This rank's pending (name, signature, seconds pending), the members of the process
    sets they use and, for grouped requests, their group's (key, size), as compact JSON bytes."""
    doc = {"j": int(joined), "p": [[n, s.to_json(), round(a, 3)] for n, s, a in entries],
           "s": {str(k): list(v) for k, v in (sets or {}).items()}}
    if groups:
        doc["g"] = {n: [k, size] for n, (k, size) in groups.items()}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_pending(data: bytes) -> tuple[Pending, dict[int, tuple[int, ...]], bool]:
    """Inverse of :func:`encode_pending`: ({name: (signature, age)}, {set: ranks}, joined)."""
    return _from_doc(json.loads(data.decode()))


def _from_doc(doc: dict) -> tuple[Pending, dict[int, tuple[int, ...]], bool]:
    pending = {str(n): (Signature.from_json(s), float(a)) for n, s, a in doc["p"]}
    sets = {int(k): tuple(int(r) for r in v) for k, v in doc.get("s", {}).items()}
    return pending, sets, bool(doc["j"])


@dataclass
class Exchange:
    """Every member's contribution to one full exchange, in communicator order.

    ``ranks`` are the members' global ranks (None: positions are global ranks, the global
    set); ``joined`` holds global ranks. ``groups``: per member, name -> (key, size) of its
    grouped requests (empty, or missing, where a member has none).
    """

    pending: list[Pending]
    sets: list[dict[int, tuple[int, ...]]]
    joined: list[int]
    ranks: tuple[int, ...] | None = None
    groups: list[dict[str, Group]] = field(default_factory=list)

    def global_ranks(self) -> tuple[int, ...]:
        """The global rank of each position."""
        return tuple(range(len(self.pending))) if self.ranks is None else self.ranks


def split_payloads(data: bytes, size: int, ranks: Sequence[int] | None = None) -> Exchange:
    """Split the allgathered payloads of ``size`` members (each JSON document delimits itself);
    ``ranks``: the members' global ranks (default 0 .. size-1).

    Raises ValueError on malformed data.
    """
    decoder = json.JSONDecoder()
    text, pos = data.decode(), 0
    out = Exchange([], [], [], None if ranks is None else tuple(ranks))
    members = out.global_ranks() if ranks is not None else range(size)
    for position in range(size):
        doc, pos = decoder.raw_decode(text, pos)
        pending, sets, joined = _from_doc(doc)
        out.pending.append(pending)
        out.sets.append(sets)
        out.groups.append({str(n): (str(k), int(size)) for n, (k, size) in doc.get("g", {}).items()})
        if joined:
            out.joined.append(members[position])
    if pos != len(text):
        raise ValueError(f"negotiation payload has {len(text) - pos} trailing bytes")
    return out


@dataclass(frozen=True)
class Partial:
    """A name some members of its process set submitted and others did not (yet)."""

    name: str
    process_set: int
    present: tuple[int, ...]
    missing: tuple[int, ...]
    age: float  # longest time any present rank has waited on it


@dataclass
class Decision:
    """Outcome of a full exchange, identical on every rank."""

    ready: list[str] = field(default_factory=list)  # execution order (cache id, then uncached)
    errors: dict[str, str] = field(default_factory=dict)  # name -> MismatchError message
    invalid: set[str] = field(default_factory=set)  # errors that are InvalidArgumentError instead
    partial: list[Partial] = field(default_factory=list)
    # ready name -> (agreed signature, members of its process set): what a joined rank needs
    # to build a stand-in for a name it never submitted
    agreed: dict[str, tuple[Signature, tuple[int, ...]]] = field(default_factory=dict)
    # errored name -> its root rank, for rooted ops whose root joined instead of submitting
    joined_roots: dict[str, int] = field(default_factory=dict)


def decide(exchange: Exchange, cache: ResponseCache, tick: int) -> Decision:
    """Classify every name submitted anywhere; update ``cache`` with the ready ones.

    A joined rank counts as present for every name, except as the root of a rooted op it did
    not submit (it has no data to send and nobody to receive for): that is an error. A member
    of a group that fails fails the whole group (:mod:`accord.engine.negotiation.all_or_none`). Mutates
    ``cache`` identically on every rank (the exchange is the same everywhere).
    """
    per_rank = exchange.pending
    ranks = exchange.global_ranks()
    joined_set = set(exchange.joined)
    decision = Decision()
    ready: list[tuple[str, Signature, int]] = []
    groups = exchange.groups + [{}] * (len(per_rank) - len(exchange.groups))
    keys, sizes = group_sizes(ranks, per_rank, groups)
    for name in sorted(set().union(*per_rank)):
        holders = {ranks[p]: d[name] for p, d in enumerate(per_rank) if name in d}
        sigs = {r: sig for r, (sig, _) in holders.items()}
        sig = next(iter(sigs.values()))
        views = {ranks[p]: s for p, s in enumerate(exchange.sets)}
        group, problem = _members_of_all(sigs, holders, views, len(per_rank))
        if not problem:
            problem = group_size_problem({keys[r][name] for r in holders}, sizes, group, joined_set, sig.op)
        if problem:
            decision.errors[name] = problem
            continue
        missing = tuple(r for r in group if r not in holders and r not in joined_set)
        refused = {r: s.problem for r, s in sigs.items() if s.problem}  # arguments a rank refused
        if refused or len(set(sigs.values())) > 1:
            # As in Horovod, a mismatch is reported once every member has submitted the name:
            # reported earlier, a member that submits it later would wait for peers that have
            # already moved on (a hang instead of an error on every rank).
            if missing:
                age = max(a for _, a in holders.values())
                decision.partial.append(Partial(name, sig.process_set, tuple(sorted(holders)), missing, age))
            elif refused:
                decision.errors[name] = refused_message(name, sig.op, refused)
                decision.invalid.add(name)
            else:
                decision.errors[name] = mismatch_message(name, sigs)
            continue
        if not missing and Op(sig.op) in ROOTED_OPS and sig.root not in group:
            decision.errors[name] = root_outside_message(name, sig.op, sig.root, sig.process_set, group)
            decision.invalid.add(name)
            continue
        if not missing and Op(sig.op) in ROOTED_OPS and sig.root not in holders:
            decision.errors[name] = joined_root_message(name, sig)
            decision.joined_roots[name] = sig.root
            continue
        if missing:
            age = max(a for _, a in holders.values())
            decision.partial.append(Partial(name, sig.process_set, tuple(sorted(holders)), missing, age))
        else:
            ready.append((name, sig, len(group)))
            decision.agreed[name] = (sig, group)
    # A grouped call runs all or none: a failed member fails its ready siblings (all_or_none.py).
    siblings, invalid = group_failures({n: s.op for n, s, _ in ready}, decision.errors, decision.invalid, groups)
    decision.errors.update(siblings)
    decision.invalid |= invalid
    ready = [e for e in ready if e[0] not in siblings]
    decision.agreed = {n: a for n, a in decision.agreed.items() if n not in siblings}
    # New ids follow the submission order of the lowest rank holding each name (then the name):
    # the same on every rank, and usually the order tensors were produced in, so a batch of
    # gradients that are views of one flat buffer lies back to back (see fusion.adjacent_span).
    position = [{n: i for i, n in enumerate(d)} for d in per_rank]
    first = {name: min(r for r, d in enumerate(per_rank) if name in d) for name, _, _ in ready}
    ready.sort(key=lambda e: (position[first[e[0]]][e[0]], e[0]))
    protected = {i for n, s, _ in ready if (i := cache.id_of(n, s)) is not None}
    ordered: list[tuple[int, str]] = []
    uncached: list[str] = []
    for name, sig, set_size in ready:
        i = cache.put(name, sig, set_size, tick, protected)
        if i is None:
            uncached.append(name)
        else:
            protected.add(i)
            ordered.append((i, name))
    decision.ready = [n for _, n in sorted(ordered)] + uncached
    return decision


def _members_of_all(sigs: Mapping[int, Signature], holders: Mapping[int, object],
                    sets: Mapping[int, Mapping[int, Sequence[int]]], size: int) -> tuple[tuple[int, ...], str]:
    """The ranks that must submit a name: the members of every process set its holders name
    (one set, unless the signatures disagree), or a problem."""
    members: set[int] = set()
    for set_id in {s.process_set for s in sigs.values()}:
        users = {r: h for r, h in holders.items() if sigs[r].process_set == set_id}
        group, problem = _members(set_id, users, sets, size)
        if problem:
            return (), problem
        members.update(group)
    return tuple(sorted(members)), ""


def _members(set_id: int, holders: Mapping[int, object], sets: Mapping[int, Mapping[int, Sequence[int]]],
             size: int) -> tuple[tuple[int, ...], str]:
    """The members of ``set_id`` as the ranks holding the name report them (``sets``: global
    rank -> that rank's view of the sets), or a problem."""
    if set_id == 0:
        return tuple(range(size)), ""
    views = {r: tuple(sets[r].get(set_id, ())) for r in holders}
    unknown = [r for r, v in views.items() if not v]
    if unknown:
        return (), with_hint(f"process set {set_id} is not registered on ranks {sorted(unknown)}",
                             "register it with add_process_set on every rank before using it")
    if len(set(views.values())) == 1:
        return next(iter(views.values())), ""
    seen = ", ".join(f"rank {r} has {list(v)}" for r, v in sorted(views.items()))
    return (), with_hint(f"process set {set_id} differs between ranks: {seen}",
                         "call add_process_set / remove_process_set on every rank, in the same order")
