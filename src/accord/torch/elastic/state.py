"""Elastic training state (Horovod's ``State``, ``ObjectState`` and ``TorchState``).

A state is what training needs to resume after a failure: ``commit()`` keeps an in-memory copy,
``restore()`` goes back to it, ``sync()`` makes every rank's copy rank 0's (after a reset, new
or restarted ranks catch up). Model, optimizer and learning-rate scheduler are saved with
``state_dict``; an ``ElasticSampler`` keeps which samples were processed; anything else passed
as a keyword (epoch, batch, ...) is an attribute broadcast as an object.
"""
from __future__ import annotations

import copy
import os
import queue
from typing import Any, Callable

import torch

from accord.torch import functions, gateway
from accord.torch.elastic.sampler import ElasticSampler
from accord.torch.gateway import rank


class HostsUpdatedInterrupt(RuntimeError):
    """Raised from ``commit()`` when the set of hosts changed; ``hvd.elastic.run`` then resets.

    ``skip_sync`` is True when hosts were only removed: the survivors hold the committed state
    already, so the reset need not sync it (added hosts must receive it: False).

    Args:
        skip_sync: True when the update only removed hosts.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts were updated")
        self.skip_sync = skip_sync


class State:
    """Base class: commit/restore/sync plus reset callbacks (run after every reset).

    Args:
        bcast_object: sends a picklable object from rank 0 to every rank and returns it
            (``hvd.broadcast_object``); used to agree on host updates and to sync.
        get_rank: returns this process's rank (``hvd.rank``).
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue = queue.Queue()
        self._pending: list[Any] = []  # host updates not acted on yet
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Call these (e.g. to rescale the learning rate with the new size) after each reset.

        Args:
            callbacks: functions of no argument, called in order after the ranks re-formed
                and the state was synced.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run after the ranks re-formed: reset hook, then the registered callbacks."""
        self._host_messages = queue.Queue()
        self._pending = []
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any = None) -> None:
        """Record a host change; the next ``commit()`` raises HostsUpdatedInterrupt.

        Called by the elastic driver's notification, not by training scripts.

        Args:
            timestamp: when the driver saw the change (kept, not interpreted).
            update_res: "added" or "removed" (any other value counts as added).
        """
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state in memory, then interrupt if hosts changed since the last commit."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt when a host update was recorded (``skip_sync`` when every
        update only removed hosts: the survivors all hold the state just committed).

        Ranks learn of an update at slightly different times, so rank 0's view decides, for
        every rank at the same commit (one small broadcast per commit, as in Horovod).
        """
        while not self._host_messages.empty():
            self._pending.append(self._host_messages.get()[1])
        kinds = self._pending
        if gateway.is_initialized() and gateway.size() > 1:
            kinds = self._bcast_object(self._pending if self._rank() == 0 else None)
        if kinds:
            self._pending = []
            raise HostsUpdatedInterrupt(all(k == "removed" for k in kinds))

    def save(self) -> None:
        """Keep a copy of the state in memory (what ``restore()`` goes back to).

        Raises:
            NotImplementedError: in this base class; subclasses implement it.
        """
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last saved copy (after a failed step, before the reset).

        Raises:
            NotImplementedError: the base class does not implement it.
        """
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state rank 0's (after a reset, for new or restarted ranks).

        Raises:
            NotImplementedError: unless a subclass overrides it.
        """
        raise NotImplementedError

    def reset(self) -> None:
        """Hook for subclasses: called on every reset before the callbacks."""


# Values of these types are snapshotted at each commit (a deep copy), so ``restore()`` also
# undoes changes made in place (``state.seen.append(x)``); copying them is cheap.
_SNAPSHOT_TYPES = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)


def _is_snapshotted(value: Any) -> bool:
    return isinstance(value, _SNAPSHOT_TYPES)


def _kept(value: Any) -> Any:
    """What a commit keeps of an attribute: a deep copy of plain data, the object itself otherwise."""
    return copy.deepcopy(value) if _is_snapshotted(value) else value


class ObjectState(State):
    """State made of plain attributes given as keywords (they must be picklable).

    Plain data (numbers, strings, and lists, dicts, sets and tuples of them) is snapshotted at
    each commit, so ``restore()`` also undoes changes made in place. Any other object (a torch
    ``DistributedSampler``, a user's class) is kept by reference, as Horovod keeps every
    attribute: the state's attribute stays the object the rest of the script holds (the one a
    DataLoader uses, say), ``restore()`` puts that same object back, and only ``sync()`` on
    ranks other than 0 replaces it with rank 0's copy.

    Args:
        bcast_object: broadcasts an object from rank 0 (as for :class:`State`).
        get_rank: this process's rank, as a function.
        **kwargs: the attributes, by name, with their initial values.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state = {attr: _kept(value) for attr, value in kwargs.items()}
        for attr, value in kwargs.items():
            setattr(self, attr, value)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: _kept(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            received = self._bcast_object(self._saved_state)
            if received is not self._saved_state:  # rank 0 keeps its own objects
                self._saved_state = received
                self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, _kept(value))


class _Handler:
    """Save/restore/sync of one object held by a TorchState."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def reset(self) -> None:
        """After the job re-formed (a new size): nothing to do for most values."""


