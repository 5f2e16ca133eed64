"""What a parameter server does with authenticated requests (no sockets here; numpy, no torch).

Each store a worker creates is a *namespace* (``ns``) on the servers, in ``dist_sync`` or
``dist_async`` mode. A server holds *entries*: one per (key, piece) it owns (see
:mod:`accord.kvstore.sharding`), named ``"<wire key>#<piece>"``.

``dist_sync`` (MXNet's server, made order-exact): a round of an entry collects one push per
worker, merging as they arrive (sum, or max/min); when every worker has pushed, the stored value
becomes the merged value, or ``optimizer(merged, stored)``, and every push of the round is
acknowledged. A pull from a worker that pushed in the unfinished round waits for the round, so a
worker always pulls a value that includes its own push. A second push (or anything after it) from
a worker that already pushed in this round waits for the next round, keeping each worker's
requests in order. ``param_only`` entries store the mean over workers and skip the optimizer, as
do max/min rounds. A round with a refused push (wrong size, dtype or op) can never complete: the
requests waiting in it, and its later pushes, are answered with an error naming the rank whose
push was refused, and the key serves the next round with its value unchanged.

``dist_async``: each push is applied on its own as it arrives, with the optimizer (required:
a push without one is answered with an error, never a hang).

An array that a reply is still sending (zero-copy) is copied out of the reply's way before it is written
(:meth:`accord.kvstore.server.state.Buf.writable`), so a slow reader costs a copy, never a wait. A round's
first push is kept as received (its receive buffer, no copy) and merged with the second straight into the
round's buffer, so no push is copied just to be added. A server asks glibc to keep freed message buffers
(:func:`accord.kvstore.server.memory.retain_freed_memory`), so that receiving does not page-fault.
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Callable, Iterator

import numpy as np

from accord.kvstore import optimizers as opt
from accord.kvstore.protocol import HeaderTooLarge, PayloadSeal
from accord.kvstore.server.codec import dequantize_2bit
from accord.kvstore.server.state import Buf, Entry, Space

log = logging.getLogger("accord.kvstore")

# Header bytes of state entries per get_states answer: a page, so that an answer for any number
# of keys stays under the header limit (protocol.MAX_HEADER, 64 KiB).
STATES_PAGE = 48 * 1024

# reply(peer, request header, answer fields, payloads, their reusable PayloadSeal or None,
# the buffer they live in, whose writes must wait for zero-copy sends)
Reply = Callable[[Any, dict, dict, list, "PayloadSeal | None", "Buf | None"], None]


class RequestError(Exception):
    """A request the server refuses; the message goes back to the worker."""


def _dtype(name: Any) -> np.dtype:
    try:
        dtype = np.dtype(str(name))
    except TypeError:
        raise RequestError(f"unknown dtype {name!r}") from None
    if dtype.kind not in "biuf":
        raise RequestError(f"dtype {dtype} is not a number type")
    return dtype


class ServerCore:
    """The request handlers of one parameter server.

    Args:
        num_workers: workers in the job (a dist_sync round needs one push from each).
        server_id: this server's index (for messages).
        reply: sends an answer; see :data:`Reply`.
        payload_mac: whether messages authenticate array bytes (informational: the
            transport applies it; see :mod:`accord.kvstore.protocol`).
    """

    def __init__(self, num_workers: int, server_id: int, reply: Reply, payload_mac: bool = True) -> None:
        self.num_workers = num_workers
        self.payload_mac = payload_mac
        self.server_id = server_id
        self._reply = reply
        self._spaces: dict[int, Space] = {}
        self.stopped = False
        self._handlers = {
            "init": self._init, "push": self._push, "pull": self._pull, "barrier": self._barrier,
            "set_optimizer": self._set_optimizer, "get_states": self._get_states,
            "set_states": self._set_states, "ping": self._ping, "stop": self._stop,
        }

    # --- entry point -------------------------------------------------------------------------

    def handle(self, peer: Any, header: dict, payloads: list) -> None:
        """Handle one authenticated request (answers now, later, or with an error)."""
        with self._answering_errors(peer, header):
            op = header.get("op")
            handler = self._handlers.get(op) if isinstance(op, str) else None
            if handler is None:
                raise RequestError(f"unknown request {op!r}")
            nw = header.get("nw", self.num_workers)
            if nw != self.num_workers:
                raise RequestError(
                    f"the worker counts {nw} workers but this server was started for "
                    f"{self.num_workers}; check ACCORD_NUM_WORKERS/DMLC_NUM_WORKER")
            handler(peer, header, payloads)

    @contextlib.contextmanager
    def _answering_errors(self, peer: Any, header: dict) -> Iterator[None]:
        """Answer the request with an error when the block raises: an authenticated request
        never ends the server, and each gets exactly one answer (a sync round's backlog too)."""
        try:
            yield
        except RequestError as exc:
            self.error(peer, header, str(exc))
        except HeaderTooLarge as exc:
            self.error(peer, header, f"the answer to this {header.get('op')!r} request does not fit in "
                                     f"one message: {str(exc).splitlines()[0]}")
        except Exception as exc:  # noqa: BLE001 - an authenticated request never ends the server
            log.warning("server %d: malformed %s request: %r", self.server_id, header.get("op"), exc)
            self.error(peer, header, f"malformed {header.get('op')!r} request: {exc!r}")

    def ok(self, peer: Any, header: dict, fields: dict | None = None, payloads: list | None = None,
           reuse: PayloadSeal | None = None, buf: Buf | None = None) -> None:
        self._reply(peer, header, {"ok": True, **(fields or {})}, payloads or [], reuse, buf)

    def error(self, peer: Any, header: dict, message: str) -> None:
        self._reply(peer, header, {"error": message, "server": self.server_id}, [], None, None)

    # --- helpers -----------------------------------------------------------------------------

    def _space(self, header: dict) -> Space:
        ns = int(header["ns"])
        space = self._spaces.get(ns)
        sync = header.get("sync")
        if space is None:
            if sync is None:
                raise RequestError(f"store {ns} does not exist on server {self.server_id} yet")
            space = self._spaces[ns] = Space(bool(sync))
        elif sync is not None and bool(sync) != space.sync:
            raise RequestError(f"store {ns} is {'dist_sync' if space.sync else 'dist_async'} on "
                               f"the servers but this worker uses it as "
                               f"{'dist_sync' if sync else 'dist_async'}")
        return space

    def _entry(self, space: Space, header: dict) -> Entry:
        entry = space.entries.get(header["key"])
        if entry is None:
            raise RequestError(f"unknown key {_show(header['key'])}: it was never initialised on "
                               f"server {self.server_id} (did rank 0 call init?)")
        return entry

    def _value(self, entry: Entry, header: dict, payloads: list) -> np.ndarray:
        if len(payloads) != 1:
            raise RequestError(f"a push carries one payload, got {len(payloads)}")
        comp = header.get("comp")
        if comp is not None:
            threshold, n = float(comp[0]), int(comp[1])
            if n != entry.size:
                raise RequestError(f"push of key {_show(header['key'])} with {n} elements, but it "
                                   f"was initialised with {entry.size}")
            return dequantize_2bit(payloads[0], threshold, n)
        dtype = _dtype(header["dtype"])
        if dtype != entry.stored.array.dtype:
            raise RequestError(f"push of key {_show(header['key'])} as {dtype}, but it was "
                               f"initialised as {entry.stored.array.dtype}")
        value = np.frombuffer(payloads[0], dtype=dtype)
        if value.size != entry.size:
            raise RequestError(f"push of key {_show(header['key'])} with {value.size} elements, "
                               f"but it was initialised with {entry.size}")
        return value

    # --- requests ----------------------------------------------------------------------------

    def _init(self, peer: Any, header: dict, payloads: list) -> None:
        space = self._space(header)
        key = header["key"]
        if key in space.entries:
            raise RequestError(f"duplicate init of key {_show(key)}")
        dtype = _dtype(header["dtype"])
        if len(payloads) != 1:
            raise RequestError(f"an init carries one payload, got {len(payloads)}")
        value = np.frombuffer(payloads[0], dtype=dtype).copy()
        if value.size != int(header["n"]):
            raise RequestError(f"init of key {_show(key)}: header says {header['n']} elements, "
                               f"payload holds {value.size}")
        space.entries[key] = Entry(Buf(value), bool(header.get("param_only")))
        self.ok(peer, header)

    def _push(self, peer: Any, header: dict, payloads: list) -> None:
        space = self._space(header)
        entry = self._entry(space, header)
        rank = int(header["rank"])
        if space.sync:
            self._sync_message(space, entry, peer, header, payloads)
            return
        value = self._value(entry, header, payloads)
        if entry.param_only:
            np.copyto(entry.stored.writable(), value, casting="unsafe")
        elif header.get("rop", "sum") != "sum":
            raise RequestError(f"push op={header.get('rop')!r} needs dist_sync: dist_async applies "
                               "each push on its own, so there is nothing to take the max/min of")
        elif space.updater is None:
            raise RequestError("dist_async applies every push with the servers' optimizer, and "
                               "none is set; call kv.set_optimizer(...) before pushing")
        else:
            space.updater(header["key"], value, entry.stored.writable())
        log.debug("server %d: async push of %s from rank %d", self.server_id, header["key"], rank)
        self.ok(peer, header)

    def _pull(self, peer: Any, header: dict, payloads: list) -> None:
        space = self._space(header)
        entry = self._entry(space, header)
        if space.sync:
            self._sync_message(space, entry, peer, header, payloads)
        else:
            self._send_value(peer, header, entry)

    def _send_value(self, peer: Any, header: dict, entry: Entry) -> None:
        stored = entry.stored
        self.ok(peer, header, {"dtype": stored.array.dtype.str, "n": entry.size},
                [stored.array], stored.seal, stored)

    def _sync_message(self, space: Space, entry: Entry, peer: Any, header: dict,
                      payloads: list) -> None:
        """Place a push or pull of ``rank`` in the right round (see the module docstring)."""
        rank = int(header["rank"])
        if any(int(h["rank"]) == rank for _, h, _ in entry.backlog):
            entry.backlog.append((peer, header, payloads))
        elif header["op"] == "pull":
            if rank not in entry.contributors:
                self._send_value(peer, header, entry)
            elif entry.failed is not None:
                self.error(peer, header, entry.failed)
            else:
                entry.pulls.append((peer, header))
        elif rank in entry.contributors:
            entry.backlog.append((peer, header, payloads))
        elif entry.failed is not None:  # the round has no value: this push only ends it sooner
            self.error(peer, header, entry.failed)
            self._count_in(space, entry, header)
        else:
            try:
                self._contribute(space, entry, peer, header, payloads)
            except Exception as exc:  # noqa: BLE001 - refused: the round ends for everyone
                reason = str(exc) if isinstance(exc, RequestError) else \
                    f"malformed 'push' request: {exc!r}"
                self._fail_round(space, entry, peer, header, reason)

    def _fail_round(self, space: Space, entry: Entry, peer: Any, header: dict, reason: str) -> None:
        """A push of this round was refused, so the round can never have a value: answer the
        refused push with its reason and every request waiting in the round (and each push of
        it still to come) with the error, rather than leave them waiting for a push that will
        not come. The round ends once every worker has pushed in it (the refused one counts);
        the stored value is unchanged and the key serves the next round."""
        rank = int(header["rank"])
        entry.failed = (f"the dist_sync round of key {_show(header['key'])} cannot complete: the "
                        f"push of rank {rank} in it was refused ({reason})")
        entry.first = None
        log.warning("server %d: %s", self.server_id, entry.failed)
        self.error(peer, header, reason)
        waiting, entry.acks, entry.pulls = entry.acks + entry.pulls, [], []
        for p, h in waiting:
            self.error(p, h, entry.failed)
        self._count_in(space, entry, header)

    def _count_in(self, space: Space, entry: Entry, header: dict) -> None:
        """Count a push of a failed round; the last one ends the round."""
        entry.contributors.add(int(header["rank"]))
        if len(entry.contributors) == self.num_workers:
            backlog = entry.backlog
            entry.contributors, entry.backlog, entry.failed = set(), [], None
            self._next_round(space, entry, backlog)

    def _contribute(self, space: Space, entry: Entry, peer: Any, header: dict,
                    payloads: list) -> None:
        """Merge one push into the round (RequestError: the push is refused)."""
        value = self._value(entry, header, payloads)
        rop = header.get("rop", "sum")
        if rop not in ("sum", "max", "min"):
            raise RequestError(f"unknown push op {rop!r}")
        if entry.contributors and rop != entry.op:
            raise RequestError(f"push of key {_show(header['key'])} with op={rop!r} while other "
                               f"workers pushed op={entry.op!r} in this round")
        if entry.merged is None:
            entry.merged = Buf(np.empty_like(entry.stored.array))
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[rop]
        if not entry.contributors:
            entry.op = rop
            if self.num_workers > 1:
                entry.first = value  # merged with the second push in one pass
            else:
                np.copyto(entry.merged.writable(), value, casting="unsafe")
        elif entry.first is not None:
            fn(entry.first, value, out=entry.merged.writable(), casting="unsafe")
            entry.first = None
        else:
            merged = entry.merged.writable()
            fn(merged, value, out=merged, casting="unsafe")
        entry.contributors.add(int(header["rank"]))
        entry.acks.append((peer, header))
        if len(entry.contributors) == self.num_workers:
            self._complete(space, entry, header["key"])

    def _complete(self, space: Space, entry: Entry, key: str) -> None:
        """End a round: store its value, answer its pushes and pulls, then start the next round
        with the backlog. A round whose value cannot be applied still ends (every request of it
        gets the error), so that the key is not stuck forever."""
        acks, pulls, backlog = entry.acks, entry.pulls, entry.backlog
        entry.contributors, entry.acks, entry.pulls, entry.backlog = set(), [], [], []
        try:
            self._apply_round(space, entry, key)
        except Exception as exc:  # noqa: BLE001 - e.g. an optimizer that cannot update this dtype
            message = (f"the dist_sync round of key {_show(key)} ({entry.stored.array.dtype}, "
                       f"{entry.size} elements) could not be applied: {exc!r}")
            log.warning("server %d: %s", self.server_id, message)
            for peer, header in acks + pulls:
                self.error(peer, header, message)
        else:
            for peer, header in acks:
                self.ok(peer, header)
            for peer, header in pulls:
                self._send_value(peer, header, entry)
        self._next_round(space, entry, backlog)

    def _next_round(self, space: Space, entry: Entry, backlog: list[tuple[Any, dict, list]]) -> None:
        for peer, header, payloads in backlog:  # the next round, in arrival order
            with self._answering_errors(peer, header):
                self._sync_message(space, entry, peer, header, payloads)

    def _apply_round(self, space: Space, entry: Entry, key: str) -> None:
        """The round's merged value becomes the stored one (mean, or through the optimizer)."""
        merged = entry.merged
        assert merged is not None
        if entry.param_only:
            arr = merged.writable()
            if arr.dtype.kind == "f":
                arr /= self.num_workers
            else:
                arr //= self.num_workers
        if space.updater is None or entry.op != "sum" or entry.param_only:
            entry.stored, entry.merged = merged, entry.stored  # the merged value becomes stored
        else:
            space.updater(key, merged.array, entry.stored.writable())

    def _barrier(self, peer: Any, header: dict, payloads: list) -> None:
        waiting = self._space(header).barriers[int(header["gen"])]
        rank = int(header["rank"])
        if any(int(h["rank"]) == rank for _, h in waiting):
            raise RequestError(f"rank {rank} entered barrier {header['gen']} twice")
        waiting.append((peer, header))
        if len(waiting) == self.num_workers:
            for p, h in waiting:
                self.ok(p, h)
            del self._space(header).barriers[int(header["gen"])]

    def _set_optimizer(self, peer: Any, header: dict, payloads: list) -> None:
        try:
            optimizer = opt.from_config(header["optimizer"])
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        self._space(header).updater = opt.Updater(optimizer)
        log.info("server %d: store %s uses optimizer %r", self.server_id, header["ns"], optimizer)
        self.ok(peer, header)

    def _get_states(self, peer: Any, header: dict, payloads: list) -> None:
        """One page of the optimizer's states from entry ``start`` on; ``next`` is where the
        following page starts (None: this was the last)."""
        updater = self._space(header).updater
        start = header.get("start", 0)
        if type(start) is not int or start < 0:
            raise RequestError(f"get_states from entry {start!r}: not a count")
        total = len(updater.states) if updater is not None else 0
        entries, arrays, used, at = [], [], 0, start
        while at < total:
            ((key, count, states),) = updater.export(at, at + 1)  # type: ignore[union-attr]
            item = {"key": key, "count": count, "states": len(states), "dtypes": [s.dtype.str for s in states]}
            used += len(json.dumps(item)) + 1
            if entries and used > STATES_PAGE:
                break
            entries.append(item)
            arrays.extend(np.ascontiguousarray(s) for s in states)
            at += 1
        self.ok(peer, header, {"entries": entries, "next": at if at < total else None}, arrays)

    def _set_states(self, peer: Any, header: dict, payloads: list) -> None:
        space = self._space(header)
        if space.updater is None:
            raise RequestError("cannot load optimizer states: no optimizer is set on the servers")
        loaded, i = [], 0
        for item in header["entries"]:
            states = []
            for dtype in item["dtypes"]:
                states.append(np.frombuffer(payloads[i], dtype=_dtype(dtype)).copy())
                i += 1
            loaded.append((item["key"], int(item["count"]), states))
        space.updater.load(loaded)
        self.ok(peer, header)

    def _ping(self, peer: Any, header: dict, payloads: list) -> None:
        self.ok(peer, header, {"server": self.server_id})

    def _stop(self, peer: Any, header: dict, payloads: list) -> None:
        self.stopped = True
        self.ok(peer, header)


def _show(entry_key: str) -> str:
    """``"s:w#0"`` -> ``'w' (piece 0)`` for messages."""
    wire, _, piece = str(entry_key).partition("#")
    kind, _, name = wire.partition(":")
    shown = repr(name) if kind == "s" else name
    return f"{shown} (piece {piece})" if piece not in ("", "0") else shown
