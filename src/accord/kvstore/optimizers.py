"""Optimizers a KVStore applies to stored values: a registry of names and hyperparameters.

A parameter-server store ships an optimizer as its configuration (``{"name": "sgd", "params":
{...}}``), never as a pickle; servers rebuild it from this registry. The arithmetic uses only
operators and methods that numpy arrays and torch tensors share (``*=``, ``-=``, ``.clip``,
``** 0.5``), so the same code updates numpy arrays on the servers and torch tensors in the local
and collective stores (and gives the same values). This module does not import torch.

Update rules (MXNet 1.9.1's ``sgd_update``, ``sgd_mom_update`` and ``adam_update``; ``clip`` is
off when ``clip_gradient`` is None or negative)::

    sgd, momentum 0:  g = clip(rescale_grad * grad);  w = (1 - lr * wd) * w - lr * g
    sgd, momentum m:  mom = m * mom - lr * wd * w - lr * g;  w += mom
    adam (step t):    g = clip(rescale_grad * grad + wd * w)
                      mean = b1 * mean + (1 - b1) * g;  var = b2 * var + (1 - b2) * g * g
                      w -= lr * sqrt(1 - b2**t) / (1 - b1**t) * mean / (sqrt(var) + epsilon)

``t`` counts the updates of each key (MXNet's per-index update count).

In ``dist_sync`` the merged gradient is the *sum* over workers of each worker's gradient, and the
batch size is per worker: set ``rescale_grad = 1 / (batch_per_worker * num_workers)`` to apply the
mean gradient over the global batch (MXNet's convention).
"""
from __future__ import annotations

import io
import json
import math
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import numpy as np

from accord.errors import with_hint
from accord.registry import Registry

__all__ = [
    "SGD", "Adam", "Optimizer", "Updater", "create", "from_config", "known_optimizers",
    "load_states", "register_optimizer", "save_states",
]

_REGISTRY: Registry[type["Optimizer"]] = Registry("optimizer", "@register_optimizer")
_FORMAT = "accord-kvstore-optimizer-states"
_META = "__accord_kvstore_states__"


def _zeros_like(weight: Any) -> Any:
    if isinstance(weight, np.ndarray):
        return np.zeros_like(weight)
    return weight.new_zeros(weight.shape)  # a torch tensor (torch is not imported here)