class _ModelHandler(_Handler):
    def restore(self) -> None:
        super().restore()
        self.value.zero_grad(set_to_none=True)  # gradients of the aborted step are stale

    def sync(self) -> None:
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self) -> None:
        super().restore()  # a DistributedOptimizer also forgets its in-flight reductions here
        for group in self.value.param_groups:
            for p in group["params"]:
                p.grad = None  # gradients of the aborted step are stale

    def sync(self) -> None:
        functions.broadcast_optimizer_state(self.value, root_rank=0)

    def reset(self) -> None:
        """A sharded optimizer cuts its shards anew for the new size, from the last commit."""
        reshard = getattr(self.value, "_accord_reshard", None)
        if reshard is not None:
            reshard(self.saved)


class _SchedulerHandler(_Handler):
    """A learning-rate scheduler (Horovod's LRSchedulerStateHandler): its ``state_dict`` is saved,
    restored and broadcast from rank 0, the scheduler object itself stays the script's."""

    def sync(self) -> None:
        self.value.load_state_dict(functions.broadcast_object(self.value.state_dict(), root_rank=0))


class _SamplerHandler(_Handler):
    def reset(self) -> None:
        self.value.reset()  # re-split what is left of the epoch over the new ranks

    def sync(self) -> None:
        # Every rank processed different samples: rank 0 adopts their union, then broadcasts.
        processed: set[int] = set()
        for part in functions.allgather_object(self.value.processed_indices):
            processed.update(part)
        state = self.value.state_dict()
        state["processed_indices"] = processed
        self.value.load_state_dict(functions.broadcast_object(state, root_rank=0))


# torch >= 2.0 names the base LRScheduler (ReduceLROnPlateau derives from it since 2.2); older
# releases only _LRScheduler, and ReduceLROnPlateau on its own.
_SCHEDULER_TYPES = tuple({getattr(torch.optim.lr_scheduler, name) for name in
                          ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau")
                          if hasattr(torch.optim.lr_scheduler, name)})


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    if isinstance(value, _SCHEDULER_TYPES):
        return _SchedulerHandler(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: ``TorchState(model, optimizer, epoch=0, batch=0, ...)``.

    Models, optimizers, learning-rate schedulers and ElasticSamplers (given under any keyword)
    are saved with their ``state_dict``; other keywords become attributes (``state.epoch``; see
    :class:`ObjectState` for what a commit keeps of them).

    Args:
        model: a module whose ``state_dict`` is committed and broadcast (optional).
        optimizer: an optimizer, a DistributedOptimizer included, kept the same way (optional).
        **kwargs: more models, optimizers, schedulers and samplers, or plain attributes.
    """

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
            elif value is not None or name not in ("model", "optimizer"):
                plain[name] = value
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=functions.broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()

    def commit_to_disk(self, path: str) -> None:
        """``commit()``, then write that commit to ``path`` (rank 0 writes; call it on every
        rank), for a whole-job restart (``accordrun --max-restarts``) to resume from with
        :meth:`restore_from_disk`. The file is replaced atomically (a kill mid-write keeps the
        previous one). It holds every model's, optimizer's, scheduler's and sampler's
        ``state_dict`` and the plain attributes (numbers, strings, lists, dicts); other
        attributes are not written.

        Args:
            path: the file to write (its folder is created); the same on every rank.
        """
        self.commit()
        if rank() != 0:
            return
        data = {"handlers": {name: h.saved for name, h in self._handlers.items()},
                "attrs": {k: _disk_value(v) for k, v in self._saved_state.items() if _is_snapshotted(v)}}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            torch.save(data, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def restore_from_disk(self, path: str) -> bool:
        """Load what :meth:`commit_to_disk` wrote at ``path`` on rank 0 (``torch.load`` with
        ``weights_only=True``), make it every rank's (the other ranks need not see the file),
        and commit it. Call it on every rank, before training.

        Args:
            path: the file :meth:`commit_to_disk` wrote; read on rank 0 only.

        Returns:
            True when rank 0 found the file and every rank now holds its state; False (nothing
            changed) when there is none yet, the first attempt.
        """
        found = rank() == 0 and os.path.exists(path)
        if found:
            data = torch.load(path, map_location="cpu", weights_only=True)
            for name, saved in data["handlers"].items():
                if name in self._handlers:
                    self._handlers[name].value.load_state_dict(saved)
            for name, value in data["attrs"].items():
                if name in self._saved_state:
                    setattr(self, name, value)
        if not bool(self._bcast_object(found)):
            return False
        self.save()
        self.sync()
        return True


def _disk_value(value: Any) -> Any:
    """Plain data as ``torch.load(weights_only=True)`` reads it back (sets become sorted lists)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value
