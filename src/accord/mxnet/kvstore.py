"""accord's KVStore as an MXNet KVStore plug-in: ``kvstore='accord'`` (and Perseus's
``'dist_sync_perseus'``) for ``gluon.Trainer``, ``Module.fit`` and ``mx.kv.create``.

Importing :mod:`accord.mxnet` registers the types through MXNet's ``KVStoreBase`` registry.
A store holds NDArray keys the way MXNet's ``dist_sync`` does: ``init`` keeps rank 0's value,
``push`` sums the pushed values over devices and workers (or takes their max / min with
Perseus's ``op=``) and either stores the sum or, with an optimizer, applies it; ``pull`` copies
the stored value out; ``pushpull`` and ``broadcast`` are the coalesced forms gluon uses.
row_sparse NDArrays are taken in their dense form, and ``row_sparse_pull`` fills dense or
row_sparse outputs (Gluon's Trainer itself refuses every plug-in store for sparse gradients);
an optimizer on the store gets a row_sparse push's sum as a row_sparse NDArray holding every
row some worker pushed, so its lazy update touches the rows MXNet's own stores would.
The values move through :mod:`accord.kvstore` (the engine, or accord's parameter servers when
``accordrun --num-servers`` started them) as torch views of the NDArrays (DLPack, no copies).
An MXNet optimizer (``set_optimizer``, what ``gluon.Trainer`` and ``Module`` do for
``update_on_kvstore``) runs on every worker on the same summed gradient, so the replicas stay
identical. Every call returns with its results written.

MXNet creates no KVStore at all for a string type on one device unless the type contains
``dist``; so that ``kvstore='accord'`` still reduces across workers, importing this module makes
MXNet's ``_create_kvstore`` build accord's types from their names.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable

from accord.errors import with_hint
from accord.mxnet.bridge import (
    DenseStandIns,
    dense,
    is_ndarray,
    mx,
    read_view,
    row_mask,
    rows_of,
    to_ndarray,
    write_view,
)

# type names -> what ``kv.type`` reports (MXNet's trainer and Module treat 'dist' + '_sync'
# stores as synchronous multi-worker stores: batch sizes count every worker's samples).
# 'dist_sync_accord' (what kv.type reports) is a name of its own too: scripts that pass the store's
# name on (``--kv-store``) and test ``'dist' in name`` (MXNet's and Horovod's fit.py resize the
# ranks' data iterators then) take it for the distributed store it is.
TYPES = {"accord": "dist_sync_accord", "dist_sync_accord": "dist_sync_accord",
         "dist_sync_perseus": "dist_sync_perseus"}


def _dense(value: Any) -> Any:
    """``value`` with sparse NDArrays made dense: the store holds dense values, as MXNet's own
    stores sum a sparse push into the dense stored array."""
    return [_dense(v) for v in value] if isinstance(value, (list, tuple)) else dense(value)


def _write_into(out: Any, fill: Callable[[Any], None], sparse_too: bool = True) -> None:
    """Run ``fill`` on torch views of ``out``; a sparse NDArray in ``out`` is filled through a
    dense stand-in and then given its nonzero rows (left alone when ``sparse_too`` is False)."""
    stand_ins = DenseStandIns()

    def writable(value: Any) -> Any:
        return [writable(v) for v in value] if isinstance(value, (list, tuple)) else stand_ins.dense(value)

    fill(_views(writable(out), write_view))
    if sparse_too:
        stand_ins.write_back()


def _views(value: Any, view: Callable[[Any], Any]) -> Any:
    """The torch views of an NDArray, a list of them, or a list of such lists."""
    if isinstance(value, (list, tuple)):
        return [_views(v, view) for v in value]
    if not is_ndarray(value):
        raise TypeError(with_hint(f"accord's MXNet KVStore takes NDArrays, got {type(value).__name__}",
                                  "pass mx.nd arrays (accord.kvstore takes torch tensors)"))
    return view(value)


class AccordKVStore(mx.kvstore.KVStoreBase):
    """MXNet KVStore on accord (see the module docstring)."""

    type_name = "accord"

    def __init__(self) -> None:
        import accord.kvstore

        self._kv = accord.kvstore.create("dist_sync")
        self._mx_updater: Any = None
        self._weights: dict[Any, tuple[int, Any]] = {}  # key -> (data_ptr, NDArray view) of stored
        self._merged_rows: dict[Any, Any] = {}  # key -> rows of the row_sparse push in progress
        self._row_keys: set[str] = set()  # the hidden keys that sum the pushes' row masks

    # --- properties ---------------------------------------------------------------------------
    @property
    def type(self) -> str:
        """The type MXNet knows the store by (``'accord'`` or one of Perseus's names)."""
        return TYPES[self.type_name]

    @property
    def rank(self) -> int:
        """This worker's rank, in ``[0, num_workers)``."""
        return int(self._kv.rank)

    @property
    def num_workers(self) -> int:
        """Number of workers in the job."""
        return int(self._kv.num_workers)

    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers on its host (Perseus)."""
        return int(self._kv.local_rank)

    def is_capable(self, capability: str) -> bool:
        """Whether the store can do ``capability`` (MXNet asks for ``'optimizer'``).

        Args:
            capability: the capability's name, e.g. ``mx.kvstore.KVStoreBase.OPTIMIZER``.

        Returns:
            True for ``'optimizer'``: updates can run in the store.

        Raises:
            ValueError: a capability accord does not know.
        """
        return bool(self._kv.is_capable(capability))

    # --- classic and Perseus API --------------------------------------------------------------
    def init(self, key: Any, value: Any, param_only: bool = False) -> None:
        """Initialise keys with rank 0's values; ``param_only`` keys average their pushes and
        never go through the optimizer (Perseus).

        Args:
            key: an int or str key, or a list of them.
            value: an NDArray per key (sparse ones are stored dense).
            param_only: Perseus's flag: the keys hold parameters that pushes average.
        """
        self._kv.init(key, _views(_dense(value), read_view), param_only=param_only)

    def push(self, key: Any, value: Any, priority: int = 0, op: str = "sum") -> None:
        """Sum (or ``op='max'|'min'``) the values over devices and workers into the store
        (row_sparse values count as their dense form). With an MXNet optimizer, a row_sparse
        push reaches it as MXNet's stores give it: a row_sparse sum holding every row that some
        worker's push held, so a lazy update touches exactly those rows.

        Args:
            key: one key or a list of keys, initialised before.
            value: per key, an NDArray or a list of them (one per device), summed first.
            priority: accepted for MXNet's signature; pushes run in call order.
            op: ``'sum'`` (the default: the optimizer, if any, runs), ``'max'`` or ``'min'``.
        """
        if self._mx_updater is not None and op == "sum":
            self._merged_rows.update(self._union_of_rows(key, value))
        try:
            self._kv.push(key, _views(_dense(value), read_view), priority, op=op)
        finally:
            self._merged_rows.clear()

    def _union_of_rows(self, key: Any, value: Any) -> dict[Any, Any]:
        """For each key pushed with row_sparse values: the rows any worker's push holds (a row
        mask summed over the workers through a hidden parameter key)."""
        keys, values = (key, value) if isinstance(key, (list, tuple)) else ([key], [value])
        found = {}
        for k, v in zip(keys, values):
            masks = [row_mask(part) for part in (v if isinstance(v, (list, tuple)) else [v])
                     if getattr(part, "stype", "default") == "row_sparse"]
            if not masks:
                continue
            hidden = f"\0rows:{k!r}"  # a str key no user key equals (repr keeps 3 and '3' apart)
            if hidden not in self._row_keys:
                self._kv.init(hidden, read_view(mx.nd.zeros(masks[0].shape, dtype="float32")), param_only=True)
                self._row_keys.add(hidden)
            self._kv.push(hidden, [read_view(m) for m in masks])
            union = self._kv.pull(hidden)  # the mean of the masks: nonzero where any push had the row
            found[k if isinstance(k, str) else int(k)] = union.nonzero().flatten().numpy()
        return found

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> Any:
        """Copy the stored values into ``out`` (new NDArrays when ``out`` is None); row_sparse
        NDArrays in ``out`` are left as they are unless ``ignore_sparse`` is False (MXNet).

        Args:
            key: one key or a list of keys.
            out: per key, an NDArray or a list of them to write into, or None.
            priority: MXNet's argument, not used.
            ignore_sparse: skip row_sparse outputs (MXNet's default).

        Returns:
            ``out``, written; when it was None, a new NDArray (a list of them for a list of keys).
        """
        if out is None:
            fresh = self._kv.pull(key)
            return [to_ndarray(v) for v in fresh] if isinstance(fresh, list) else to_ndarray(fresh)
        _write_into(out, lambda views: self._kv.pull(key, views, priority), not ignore_sparse)
        return out

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> Any:
        """Pull only the rows ``row_ids`` (zeros elsewhere) into ``out``, dense or row_sparse.

        Args:
            key: one key or a list of keys.
            out: the NDArray(s) to write into (required: None is refused).
            priority: ignored.
            row_ids: an NDArray of row indices, or one per output.

        Returns:
            ``out``.

        Raises:
            ValueError: ``out`` or ``row_ids`` is missing, or they do not pair up.
        """
        ids = _views(_dense(row_ids), read_view) if row_ids is not None else None
        if out is None:
            self._kv.row_sparse_pull(key, None, priority, row_ids=ids)
            return out
        _write_into(out, lambda views: self._kv.row_sparse_pull(key, views, priority, row_ids=ids))
        return out

    def barrier(self) -> None:
        """Wait for every worker."""
        self._kv.barrier()

    _barrier = barrier

    # --- MXNet's KVStoreBase ------------------------------------------------------------------
    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        """Initialise ``key`` with rank 0's ``value`` and write it into ``out`` everywhere.

        Args:
            key: a key or a list of keys, not initialised yet.
            value: the initial value(s); rank 0's win.
            out: the NDArray(s) that receive rank 0's value on every worker.
            priority: unused (MXNet's).
        """
        self.init(key, value)
        self.pull(key, out, priority)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """Push ``value``, then pull into ``out`` (into ``value`` when ``out`` is None).

        Args:
            key: a key or a list of keys.
            value: what to push (summed over devices and workers).
            out: where the result goes; None: back into ``value``.
            priority: kept for MXNet's signature.
        """
        self.push(key, value, priority)
        self.pull(key, value if out is None else out, priority)

    def set_optimizer(self, optimizer: Any) -> None:
        """Apply an optimizer to every later sum push.

        Args:
            optimizer: an ``mx.optimizer.Optimizer`` (run on every worker, on the same summed
                gradient) or one from ``accord.kvstore.optimizers`` (run where the values are
                stored, on the servers too).

        Raises:
            ValueError: an MXNet optimizer in a job with parameter servers (they run accord's
                optimizers only).
        """
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            self._kv.set_optimizer(optimizer)
            self._mx_updater = None
            return
        self._run_on_workers(mx.optimizer.get_updater(optimizer), "an MXNet optimizer")

    def _set_updater(self, updater: Callable[[Any, Any, Any], None]) -> None:
        """MXNet's ``kv._set_updater(fn)`` (its KVStore tutorial's form): every later sum push
        calls ``fn(key, merged, stored)`` with NDArrays, and ``fn`` updates ``stored`` in place.
        It runs on every worker on the same merged value, so the stores stay identical."""
        if not callable(updater):
            raise TypeError(with_hint(f"_set_updater takes a callable, got {updater!r}",
                                      "pass fn(key, merged, stored) that updates stored in place"))
        self._run_on_workers(updater, "a Python updater")

    def _run_on_workers(self, updater: Callable[[Any, Any, Any], None], what: str) -> None:
        if not hasattr(self._kv, "set_updater"):
            raise ValueError(with_hint(
                f"{what} cannot run on accord's parameter servers (they run accord's own "
                "optimizers)",
                "use update_on_kvstore=False (gluon.Trainer), or start the job without "
                "--num-servers so the update runs on every worker"))
        self._mx_updater = updater
        self._kv.set_updater(self._update)

    def _update(self, key: Any, merged: Any, stored: Any) -> None:
        """Run the MXNet updater on torch tensors (stored is updated in place, synchronously)."""
        cached = self._weights.get(key)
        if cached is None or cached[0] != stored.data_ptr():
            cached = self._weights[key] = (stored.data_ptr(), to_ndarray(stored))
        weight = cached[1]
        gradient = to_ndarray(merged)
        rows = self._merged_rows.get(key)
        if rows is not None:  # a row_sparse push: the optimizer gets a row_sparse sum, as in MXNet
            gradient = rows_of(gradient, rows)
        self._mx_updater(key, gradient, weight)
        weight.wait_to_read()  # the store reads ``stored`` right after: MXNet must be done

    @property
    def _updater(self) -> Any:
        """The MXNet updater (gluon.Trainer.load_states reads ``kvstore._updater.optimizer``)."""
        return self._mx_updater

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer state (MXNet's updater format for MXNet optimizers).

        Args:
            fname: the file to write.
            dump_optimizer: also write the optimizer itself, so that loading restores it.

        Raises:
            ValueError: the store runs a Python updater (``_set_updater``), which has no state.
        """
        if self._mx_updater is None:
            self._kv.save_optimizer_states(fname, dump_optimizer)
            return
        states = self._optimizer_updater("save").get_states(dump_optimizer)
        with open(fname, "wb") as f:
            f.write(states)

    def load_optimizer_states(self, fname: str) -> None:
        """Load a state written by :meth:`save_optimizer_states`.

        Args:
            fname: the file :meth:`save_optimizer_states` wrote.

        Raises:
            ValueError: the store runs a stateless Python updater.
        """
        if self._mx_updater is None:
            self._kv.load_optimizer_states(fname)
            return
        updater = self._optimizer_updater("load")
        with open(fname, "rb") as f:
            updater.set_states(f.read())

    def _optimizer_updater(self, what: str) -> Any:
        """The MXNet updater, refusing a plain function from :meth:`_set_updater` (no state)."""
        if not hasattr(self._mx_updater, "get_states"):
            raise ValueError(with_hint(
                f"cannot {what} optimizer states: this store runs a Python updater "
                f"({self._mx_updater!r}), which keeps no state",
                "use kv.set_optimizer(mx.optimizer.create(...)) for a store whose state can be saved"))
        return self._mx_updater

    def set_gradient_compression(self, compression_params: dict) -> None:
        """Compress later pushes with MXNet's 2-bit scheme.

        Args:
            compression_params: ``{'type': '2bit', 'threshold': t}``, ``t > 0``.

        Raises:
            ValueError: parameters accord's store does not accept.
        """
        self._kv.set_gradient_compression(compression_params)

    def __getstate__(self) -> Any:
        raise pickle.PicklingError("an accord KVStore holds a live connection; it cannot be pickled")


def _register() -> None:
    """Register every accord type in MXNet's registry (a subclass per name: MXNet constructs
    registered classes without arguments)."""
    for name in TYPES:
        cls = type(name, (AccordKVStore,), {"type_name": name, "__module__": __name__})
        mx.kvstore.KVStoreBase.kv_registry[name] = cls
    _route_create_kvstore()


def _route_create_kvstore() -> None:
    """Make MXNet build accord's types from their names even on one device (see the module doc)."""
    import mxnet.gluon.trainer as trainer
    import mxnet.model as model
    import mxnet.module.module as module

    original = model._create_kvstore
    if getattr(original, "_accord", False):
        return

    def create_kvstore(kvstore: Any, num_device: int, arg_params: Any) -> Any:
        if isinstance(kvstore, str) and kvstore.lower() in TYPES:
            kvstore = mx.kv.create(kvstore)
        return original(kvstore, num_device, arg_params)

    create_kvstore._accord = True  # type: ignore[attr-defined]
    for where in (model, trainer, module):
        where._create_kvstore = create_kvstore


def create(name: str = "dist_sync_perseus") -> Any:
    """Perseus's ``perseus_kv.create(name)``: accord's store for ``'accord'``, the
    ``'dist_sync*'`` and ``'dist_sync_perseus'`` types; MXNet's own for ``'local'`` / ``'device'``.

    Args:
        name: the store type, case-insensitive (Perseus's default ``'dist_sync_perseus'``).

    Returns:
        An ``mx.kvstore`` store, made by ``mx.kv.create``.

    Raises:
        ValueError: a type neither accord nor MXNet knows.
    """
    key = str(name).lower()
    if key in TYPES:
        return mx.kv.create(key)
    if key in ("dist_sync", "dist_device_sync", "dist_sync_device"):
        return mx.kv.create("dist_sync_perseus")
    if key in ("local", "device", "local_update_cpu", "local_allreduce_cpu", "local_allreduce_device"):
        return mx.kv.create(key)
    raise ValueError(with_hint(f"unknown kvstore type {name!r} for accord.mxnet.create",
                               f"use one of {sorted(TYPES)}, 'dist_sync', 'local' or 'device'"))


_register()
