"""The KVStore interface: argument handling and checks shared by every store type.

Semantics (MXNet 1.9.1's, made explicit):

- Keys are ints or strs; one call takes a single key or a list of keys (of one type, not mixed).
  A value is a torch tensor or numpy array, or a list of them for one key (one per local device).
- ``init``: each key once (a second init is an error naming the key); in distributed stores only
  rank 0's value is used, then every worker waits. Using a key before its init is an error.
- ``push``: a list of values (and repeated keys within one call) is merged first (sum, or
  max/min with ``op``). Without an optimizer the stored value *becomes* the merged push
  (assign, not accumulate); with one it becomes ``optimizer(key, merged, stored)``.
  ``op='max'|'min'`` pushes and ``param_only`` keys never go through the optimizer: a
  ``param_only`` key stores the mean of the pushed values (Perseus).
- ``pull`` returns values that include this worker's earlier pushes of the key; pulling into a
  list writes every element. Without ``out`` it returns a new value of the kind given to init.
- ``priority`` is accepted and ignored (operations run in call order).

Subclasses implement ``_init``, ``_push``, ``_pull`` and the optimizer methods.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np
import torch

from accord.errors import with_hint
from accord.kvstore.values import KeyInfo, check_op, check_value, info_of, is_value, numpy_dtype, write

__all__ = ["KVStoreBase"]

Key = Any  # int | str


def _norm_key(key: Any) -> int | str:
    if isinstance(key, str):
        try:
            key.encode("utf-8")  # servers place str keys by their UTF-8 bytes; MXNet takes C strings
        except UnicodeEncodeError as exc:
            raise ValueError(with_hint(
                f"kvstore key {key!r} is not valid Unicode text: {exc.reason} at position "
                f"{exc.start} ({key[exc.start:exc.end]!r})",
                "use keys that encode as UTF-8: a lone surrogate such as '\\ud800' usually comes "
                "from bytes decoded with errors='surrogateescape'; decode them with "
                "errors='replace' or use int keys")) from None
        return key
    if isinstance(key, numbers.Integral) and not isinstance(key, bool):
        return int(key)
    raise TypeError(with_hint(f"kvstore keys are ints or strs, got {key!r} ({type(key).__name__})",
                              "use int keys (0, 1, ...) or str keys ('weight', ...)"))


def _as_list(value: Any, key: Key, what: str) -> list[Any]:
    if is_value(value):
        return [value]
    if isinstance(value, (list, tuple)) and value:
        for v in value:
            check_value(v, key, what)
        return list(value)
    if isinstance(value, (list, tuple)):
        raise ValueError(with_hint(f"{what} for key {key!r} got an empty list of values",
                                   "pass at least one tensor or array"))
    check_value(value, key, what)
    return [value]


def _pairs(key: Any, value: Any, what: str) -> list[tuple[int | str, list[Any]]]:
    """``[(key, [values])]`` for a single key or a list of keys."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            got = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(with_hint(
                f"{what} got {len(key)} keys but {got} values",
                "pass one value (or one list of per-device values) per key"))
        keys = [_norm_key(k) for k in key]
        if len({type(k) for k in keys}) > 1:
            raise TypeError(with_hint(f"{what}: inconsistent types of keys detected: {list(key)}",
                                      "use only int keys or only str keys in one call"))
        return [(k, _as_list(v, k, what)) for k, v in zip(keys, value)]
    k = _norm_key(key)
    return [(k, _as_list(value, k, what))]


