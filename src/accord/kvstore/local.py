"""``local`` and ``device`` stores: one process, values merged and updated in place.

``local`` keeps every stored value on the CPU and merges there; ``device`` keeps a key's value on
the device of the value given to ``init`` (a GPU when present) and merges the pushed values there.
With 2-bit compression (``device`` only, as in MXNet) each device's value is quantized with its
own residual, then dequantized and summed on the merging device.

:class:`LocalKVStore` is also the base of the engine-backed ``dist_sync`` store
(:mod:`accord.kvstore.collective`), which adds the cross-worker step in :meth:`_across_workers`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from accord.errors import with_hint
from accord.kvstore import optimizers as opt
from accord.kvstore.base import Key, KVStoreBase
from accord.kvstore.gradient_compression import TwoBitCompression, create_compression
from accord.kvstore.values import KeyInfo, reduce, to_tensor, write

__all__ = ["LocalKVStore", "as_optimizer"]


def as_optimizer(optimizer: Any) -> opt.Optimizer:
    """Accept an :class:`~accord.kvstore.optimizers.Optimizer`, a registered name, or a config dict."""
    if isinstance(optimizer, opt.Optimizer):
        return optimizer
    if isinstance(optimizer, str):
        return opt.create(optimizer)
    if isinstance(optimizer, dict):
        return opt.from_config(optimizer)
    raise TypeError(with_hint(
        f"set_optimizer takes an accord optimizer, got {type(optimizer).__name__}",
        "build one with accord.kvstore.optimizers.create('sgd', learning_rate=0.1, momentum=0.9); "
        "for a custom Python update function on a local store use set_updater(fn)"))


class LocalKVStore(KVStoreBase):
    """A single-process store (types ``local`` and ``device``)."""

    def __init__(self, name: str = "local") -> None:
        super().__init__(name)
        self._on_device = "device" in name
        self._stored: dict[Key, torch.Tensor] = {}
        self._updater: Callable[[Any, torch.Tensor, torch.Tensor], None] | None = None
        self._optimizer: opt.Optimizer | None = None
        self._compression: TwoBitCompression | None = None

    # --- hooks for the collective subclass ---------------------------------------------------

    def _home(self, info: KeyInfo) -> torch.device:
        return info.device if self._on_device else torch.device("cpu")

    def _initial_values(self, items: Sequence[tuple[Key, Any, KeyInfo]]) -> list[torch.Tensor]:
        """The stored tensors for newly initialised keys (private copies)."""
        return [to_tensor(v).to(self._home(info), copy=True) for _, v, info in items]

    def _across_workers(self, merged: dict[Key, torch.Tensor], op: str) -> dict[Key, torch.Tensor]:
        """Combine this worker's merged values with the other workers' (one worker: as is)."""
        return merged

    _compress_devices = True  # quantize each device's value (device store); dist stores: False

    # --- KVStoreBase -------------------------------------------------------------------------

    def _init(self, items: Sequence[tuple[Key, Any, KeyInfo]]) -> None:
        for (k, _, _), value in zip(items, self._initial_values(items)):
            self._stored[k] = value

    def _merge(self, key: Key, values: list[Any], op: str) -> torch.Tensor:
        info, stored = self._keys[key], self._stored[key]
        comp = self._compression
        if comp is not None and self._compress_devices and op == "sum" and not info.param_only \
                and stored.is_floating_point():
            parts = [comp.decompress(comp.compress((key, i), to_tensor(v).to(stored.device)), info.shape)
                     for i, v in enumerate(values)]
            return reduce(parts, "sum", stored.device, stored.dtype)
        return reduce(values, op, stored.device, stored.dtype, mean=info.param_only)

    def _push(self, groups: Sequence[tuple[Key, list[Any]]], op: str) -> None:
        merged = {k: self._merge(k, values, op) for k, values in groups}
        for k, value in self._across_workers(merged, op).items():
            self._apply(k, value, op)

    def _apply(self, key: Key, merged: torch.Tensor, op: str) -> None:
        stored = self._stored[key]
        if self._updater is None or op != "sum" or self._keys[key].param_only:
            stored.copy_(merged)
        else:
            self._updater(key, merged, stored)

    def _pull(self, groups: Sequence[tuple[Key, list[Any]]]) -> None:
        for k, outs in groups:
            for o in outs:
                write(o, self._stored[k])

    # --- optimizer and compression -----------------------------------------------------------

    def set_optimizer(self, optimizer: Any) -> None:
        """Apply ``optimizer`` (see :func:`as_optimizer`) to every later sum push."""
        self._optimizer = as_optimizer(optimizer)
        self._updater = opt.Updater(self._optimizer)

    def set_updater(self, updater: Callable[[Any, torch.Tensor, torch.Tensor], None]) -> None:
        """Use ``updater(key, merged, stored)`` (updates ``stored`` in place) instead of an optimizer.

        MXNet's ``_set_updater``; a Python function cannot reach parameter servers, so only the
        in-process stores have it.
        """
        if not callable(updater):
            raise TypeError(with_hint(f"set_updater takes a callable, got {updater!r}",
                                      "pass a function f(key, merged, stored)"))
        self._optimizer = None
        self._updater = updater

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """2-bit compression with residual: ``{'type': '2bit', 'threshold': t}`` (not for 'local')."""
        if "device" not in self.type and "dist" not in self.type:
            super().set_gradient_compression(compression_params)
        self._compression = create_compression(compression_params)

    def _optimizer_updater(self, what: str) -> opt.Updater:
        if not isinstance(self._updater, opt.Updater):
            raise ValueError(with_hint(
                f"cannot {what} optimizer states: this {self.type!r} store has "
                f"{'a custom updater' if self._updater else 'no optimizer'}",
                "call kv.set_optimizer(accord.kvstore.optimizers.create(...)) first"))
        return self._updater

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write every key's optimizer state (npz; see :func:`optimizers.save_states`)."""
        updater = self._optimizer_updater("save")
        opt.save_states(fname, updater.export(), updater.optimizer if dump_optimizer else None)

    def load_optimizer_states(self, fname: str) -> None:
        """Load states (and the optimizer, when the file has one) written by save_optimizer_states."""
        entries, optimizer = opt.load_states(fname)
        if optimizer is not None:
            self.set_optimizer(optimizer)
        self._optimizer_updater("load").load(entries)