def _as_numpy(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    return array.detach().cpu().numpy()


def _like(weight: Any, array: np.ndarray) -> Any:
    """``array`` as the same kind, dtype and device as ``weight`` (a private copy)."""
    if isinstance(weight, np.ndarray):
        return np.array(array, dtype=weight.dtype).reshape(weight.shape)
    return weight.new_tensor(array).reshape(weight.shape)


class Optimizer:
    """Base of the registered optimizers: validated hyperparameters and an in-place update.

    Subclasses set ``name`` and ``defaults`` (every hyperparameter they accept, with MXNet's
    default) and implement :meth:`create_state` and :meth:`update`.

    Args:
        **params: hyperparameters by MXNet's names, each one of ``defaults``; the others keep
            their default. Values become floats (``clip_gradient`` may be None: no clipping).

    Raises:
        ValueError: an unknown hyperparameter, or a value that is not a finite number.
    """

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {
        "learning_rate": 0.01, "wd": 0.0, "rescale_grad": 1.0, "clip_gradient": None,
    }

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ValueError(with_hint(
                f"optimizer {self.name!r} has no hyperparameter(s) {unknown}; it takes "
                f"{sorted(self.defaults)}",
                "check the spelling (MXNet names: learning_rate, wd, rescale_grad, clip_gradient, ...)"))
        merged = dict(self.defaults)
        merged.update(params)
        for key, value in merged.items():
            if value is None and key == "clip_gradient":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(with_hint(
                    f"optimizer {self.name!r}: {key}={value!r} is not a finite number",
                    f"pass a number for {key} (default {self.defaults[key]!r})"))
            merged[key] = float(value)
        self.params: dict[str, Any] = merged

    def __getattr__(self, item: str) -> Any:
        params = self.__dict__.get("params", {})
        if item in params:
            return params[item]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {item!r}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"{type(self).__name__}({shown})"

    def config(self) -> dict[str, Any]:
        """What ``set_optimizer`` ships to the servers.

        Returns:
            ``{"name": ..., "params": {...}}``, JSON-safe; :func:`from_config` rebuilds it.
        """
        return {"name": self.name, "params": dict(self.params)}

    def _grad(self, grad: Any, weight: Any, with_wd: bool) -> Any:
        """rescale (plus wd * w when ``with_wd``), then clip; always a new array."""
        g = grad * self.params["rescale_grad"]
        if with_wd and self.params["wd"]:
            g += self.params["wd"] * weight
        clip = self.params["clip_gradient"]
        if clip is not None and clip >= 0:
            g = g.clip(-clip, clip)
        return g

    def create_state(self, weight: Any) -> list[Any]:
        """The state a key starts with (e.g. momentum buffers).

        Args:
            weight: the key's stored value (numpy or torch); the state is of its kind and shape.

        Returns:
            The state arrays (may be empty).

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError

    def update(self, weight: Any, grad: Any, state: list[Any], count: int) -> None:
        """Update ``weight`` (and ``state``) in place; ``grad`` is never modified.

        Args:
            weight: the stored value, updated in place.
            grad: the pushed (summed) gradient, the same kind and shape.
            state: what :meth:`create_state` returned, updated in place.
            count: this key's update number, from 1 (Adam's bias correction uses it).

        Raises:
            NotImplementedError: subclasses implement it.
        """
        raise NotImplementedError


def register_optimizer(cls: type[Optimizer] | None = None, *, override: bool = False) -> Any:
    """Register an :class:`Optimizer` subclass under ``cls.name`` (servers look it up there).

    Use as ``@register_optimizer``, or ``@register_optimizer(override=True)`` to replace the
    optimizer registered under the same name.

    Args:
        cls: the subclass (``None`` when called as ``@register_optimizer(override=True)``).
        override: replace an optimizer registered under the same name.

    Returns:
        ``cls``, or, without it, a decorator that registers its class.

    Raises:
        TypeError: ``cls`` is not an Optimizer subclass with a name.
        ConfigError: the name is taken and ``override`` is False.
    """
    if cls is None:
        return lambda c: register_optimizer(c, override=override)
    if not (isinstance(cls, type) and issubclass(cls, Optimizer) and cls.name):
        raise TypeError(with_hint(f"{cls!r} is not an Optimizer subclass with a name",
                                  "subclass accord.kvstore.optimizers.Optimizer and set name = '...'"))
    _REGISTRY.add(cls.name.lower(), cls, override=override)
    return cls


def known_optimizers() -> list[str]:
    """The names :func:`create` accepts.

    Returns:
        The registered optimizer names (``"adam"``, ``"sgd"`` and any added).
    """
    return _REGISTRY.names()


def create(name: str, **params: Any) -> Optimizer:
    """Build a registered optimizer, e.g. ``create("sgd", learning_rate=0.1, momentum=0.9)``.

    Args:
        name: a registered name (``"sgd"``, ``"adam"``, or one added with
            :func:`register_optimizer`; case does not matter).
        **params: the optimizer's hyperparameters, by MXNet's names (``learning_rate``,
            ``momentum``, ``wd``, ``rescale_grad``, ``clip_gradient``, ...).

    Returns:
        The optimizer, to pass to ``kv.set_optimizer``.

    Raises:
        ValueError: unknown name or hyperparameter, or a non-numeric value.
    """
    cls = _REGISTRY.get(str(name).lower())
    if cls is None:
        raise _REGISTRY.unknown(name)
    return cls(**params)


def from_config(config: Mapping[str, Any]) -> Optimizer:
    """Inverse of :meth:`Optimizer.config` (what a server does with ``set_optimizer``).

    Args:
        config: ``{"name": ..., "params": {...}}``.

    Returns:
        A new optimizer of that name and hyperparameters.

    Raises:
        ValueError: ``config`` has not that form, or :func:`create` refuses it.
    """
    if not isinstance(config, Mapping) or not isinstance(config.get("name"), str) \
            or not isinstance(config.get("params", {}), Mapping):
        raise ValueError(with_hint(f"not an optimizer configuration: {config!r}",
                                   "send Optimizer.config(): {'name': 'sgd', 'params': {...}}"))
    return create(config["name"], **dict(config.get("params", {})))


@register_optimizer
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and weight decay (MXNet's ``sgd``)."""

    name = "sgd"
    defaults = {**Optimizer.defaults, "momentum": 0.0}

    def create_state(self, weight: Any) -> list[Any]:
        return [_zeros_like(weight)] if self.params["momentum"] != 0.0 else []

    def update(self, weight: Any, grad: Any, state: list[Any], count: int) -> None:
        lr, wd, momentum = self.params["learning_rate"], self.params["wd"], self.params["momentum"]
        g = self._grad(grad, weight, with_wd=False)
        g *= lr
        if momentum == 0.0:
            if wd:
                weight *= 1.0 - lr * wd
            weight -= g
            return
        mom = state[0]
        mom *= momentum
        if wd:
            mom -= (lr * wd) * weight
        mom -= g
        weight += mom


