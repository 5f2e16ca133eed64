"""Randomized engine stress: rounds of random collectives that every rank plans alike from a
seed, submits in its own random order with random pauses, and checks against numpy.

A round's plan (:func:`plan_round`) is a list of items: op, dtype, shape, layout (contiguous,
transposed or strided views; empty tensors), process set, root, splits, reduce op, a name drawn
from a pool shared by all rounds (so the response cache sees names come back with other
signatures), grouped allreduces. Some rounds carry one injected mismatch: on one member rank
an item's shape, dtype, reduce op or root differs, and every member must get a MismatchError
(none may hang). Everything else in that round must still be right.

``run_stress(rank, size, seed, rounds)`` runs after ``session.init()`` on every rank and returns
a report (checks, failures, mismatches seen); expected values come from
:mod:`helpers.comm_checks` (numpy, every rank's input regenerated here).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from accord.engine import session
from accord.errors import MismatchError
from helpers.comm_checks import AVG, MAX, MIN, PROD, SUM, expected_reduce, tolerance, values
from helpers.values import bits_equal, to_tensor, within

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64)
KINDS = ("allreduce", "allreduce", "grouped", "allgather", "broadcast", "alltoall", "reducescatter",
         "reduce", "gather", "scatter", "barrier")
NAME_POOL = 48


def process_sets(size: int) -> list[list[int]]:
    """The extra process sets every rank registers (ids 1, 2 in this order)."""
    return [[0, 2], list(range(1, size))]


@dataclass
class Item:
    """One collective of a round, as planned (the same on every rank)."""

    index: int
    kind: str
    name: str
    set_id: int
    members: list[int]
    dtype: torch.dtype
    shape: tuple[int, ...]  # per member for ragged ops: see rows
    layout: str = "contiguous"
    op: Any = SUM
    root: int = -1
    rows: list[int] = field(default_factory=list)  # ragged first dims, per member
    splits: list[list[int]] = field(default_factory=list)  # alltoall: splits[src][dst]
    in_place: bool = False
    parts: int = 1  # grouped: number of tensors
    mismatch: str = ""  # injected: "shape", "dtype", "op" or "root"
    culprit: int = -1  # the rank whose request differs


def _ops_for(dtype: torch.dtype) -> tuple:
    return (SUM, AVG, MIN, MAX, PROD) if dtype.is_floating_point else (SUM, MIN, MAX, PROD)


def plan_round(seed: int, rnd: int, size: int) -> list[Item]:
    """The items of round ``rnd`` (identical on every rank)."""
    rng = np.random.default_rng([seed, rnd])
    sets = [list(range(size))] + process_sets(size)
    count = int(rng.integers(8, 18))
    names = rng.choice(NAME_POOL, size=count, replace=False)
    items = []
    for i, n in enumerate(names):
        kind = str(rng.choice(KINDS))
        set_id = int(rng.integers(0, len(sets))) if rng.random() < 0.4 else 0
        members = sets[set_id]
        dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
        cols = int(rng.integers(1, 6))
        rows = int(rng.integers(0, 5)) if rng.random() < 0.25 else int(rng.integers(1, 40))
        item = Item(i, kind, f"pool.{int(n)}", set_id, members, dtype, (rows, cols),
                    layout=str(rng.choice(["contiguous", "contiguous", "transposed", "strided"])),
                    root=int(rng.choice(members)), in_place=bool(rng.random() < 0.5))
        if kind in ("allreduce", "grouped", "reduce"):
            ops = _ops_for(dtype)
            item.op = ops[int(rng.integers(0, len(ops)))]
            item.parts = int(rng.integers(2, 5)) if kind == "grouped" else 1
        elif kind == "reducescatter":
            item.op = SUM if not dtype.is_floating_point or rng.random() < 0.5 else AVG
        elif kind in ("allgather", "gather"):
            item.rows = [int(rng.integers(0, 4)) for _ in members]
        elif kind == "scatter":
            item.rows = [int(rng.integers(0, 4)) for _ in members]
        elif kind == "alltoall":
            item.splits = [[int(rng.integers(0, 3)) for _ in members] for _ in members]
        items.append(item)
    # One mismatch in about a third of the rounds, on an item with two or more members.
    candidates = [it for it in items if it.kind in ("allreduce", "broadcast") and len(it.members) > 1]
    if candidates and rng.random() < 0.35:
        it = candidates[int(rng.integers(0, len(candidates)))]
        kinds = ["shape", "dtype", "op"] if it.kind == "allreduce" else ["shape", "dtype", "root"]
        it.mismatch = str(rng.choice(kinds))
        it.culprit = int(rng.choice(it.members))
    return items


def _layout(array: np.ndarray, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """A tensor holding ``array`` (2-D), contiguous or as a non-contiguous view."""
    if layout == "transposed":
        return to_tensor(np.ascontiguousarray(array.T), dtype).t()
    if layout == "strided":  # every other column of a wider tensor
        wide = np.zeros((array.shape[0], 2 * array.shape[1]), dtype=array.dtype)
        wide[:, ::2] = array
        return to_tensor(wide, dtype)[:, ::2]
    return to_tensor(array, dtype)


class Round:
    """Submits this rank's part of one round and checks the results."""

    def __init__(self, seed: int, rnd: int, rank: int, size: int) -> None:
        self.seed, self.rnd, self.rank, self.size = seed, rnd, rank, size
        self.key = f"{seed}.{rnd}"
        self.failures: list[str] = []
        self.checks = 0
        self.mismatches = 0

    def _fail(self, item: Item, what: str) -> None:
        self.failures.append(f"[seed {self.seed} round {self.rnd} rank {self.rank}] item {item.index} "
                             f"{item.kind} {item.name} ({item.dtype}, {item.layout}, set {item.set_id}): {what}")

    def _input(self, item: Item, grank: int, shape: tuple, part: int = 0) -> np.ndarray:
        return values(f"{self.key}.{item.index}.{part}", grank, shape, item.dtype, item.op)

    def _check(self, item: Item, what: str, got: Any, want: np.ndarray, dtype: torch.dtype, bound: Any = None) -> None:
        self.checks += 1
        if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != np.shape(want):
            desc = f"{got.dtype} {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)[:60]
            self._fail(item, f"{what}: got {desc}, expected {dtype} {np.shape(want)}")
        elif not (bits_equal(got, want, dtype) if bound is None else within(got, want, bound)):
            self._fail(item, f"{what}: values differ (first got {got.flatten()[:4].tolist()}, "
                             f"expected {np.asarray(want).ravel()[:4].tolist()})")

    # --- submitting ----------------------------------------------------------------------

    def submit(self, item: Item) -> Any:
        """Submit this rank's request(s) for ``item``; return what :meth:`check` needs."""
        me = item.members.index(self.rank)
        dtype, shape = item.dtype, item.shape
        op, root = item.op, item.root
        if item.culprit == self.rank:
            if item.mismatch == "shape":
                shape = (shape[0], shape[1] + 1)
            elif item.mismatch == "dtype":
                dtype = torch.float64 if dtype != torch.float64 else torch.float32
            elif item.mismatch == "op":
                op = MAX if op != MAX else MIN
            elif item.mismatch == "root":
                root = next(r for r in item.members if r != item.root)
        kw = dict(process_set_id=item.set_id)
        if item.kind in ("allreduce", "grouped", "reduce", "reducescatter"):
            kw["reduce_op"] = op
        k = item.kind
        if k == "barrier":
            return [session.submit("barrier", None, item.name, **kw)], None
        if k == "grouped":
            ts = [_layout(self._input(item, self.rank, (shape[0] + p, shape[1]), p), dtype, item.layout)
                  for p in range(item.parts)]
            return session.submit_group("allreduce", ts, item.name, in_place=item.in_place, **kw), ts
        if k in ("allreduce", "broadcast"):
            t = _layout(self._input(item, self.rank, shape), dtype, item.layout)
            if k == "broadcast":
                kw["root_rank"] = root
            return [session.submit(k, t, item.name, in_place=item.in_place, **kw)], t
        if k in ("reduce", "reducescatter"):
            if k == "reduce":
                kw["root_rank"] = root
            t = _layout(self._input(item, self.rank, shape), dtype, item.layout)
            return [session.submit(k, t, item.name, **kw)], t
        if k in ("allgather", "gather"):
            t = _layout(self._input(item, self.rank, (item.rows[me], shape[1])), dtype, item.layout)
            if k == "gather":
                kw["root_rank"] = root
            return [session.submit(k, t, item.name, **kw)], t
        if k == "scatter":
            if self.rank == root:
                full = self._input(item, root, (sum(item.rows), shape[1]))
                return [session.submit(k, _layout(full, dtype, item.layout), item.name, root_rank=root,
                                       splits=item.rows, **kw)], None
            return [session.submit(k, torch.empty(0, shape[1], dtype=dtype), item.name, root_rank=root, **kw)], None
        if k == "alltoall":
            t = _layout(self._input(item, self.rank, (sum(item.splits[me]), shape[1])), dtype, item.layout)
            return [session.submit(k, t, item.name, splits=item.splits[me], **kw)], t
        raise AssertionError(f"unknown kind {k}")

    # --- checking ------------------------------------------------------------------------

    def check(self, item: Item, handles: list, mine: Any) -> None:
        """Wait for ``item``'s handles and compare with numpy (or expect the mismatch)."""
        try:
            results = [session.synchronize(h) for h in handles]
        except MismatchError as exc:
            if item.mismatch and item.name in str(exc) and "HINT:" in str(exc):
                self.mismatches += 1
            else:
                self._fail(item, f"unexpected MismatchError: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - reported with the seed
            self._fail(item, f"raised {type(exc).__name__}: {str(exc)[:300]}")
            return
        if item.mismatch:
            self._fail(item, f"injected {item.mismatch} mismatch (rank {item.culprit}) did not raise")
            return
        self._expect(item, results, mine)

    def _expect(self, item: Item, results: list, mine: Any) -> None:
        k, dtype, members, me = item.kind, item.dtype, item.members, item.members.index(self.rank)
        shape = item.shape
        if k == "barrier":
            if results != [None]:
                self._fail(item, f"barrier returned {results}")
            self.checks += 1
            return
        if k in ("allreduce", "grouped", "reduce", "reducescatter"):
            tensors = mine if k == "grouped" else [mine]
            for p, got in enumerate(results):
                pshape = (shape[0] + p, shape[1])
                ins = [self._input(item, r, pshape, p) for r in members]
                want, bound = expected_reduce(ins, item.op, dtype), tolerance(ins, item.op, dtype)
                if k == "reduce" and self.rank != item.root:
                    if got is not None:
                        self._fail(item, "a non-root rank got a reduce result")
                    continue
                if k == "reducescatter":
                    counts = [len(x) for x in np.array_split(np.arange(pshape[0]), len(members))]
                    part = slice(sum(counts[:me]), sum(counts[:me + 1]))
                    want, bound = want[part], None if bound is None else bound[part]
                self._check(item, f"result {p}", got, want, dtype, bound)
                if item.in_place and k in ("allreduce", "grouped"):
                    if got is not tensors[p]:
                        self._fail(item, "in-place result is not the submitted tensor")
                    self._check(item, f"in-place tensor {p}", tensors[p], want, dtype, bound)
                else:
                    self._check(item, f"input {p} untouched", tensors[p],
                                self._input(item, self.rank, pshape, p), dtype)
            return
        got = results[0]
        if k == "broadcast":
            self._check(item, "broadcast", got, self._input(item, item.root, shape), dtype)
        elif k in ("allgather", "gather"):
            want = np.concatenate([self._input(item, r, (item.rows[i], shape[1])) for i, r in enumerate(members)])
            if k == "allgather" or self.rank == item.root:
                self._check(item, k, got, want, dtype)
            elif got is not None:
                self._fail(item, "a non-root rank got a gather result")
        elif k == "scatter":
            full = self._input(item, item.root, (sum(item.rows), shape[1]))
            self._check(item, "scatter", got, full[sum(item.rows[:me]):sum(item.rows[:me + 1])], dtype)
        elif k == "alltoall":
            out, received = got
            parts = []
            for i, r in enumerate(members):
                src = self._input(item, r, (sum(item.splits[i]), shape[1]))
                parts.append(src[sum(item.splits[i][:me]):sum(item.splits[i][:me + 1])])
            self._check(item, "alltoall", out, np.concatenate(parts), dtype)
            self.checks += 1
            if [int(x) for x in received] != [item.splits[i][me] for i in range(len(members))]:
                self._fail(item, f"alltoall received splits {received}")


def run_stress(rank: int, size: int, seed: int, rounds: int, max_pause: float = 0.002) -> dict[str, Any]:
    """Every round: submit this rank's items in its own random order with random pauses, then
    wait for them in another random order and check. Returns checks, failures, mismatches."""
    for ranks in process_sets(size):
        session.add_process_set(ranks)
    report: dict[str, Any] = {"checks": 0, "failures": [], "mismatches": 0, "planned_mismatches": 0,
                              "inflight_after": None}
    for rnd in range(rounds):
        items = [it for it in plan_round(seed, rnd, size) if rank in it.members]
        order = np.random.default_rng([seed, rnd, rank, 1])
        rd = Round(seed, rnd, rank, size)
        submitted = []
        for i in order.permutation(len(items)):
            if order.random() < 0.3:
                time.sleep(float(order.random()) * max_pause)
            try:
                submitted.append((items[i], *rd.submit(items[i])))
            except Exception as exc:  # noqa: BLE001
                rd._fail(items[i], f"submit raised {type(exc).__name__}: {str(exc)[:300]}")
        for j in order.permutation(len(submitted)):
            rd.check(*submitted[j])
        report["checks"] += rd.checks
        report["failures"] += rd.failures
        report["mismatches"] += rd.mismatches
        report["planned_mismatches"] += sum(1 for it in items if it.mismatch)
    report["inflight_after"] = session.engine().inflight_names()
    return report
