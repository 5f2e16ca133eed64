"""The worker side of parameter-server stores: ``dist_sync``, ``dist_device_sync``, ``dist_async``.

Used when servers were launched (ACCORD_NUM_SERVERS / DMLC_NUM_SERVER > 0). At creation the
worker reads the servers' addresses from the job's authenticated store (ACCORD_PS_ROOT_URI/PORT
or ACCORD_STORE_ADDR/PORT) and opens a namespace on them (its n-th store; every worker creates
its stores in the same order).

- ``init``: rank 0 sends the value (never compressed), then every worker waits at a barrier.
- ``push``: the per-device values are merged here (on their device for ``*_device_*``), then
  each server gets its piece (:mod:`accord.kvstore.sharding`), 2-bit compressed when enabled
  (worker to server only). ``push`` returns once the data is sent; the servers' acknowledgement
  is collected by the next ``pull`` of the key, ``barrier`` or ``close``.
- ``pull``: the value after every earlier push of this worker to that key.
- ``set_optimizer``: rank 0 ships the optimizer's configuration to every server, then all wait.
- ``save_optimizer_states`` (any one worker) gathers the servers' optimizer states into one file,
  the same format as the local stores write; ``load_optimizer_states`` (every worker) sends them
  back, split the same way.
"""
from __future__ import annotations

import atexit
import functools
import json
import logging
import sys
from typing import Any, Sequence

import numpy as np
import torch

from accord.errors import AccordError, RendezvousError, with_hint
from accord.kvstore import optimizers as opt
from accord.kvstore import protocol
from accord.kvstore.base import Key, KVStoreBase
from accord.kvstore.connection import ServerConnections
from accord.kvstore.directory import PREFIX, SERVER_KEY, store_address
from accord.kvstore.gradient_compression import TwoBitCompression, create_compression
from accord.kvstore.local import as_optimizer
from accord.kvstore.settings import StoreLocation, WorkerSettings
from accord.kvstore.sharding import Part, partition, wire_key
from accord.kvstore.values import KeyInfo, reduce, to_tensor, write

__all__ = ["DistKVStore", "finalize"]

WORKER_COUNTER = PREFIX + "/worker_count"
STORE_COUNTER = PREFIX + "/stores/{rank}"


def _flat_numpy(value: Any, info: KeyInfo) -> tuple[np.ndarray, bool]:
    """``value`` as a flat contiguous CPU numpy array of the key's dtype; True when it is a
    private copy (False: it is the caller's memory)."""
    t = to_tensor(value)
    src = t
    t = t.to(device="cpu", dtype=info.dtype).contiguous()
    private = t.data_ptr() != src.data_ptr() or t.numel() == 0
    return t.numpy().reshape(-1), private


def _flat_view(out: Any) -> np.ndarray | None:
    """A flat numpy view of ``out``'s memory when it is a contiguous CPU array, else None."""
    if isinstance(out, np.ndarray):
        return out.reshape(-1) if out.flags.c_contiguous and out.flags.writeable else None
    if out.device.type != "cpu" or not out.is_contiguous() or out.dtype == torch.bfloat16:
        return None
    return out.detach().numpy().reshape(-1)


class _PullSink:
    """Writes a pulled key's pieces into its outputs as each one arrives (still in cache)."""

    def __init__(self, numel: int, outs: list[Any]) -> None:
        self.numel, self.held, self.bad = numel, 0, False
        views = [_flat_view(o) for o in outs]
        self.direct = [v for v in views if v is not None]  # CPU memory written in place
        self.others = [o for o, v in zip(outs, views) if v is None]  # via one assembled copy
        self.whole: np.ndarray | None = None

    def piece(self, part: Part, header: dict, payloads: list) -> None:
        try:
            array = np.frombuffer(payloads[0], dtype=np.dtype(header["dtype"]))
        except (IndexError, KeyError, TypeError, ValueError):
            array = None
        self.held += 0 if array is None else array.size
        if array is None or array.size != part.size:  # reported after the wait
            self.bad = True
            return
        for view in self.direct:
            np.copyto(view[part.start:part.stop], array, casting="unsafe")
        if self.others:
            if self.whole is None:
                self.whole = np.empty(self.numel, dtype=array.dtype)
            self.whole[part.start:part.stop] = array

    def finish(self) -> None:
        if self.others and self.whole is not None:
            for out in self.others:
                write(out, torch.from_numpy(self.whole))