@register_optimizer
class Adam(Optimizer):
    """Adam with bias correction folded into the step size (MXNet's ``adam``)."""

    name = "adam"
    defaults = {**Optimizer.defaults, "learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999,
                "epsilon": 1e-8}

    def create_state(self, weight: Any) -> list[Any]:
        return [_zeros_like(weight), _zeros_like(weight)]

    def update(self, weight: Any, grad: Any, state: list[Any], count: int) -> None:
        p = self.params
        b1, b2 = p["beta1"], p["beta2"]
        g = self._grad(grad, weight, with_wd=True)
        mean, var = state
        mean *= b1
        mean += (1.0 - b1) * g
        var *= b2
        var += (1.0 - b2) * (g * g)
        lr = p["learning_rate"] * math.sqrt(1.0 - b2 ** count) / (1.0 - b1 ** count)
        weight -= lr * mean / (var ** 0.5 + p["epsilon"])


class Updater:
    """Applies an optimizer per key, keeping each key's state and update count (MXNet's updater).

    ``updater(key, grad, weight)`` updates ``weight`` in place.

    Args:
        optimizer: the optimizer to apply (its :meth:`Optimizer.create_state` is called on a
            key's first update).
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.states: dict[Hashable, list[Any]] = {}
        self.counts: dict[Hashable, int] = {}

    def __call__(self, key: Hashable, grad: Any, weight: Any) -> None:
        count = self.counts.get(key, 0) + 1
        state = self.states.get(key)
        if state is None:
            state = self.optimizer.create_state(weight)
        elif state and type(state[0]) is not type(weight):  # loaded from a file as numpy
            state = [_like(weight, _as_numpy(s)) for s in state]
        self.states[key] = state
        self.optimizer.update(weight, grad, state, count)
        self.counts[key] = count

    def export(self, start: int = 0, stop: int | None = None) -> list[tuple[Hashable, int, list[np.ndarray]]]:
        """The keys' states, to save or ship.

        Args:
            start: the first key to include, counting keys in the order of their first update.
            stop: where to stop, in the same order (None: at the end).

        Returns:
            ``(key, count, states as numpy)`` per key, ``[start:stop]`` of them.
        """
        keys = list(self.states)[start:stop]
        return [(key, self.counts.get(key, 0), [np.array(_as_numpy(s)) for s in self.states[key]])
                for key in keys]

    def load(self, entries: Sequence[tuple[Hashable, int, Sequence[np.ndarray]]]) -> None:
        """Replace the state of the given keys (converted to the weights' kind on next use).

        Args:
            entries: ``(key, update count, state arrays)`` per key, as :meth:`export` gives.
        """
        for key, count, states in entries:
            self.states[key] = [np.asarray(s) for s in states]
            self.counts[key] = int(count)


def _key_to_json(key: Hashable) -> list[Any]:
    if isinstance(key, str):
        return ["s", key]
    if isinstance(key, int) and not isinstance(key, bool):
        return ["i", key]
    raise TypeError(f"optimizer states can only be saved for int or str keys, got {key!r}")


def save_states(fname: str, entries: Sequence[tuple[Hashable, int, Sequence[np.ndarray]]],
                optimizer: Optimizer | None = None) -> None:
    """Write optimizer states to ``fname`` (a numpy ``.npz`` with a JSON index; no pickle).

    Args:
        fname: the file to write (replaced if it exists).
        entries: ``(key, update count, state arrays)`` per key.
        optimizer: also record the optimizer's configuration (``dump_optimizer=True``).

    Raises:
        TypeError: a key is neither an int nor a str.
    """
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, (key, count, states) in enumerate(entries):
        index.append({"key": _key_to_json(key), "count": int(count), "states": len(states)})
        for j, state in enumerate(states):
            arrays[f"k{i}.s{j}"] = np.ascontiguousarray(state)
    meta = {"format": _FORMAT, "version": 1, "keys": index,
            "optimizer": None if optimizer is None else optimizer.config()}
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with open(fname, "wb") as fh:
        fh.write(buf.getvalue())


def load_states(fname: str) -> tuple[list[tuple[Hashable, int, list[np.ndarray]]], Optimizer | None]:
    """Read a file written by :func:`save_states`.

    Args:
        fname: the file's path.

    Returns:
        ``(entries, optimizer)``: ``(key, count, states)`` per key, and the optimizer when
        the file recorded one (else None).

    Raises:
        ValueError: the file is not an accord optimizer-state file.
    """
    try:
        loaded = np.load(fname, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a plain .npy array
            raise TypeError(f"a {type(loaded).__name__}, not an .npz archive")
        with loaded as data:
            meta = json.loads(bytes(data[_META]).decode())
            if meta.get("format") != _FORMAT:
                raise KeyError(_META)
            entries = []
            for i, item in enumerate(meta["keys"]):
                kind, key = item["key"]
                key = int(key) if kind == "i" else str(key)
                entries.append((key, int(item["count"]),
                                [np.array(data[f"k{i}.s{j}"]) for j in range(item["states"])]))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ValueError(with_hint(f"{fname!r} is not an accord optimizer-state file: {exc!r}",
                                   "pass a file written by save_optimizer_states")) from None
    optimizer = None if meta.get("optimizer") is None else from_config(meta["optimizer"])
    return entries, optimizer