class KVStoreBase:
    """A key-value store for data-parallel training (MXNet's KVStore API).

    Made by :func:`accord.kvstore.create`, not directly.

    Args:
        name: the store type, as :attr:`type` reports it (``'local'``, ``'device'``,
            ``'dist_sync'``, ...).
    """

    OPTIMIZER = "optimizer"

    def __init__(self, name: str) -> None:
        self._type = name
        self._keys: dict[Key, KeyInfo] = {}

    # --- properties --------------------------------------------------------------------------

    @property
    def type(self) -> str:
        """The store type, e.g. ``'local'`` or ``'dist_sync'``."""
        return self._type

    @property
    def rank(self) -> int:
        """This worker's rank in ``[0, num_workers)``."""
        return 0

    @property
    def num_workers(self) -> int:
        """Number of workers."""
        return 1

    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers on its host (Perseus)."""
        return 0

    def is_capable(self, capability: str) -> bool:
        """Whether the store supports ``capability`` (only ``'optimizer'`` is known).

        Args:
            capability: a capability name, case-insensitive (``KVStoreBase.OPTIMIZER``).

        Returns:
            True for ``'optimizer'``: every store type can run an optimizer on pushes.

        Raises:
            ValueError: an unknown capability.
        """
        if str(capability).lower() == self.OPTIMIZER:
            return True
        raise ValueError(with_hint(f"unknown capability {capability!r}",
                                   f"ask is_capable({self.OPTIMIZER!r})"))

    # --- the API -----------------------------------------------------------------------------

    def init(self, key: Any, value: Any, param_only: bool = False) -> None:
        """Initialise one key or a list of keys (once each; rank 0's value wins).

        ``param_only=True`` (Perseus): the key holds a parameter that pushes average across
        devices and workers, never updated by the optimizer.

        Args:
            key: an int or str key, or a list of them.
            value: a torch tensor or numpy array per key (a list, for a list of keys); its shape
                and dtype are the key's from now on.
            param_only: Perseus's flag, see above.

        Raises:
            ValueError: a key initialised twice, or several values for one key.
        """
        pairs = _pairs(key, value, "init")
        seen: set[Key] = set()
        for k, values in pairs:
            if k in self._keys or k in seen:
                raise ValueError(with_hint(f"duplicate init of key {k!r}",
                                           "initialise each key once; use push to change its value"))
            if len(values) != 1:
                raise ValueError(with_hint(
                    f"init of key {k!r} got {len(values)} values; init takes one value per key",
                    "pass a single tensor (per-device lists are for push and pull)"))
            seen.add(k)
        infos = [(k, values[0], info_of(values[0], bool(param_only))) for k, values in pairs]
        self._init([(k, v, info) for k, v, info in infos])
        for k, _, info in infos:
            self._keys[k] = info

    def push(self, key: Any, value: Any, priority: int = 0, op: str = "sum") -> None:
        """Push one key's value(s) or a list of keys' values; see the module docstring.

        Values pushed for one key (a list: one per local device) are summed, then merged over
        the workers (``dist_sync``: once every worker has pushed the key) and handed to the
        optimizer, or stored as they are when there is none.

        Args:
            key: an initialised key, or a list of them.
            value: a value of the key's shape, a list of them (one per device), or one of those
                per key.
            priority: accepted for MXNet compatibility; the order of pushes is kept.
            op: ``"sum"`` (MXNet's), or Perseus's ``"max"`` and ``"min"``.

        Raises:
            ValueError: an uninitialised key, a value whose shape differs from the key's, or an
                unknown ``op``.
        """
        op = check_op(op)
        grouped: dict[Key, list[Any]] = {}
        for k, values in _pairs(key, value, "push"):
            info = self._info(k, "push")
            for v in values:
                self._check_shape(k, info, v, "push")
            grouped.setdefault(k, []).extend(values)
        self._push(list(grouped.items()), op)

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> Any:
        """Pull into ``out`` (a value, a per-device list, or one of those per key).

        Args:
            key: an initialised key, or a list of them.
            out: where the values go (each of the key's shape); None: new values are made.
            priority: accepted for MXNet compatibility.
            ignore_sparse: accepted for MXNet compatibility (values here are dense).

        Returns:
            ``out``, or new values (the kind given to init) when ``out`` is None.

        Raises:
            ValueError: an uninitialised key, or an ``out`` whose shape differs from the key's.
        """
        if out is None:
            keys = key if isinstance(key, (list, tuple)) else [key]
            fresh = [self._new_value(self._info(_norm_key(k), "pull")) for k in keys]
            self.pull(key, fresh if isinstance(key, (list, tuple)) else fresh[0])
            return fresh if isinstance(key, (list, tuple)) else fresh[0]
        groups = []
        for k, outs in _pairs(key, out, "pull"):
            info = self._info(k, "pull")
            for o in outs:
                self._check_shape(k, info, o, "pull")
            groups.append((k, outs))
        self._pull(groups)
        return out

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """Push, then pull into ``out`` (into ``value`` itself when ``out`` is None).

        Args:
            key: an initialised key, or a list of them (as for :meth:`push`).
            value: what to push (as for :meth:`push`).
            out: where to pull; None: into ``value``.
            priority: accepted for MXNet compatibility.

        Returns:
            What :meth:`pull` returns.
        """
        self.push(key, value, priority)
        return self.pull(key, value if out is None else out, priority)

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> Any:
        """Initialise ``key`` with rank 0's ``value`` and pull it into ``out`` on every worker.

        Args:
            key: a new key, or a list of them.
            value: the value to store (rank 0's wins).
            out: where every worker receives it.
            priority: accepted for MXNet compatibility.

        Returns:
            ``out``.
        """
        self.init(key, value)
        return self.pull(key, out, priority)

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0,
                        row_ids: Any = None) -> Any:
        """Pull only the rows ``row_ids`` (dense equivalent of MXNet's row_sparse pull).

        ``out`` receives the stored rows listed in ``row_ids`` (any order, repeats allowed) and
        zeros elsewhere.

        Args:
            key: one key or a list of keys, initialised before.
            out: the output(s), shaped like the stored value(s), as for :meth:`pull`.
            priority: accepted for MXNet's signature; unused.
            row_ids: one index array (numpy, torch or a list) for every output, or one per output.

        Returns:
            ``out``, written.

        Raises:
            ValueError: ``out`` or ``row_ids`` is missing, or the counts of ``row_ids`` and
                outputs do not match.
        """
        if out is None or row_ids is None:
            raise ValueError(with_hint("row_sparse_pull needs both out and row_ids",
                                       "pass out=<array like the value> and row_ids=<indices>"))
        pairs = _pairs(key, out, "row_sparse_pull")
        flat_outs = [o for _, outs in pairs for o in outs]
        ids = row_ids if isinstance(row_ids, (list, tuple)) and row_ids and not \
            isinstance(row_ids[0], numbers.Integral) else [row_ids]
        if len(ids) == 1:
            ids = ids * len(flat_outs)
        if len(ids) != len(flat_outs):
            raise ValueError(with_hint(
                f"row_sparse_pull got {len(ids)} row_ids for {len(flat_outs)} outputs",
                "pass one row_ids array, or one per output"))
        full = self.pull([k for k, _ in pairs], [[self._new_value(self._info(k, "pull"))]
                                                  for k, _ in pairs])
        values = [f[0] for f, (_, outs) in zip(full, pairs) for _ in outs]
        for o, v, rows in zip(flat_outs, values, ids):
            rows_t = torch.as_tensor(np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows),
                                     dtype=torch.long)
            src = torch.as_tensor(v) if isinstance(v, np.ndarray) else v
            dense = torch.zeros_like(src)
            dense[rows_t] = src[rows_t]
            write(o, dense)
        return out

    def barrier(self) -> None:
        """Wait until every worker reaches this call (a no-op for one worker)."""

    _barrier = barrier  # MXNet's name

    def set_optimizer(self, optimizer: Any) -> None:
        """Apply ``optimizer`` on every later push: the store then holds weights, and a push
        of gradients updates them.

        Args:
            optimizer: from ``accord.kvstore.optimizers.create(...)`` (or an MXNet optimizer,
                for the MXNet plug-in).

        Raises:
            NotImplementedError: in this base class; each store type implements it.
        """
        raise NotImplementedError

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """Enable MXNet's 2-bit gradient compression for later pushes.

        Args:
            compression_params: ``{'type': '2bit', 'threshold': t}`` with ``t > 0``.

        Raises:
            ValueError: the store type has no compression (``'local'``, as in MXNet), or the
                parameters are not valid.
        """
        raise ValueError(with_hint(
            f"gradient compression is not supported for kvstore type {self.type!r}",
            "use a 'device' or 'dist_*' store (MXNet raises for 'local' too)"))

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer's per-key state to a file.

        Args:
            fname: the file to write.
            dump_optimizer: also write the optimizer's configuration, so that loading restores it.

        Raises:
            NotImplementedError: the base class has no optimizer to save.
        """
        raise NotImplementedError

    def load_optimizer_states(self, fname: str) -> None:
        """Load states written by :meth:`save_optimizer_states`.

        Args:
            fname: the file :meth:`save_optimizer_states` wrote.

        Raises:
            NotImplementedError: unless a store type overrides it.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the store's resources (idempotent)."""

    def __enter__(self) -> "KVStoreBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- for subclasses ----------------------------------------------------------------------

    def _info(self, key: Key, what: str) -> KeyInfo:
        info = self._keys.get(key)
        if info is None:
            known = sorted(map(repr, self._keys))[:10]
            raise ValueError(with_hint(
                f"{what} of key {key!r}, which has not been initialised (initialised: "
                f"{', '.join(known) or 'none'}{' ...' if len(self._keys) > 10 else ''})",
                f"call kv.init({key!r}, value) on every worker first"))
        return info

    @staticmethod
    def _check_shape(key: Key, info: KeyInfo, value: Any, what: str) -> None:
        if tuple(value.shape) != info.shape:
            raise ValueError(with_hint(
                f"{what} of key {key!r} with shape {tuple(value.shape)}, but the key was "
                f"initialised with shape {info.shape}",
                "push and pull values shaped like the value given to init"))

    @staticmethod
    def _new_value(info: KeyInfo) -> Any:
        if info.kind == "numpy":
            return np.empty(info.shape, dtype=numpy_dtype(info.dtype))
        return torch.empty(info.shape, dtype=info.dtype, device=info.device)

    def _init(self, items: Sequence[tuple[Key, Any, KeyInfo]]) -> None:
        raise NotImplementedError

    def _push(self, groups: Sequence[tuple[Key, list[Any]]], op: str) -> None:
        raise NotImplementedError

    def _pull(self, groups: Sequence[tuple[Key, list[Any]]]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(type={self.type!r}, rank={self.rank}, "
                f"num_workers={self.num_workers}, keys={len(self._keys)})")