def _pages(items: list[dict], arrays: list[np.ndarray],
           budget: int = 48 * 1024) -> list[tuple[list[dict], list[np.ndarray]]]:
    """``set_states`` entries (and their arrays, ``len(item["dtypes"])`` each) in pages whose
    header stays under the servers' limit (protocol.MAX_HEADER) however many keys there are."""
    pages: list[tuple[list[dict], list[np.ndarray]]] = []
    page: list[dict] = []
    used = at = start = 0
    for item in items:
        cost = len(json.dumps(item)) + 1
        if page and used + cost > budget:
            pages.append((page, arrays[start:at]))
            page, used, start = [], 0, at
        page.append(item)
        used += cost
        at += len(item["dtypes"])
    if page or not pages:
        pages.append((page, arrays[start:at]))
    return pages


def _log_to_stderr() -> None:
    """PS_VERBOSE: show connection events on stderr, as ps-lite does (once per process)."""
    log = logging.getLogger("accord.kvstore")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[accord-kvstore worker] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


_exit_hook: list[Any] = []  # the registered stop function, at most one
_assigned_rank: list[int] = []  # this process's rank when the store counter assigned it


def _stop_servers_at_exit(endpoints: list[str], secret: bytes, rank: int, num_workers: int,
                          timeout: float, payload_mac: bool) -> None:
    """Started MXNet-style (the store is a scheduler, not accordrun's), nobody else stops the
    servers: as MXNet's workers do when they finish, every worker meets the others at exit and
    rank 0 then stops the servers (registered once per process)."""
    if _exit_hook:
        return

    def stop() -> None:
        conns = ServerConnections(endpoints, secret, rank, num_workers, timeout, payload_mac=payload_mac)
        space = {"ns": -1, "sync": True}  # a namespace no store uses
        try:
            conns.wait([conns.request(0, "barrier", {**space, "gen": 1})[0]], "the exit barrier")
            if rank == 0:
                conns.wait([conns.request(i, "stop", space)[0] for i in range(len(endpoints))], "stop")
        except AccordError as exc:
            logging.getLogger("accord.kvstore").warning("could not stop the servers at exit: %s", exc)
        finally:
            conns.close()

    _exit_hook.append(stop)
    atexit.register(stop)


def finalize() -> None:
    """In an MXNet-style job, meet the other workers and (rank 0) stop the servers now rather
    than at exit (ps-lite's ``Finalize``). Collective; a no-op elsewhere or when already done."""
    if _exit_hook and _exit_hook[0] is not None:
        stop, _exit_hook[0] = _exit_hook[0], None
        atexit.unregister(stop)
        stop()


class DistKVStore(KVStoreBase):
    """A store whose values live on parameter servers (see the module docstring)."""

    def __init__(self, name: str, num_servers: int) -> None:
        super().__init__(name)
        from accord.store.connection import StoreConnection

        self._sync = name != "dist_async"
        self._on_device = "device" in name
        secret = protocol.load_secret()
        location = StoreLocation.from_config()
        host, port = store_address(location)
        settings = WorkerSettings.from_config()
        start_timeout = settings.start_timeout
        conn = StoreConnection(host, port, secret, timeout=start_timeout)
        try:
            rank = settings.rank
            if rank is None:  # MXNet-style launch: ranks in order of arrival, once per process
                if not _assigned_rank:
                    _assigned_rank.append(conn.add(WORKER_COUNTER, 1) - 1)
                rank = _assigned_rank[0]
            self._rank = int(rank)
            self._num_workers = settings.num_workers
            self._local_rank = settings.local_rank
            self._ns = conn.add(STORE_COUNTER.format(rank=self._rank), 1)
            keys = [SERVER_KEY.format(index=i) for i in range(num_servers)]
            try:
                conn.wait(keys, timeout=start_timeout)
            except RendezvousError as exc:
                raise RendezvousError(with_hint(
                    f"worker {self._rank}: not every one of the {num_servers} parameter servers "
                    f"registered with the store at {host}:{port} within {start_timeout:.0f}s",
                    "check the server processes' output (did they start? same secret?), or "
                    "that ACCORD_NUM_SERVERS/DMLC_NUM_SERVER matches the servers launched")) from exc
            endpoints = [v.decode() for v in conn.multi_get(keys)]
        finally:
            conn.close()
        if settings.verbose:
            _log_to_stderr()
        self._conns = ServerConnections(endpoints, secret, self._rank, self._num_workers,
                                        settings.reply_timeout, settings.verbose, settings.payload_mac)
        self._space = {"ns": self._ns, "sync": self._sync}  # names this store on the servers
        self._bound = settings.bigarray_bound
        self._chunk = settings.chunk_elements
        self._parts: dict[Key, list[Part]] = {}
        self._unacked: dict[Key, list[int]] = {}
        self._barriers = 0
        self._optimizer: opt.Optimizer | None = None
        self._compression: TwoBitCompression | None = None
        self._closed = False
        if location.scheduler_store:
            _stop_servers_at_exit(endpoints, secret, self._rank, self._num_workers, self._conns.timeout,
                                  settings.payload_mac)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def num_servers(self) -> int:
        """Number of parameter servers."""
        return len(self._conns.endpoints)

    # --- plumbing ----------------------------------------------------------------------------

    def _fields(self, key: Key, part: Part, **more: Any) -> dict[str, Any]:
        return {**self._space, "key": f"{wire_key(key)}#{part.index}", **more}

    def _settle(self, keys: Sequence[Key] | None = None) -> list[int]:
        """Take the unacknowledged pushes of ``keys`` (all keys when None)."""
        keys = list(self._unacked) if keys is None else keys
        return [seq for k in keys for seq in self._unacked.pop(k, [])]

    def _everyone(self, op: str, fields: dict[str, Any], payloads: Sequence[Any] = ()) -> None:
        """Send one request to every server and wait for all answers."""
        seqs = [self._conns.request(i, op, {**self._space, **fields}, payloads)[0]
                for i in range(self.num_servers)]
        self._conns.wait(seqs, op)

    # --- KVStoreBase -------------------------------------------------------------------------

    def _init(self, items: Sequence[tuple[Key, Any, KeyInfo]]) -> None:
        for k, _, info in items:
            self._parts[k] = partition(k, info.numel, self.num_servers, self._bound, self._chunk)
        if self._rank == 0:
            seqs, tracked = [], []
            for k, value, info in items:
                flat, private = _flat_numpy(value, info)
                for part in self._parts[k]:
                    seq, tracker = self._conns.request(
                        part.server, "init",
                        self._fields(k, part, dtype=flat.dtype.str, n=part.size,
                                     param_only=info.param_only),
                        [flat[part.start:part.stop]], track=not private)
                    seqs.append(seq)
                    tracked.append((part.server, tracker))
            self._conns.wait_sent(tracked)
            self._conns.wait(seqs, "init")
        self.barrier()

    def _push(self, groups: Sequence[tuple[Key, list[Any]]], op: str) -> None:
        if not self._sync:
            if op != "sum":
                raise ValueError(with_hint(
                    f"push op={op!r} needs 'dist_sync': 'dist_async' applies every push on its own",
                    "use op='sum' with dist_async, or a dist_sync store for max/min statistics"))
            if self._optimizer is None and not all(self._keys[k].param_only for k, _ in groups):
                raise ValueError(with_hint(
                    "dist_async applies each push with the servers' optimizer, and none is set",
                    "call kv.set_optimizer(accord.kvstore.optimizers.create('sgd', ...)) on every "
                    "worker before pushing"))
        tracked = []
        for k, values in groups:
            info = self._keys[k]
            device = info.device if self._on_device else torch.device("cpu")
            merged = reduce(values, op, device, info.dtype, mean=info.param_only, private=False)
            flat, private = _flat_numpy(merged, info)
            if len(values) > 1 or merged.device.type != "cpu":
                private = True
            comp = self._compression
            compress = comp is not None and op == "sum" and not info.param_only and \
                info.dtype.is_floating_point
            seqs = self._unacked.setdefault(k, [])
            for part in self._parts[k]:
                piece = flat[part.start:part.stop]
                if compress:
                    packed = comp.compress((k, part.index), torch.from_numpy(piece)).numpy()
                    fields = self._fields(k, part, rop=op, comp=[comp.threshold, part.size])
                    seq, _ = self._conns.request(part.server, "push", fields, [packed])
                else:
                    fields = self._fields(k, part, rop=op, dtype=piece.dtype.str)
                    seq, tracker = self._conns.request(part.server, "push", fields, [piece],
                                                       track=not private)
                    tracked.append((part.server, tracker))
                seqs.append(seq)
        self._conns.wait_sent(tracked)
        self._conns.flush("sending a push")  # the servers get every push now, not at the next call

    def _pull(self, groups: Sequence[tuple[Key, list[Any]]]) -> None:
        outs: dict[Key, list[Any]] = {}
        for k, values in groups:
            outs.setdefault(k, []).extend(values)
        acks = self._settle(list(outs))
        sinks = {k: _PullSink(self._keys[k].numel, targets) for k, targets in outs.items()}
        pulls = [self._conns.request(p.server, "pull", self._fields(k, p),
                                     on_answer=functools.partial(sinks[k].piece, p))[0]
                 for k in outs for p in self._parts[k]]
        self._conns.wait(acks + pulls, "pull")
        for k, sink in sinks.items():
            if sink.bad or sink.held != self._keys[k].numel:
                raise ValueError(with_hint(
                    f"pull of key {k!r}: the servers hold {sink.held} elements, this worker "
                    f"initialised it with shape {self._keys[k].shape}",
                    "every worker must init the key with the same shape"))
            sink.finish()

    # --- synchronisation, optimizer, compression ---------------------------------------------

    def barrier(self) -> None:
        """Wait until every worker reaches its matching barrier (after this worker's pushes
        have been acknowledged)."""
        self._conns.wait(self._settle(), "waiting for pushes to be acknowledged")
        self._barriers += 1
        seq, _ = self._conns.request(0, "barrier", {**self._space, "gen": self._barriers})
        self._conns.wait([seq], f"barrier {self._barriers}")

    _barrier = barrier

    def set_optimizer(self, optimizer: Any) -> None:
        """Ship ``optimizer``'s configuration to the servers (from rank 0); every worker calls it."""
        optimizer = as_optimizer(optimizer)
        if self._rank == 0:
            self._everyone("set_optimizer", {"optimizer": optimizer.config()})
        self.barrier()
        self._optimizer = optimizer

    def set_updater(self, updater: Any) -> None:
        """Not available with parameter servers: a Python function cannot be shipped to them."""
        raise ValueError(with_hint(
            f"set_updater is not supported by a {self.type!r} store with parameter servers: "
            "updates run on the servers, which only accept a registered optimizer",
            "use kv.set_optimizer(accord.kvstore.optimizers.create(name, ...)) with an optimizer "
            "the servers know (accord.kvstore.optimizers.known_optimizers())"))

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """2-bit compression of worker-to-server pushes: ``{'type': '2bit', 'threshold': t}``."""
        self._compression = create_compression(compression_params)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Gather every server's optimizer state for this store's keys into ``fname``."""
        if self._optimizer is None:
            raise ValueError(with_hint("cannot save optimizer states: no optimizer is set",
                                       "call kv.set_optimizer(...) first"))
        self._conns.wait(self._settle(), "save_optimizer_states")
        pieces: dict[str, tuple[int, list[np.ndarray]]] = {}
        starts = {i: 0 for i in range(self.num_servers)}  # a page at a time from each server
        while starts:
            seqs = [self._conns.request(i, "get_states", {**self._space, "start": at})[0]
                    for i, at in starts.items()]
            answers = self._conns.wait(seqs, "save_optimizer_states")
            following = {}
            for server, (header, payloads) in zip(starts, answers):
                i = 0
                for item in header["entries"]:
                    states = [np.frombuffer(payloads[i + j], dtype=np.dtype(d)).copy()
                              for j, d in enumerate(item["dtypes"])]
                    i += len(item["dtypes"])
                    pieces[item["key"]] = (int(item["count"]), states)
                if header.get("next") is not None:
                    following[server] = int(header["next"])
            starts = following
        entries = []
        for k, parts in self._parts.items():
            found = [pieces.get(f"{wire_key(k)}#{p.index}") for p in parts]
            if any(f is None for f in found):
                continue  # never updated by the optimizer
            info = self._keys[k]
            states = [np.concatenate([f[1][j] for f in found]).reshape(info.shape)
                      for j in range(len(found[0][1]))]
            entries.append((k, found[0][0], states))
        opt.save_states(fname, entries, self._optimizer if dump_optimizer else None)

    def load_optimizer_states(self, fname: str) -> None:
        """Load a states file onto the servers (every worker calls it; rank 0 sends)."""
        entries, optimizer = opt.load_states(fname)
        if optimizer is not None:
            self.set_optimizer(optimizer)
        elif self._optimizer is None:
            raise ValueError(with_hint("cannot load optimizer states: no optimizer is set",
                                       "call kv.set_optimizer(...) first, or save with dump_optimizer=True"))
        if self._rank == 0:
            per_server: list[tuple[list[dict], list[np.ndarray]]] = [([], []) for _ in range(self.num_servers)]
            for k, count, states in entries:
                for p in self._parts.get(k, []):
                    items, arrays = per_server[p.server]
                    pieces = [np.ascontiguousarray(s.reshape(-1)[p.start:p.stop]) for s in states]
                    items.append({"key": f"{wire_key(k)}#{p.index}", "count": count,
                                  "dtypes": [s.dtype.str for s in pieces]})
                    arrays.extend(pieces)
            seqs = [self._conns.request(i, "set_states", {**self._space, "entries": items}, arrays)[0]
                    for i, (all_items, all_arrays) in enumerate(per_server)
                    for items, arrays in _pages(all_items, all_arrays)]
            self._conns.wait(seqs, "load_optimizer_states")
        self.barrier()

    def close(self) -> None:
        """Wait for this worker's unacknowledged pushes, then close the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conns.wait(self._settle(), "close")
        finally:
            self._conns.close()
