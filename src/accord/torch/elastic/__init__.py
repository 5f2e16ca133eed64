"""Horovod's elastic API for PyTorch: ``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``.

::

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):
                ...
                state.commit()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)

When a collective fails (``HorovodInternalError``, e.g. a rank died), every surviving rank
restores the last commit, the job re-forms without the lost ranks (under accordrun; see
:mod:`accord.torch.elastic.reform`), reset callbacks run, rank 0's state is broadcast and
``train`` is called again. When hosts are added or removed (accordrun
``--host-discovery-script``), ``state.commit()`` raises ``HostsUpdatedInterrupt`` and the job
re-forms the same way from the state just committed; new workers receive it from rank 0 (the
lowest surviving rank). A worker whose host was removed leaves: ``train`` raises
:class:`MemberRemoved`, a ``SystemExit(0)``.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

from accord.errors import CollectiveError as HorovodInternalError
from accord.torch import basics, gateway
from accord.torch.elastic.reform import MemberRemoved, Membership
from accord.torch.elastic.sampler import ElasticSampler
from accord.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "MemberRemoved",
           "ObjectState", "State", "TorchState", "run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)`` so it resumes from the last commit after failures.

    Args:
        func: the training function; its first argument is the :class:`State` (a
            :class:`TorchState`, usually), the others are passed through.

    Returns:
        The wrapped function. Called, it initializes accord if needed, syncs the state from
        rank 0, and calls ``func``; on ``HorovodInternalError`` it restores the last commit, on
        ``HostsUpdatedInterrupt`` it keeps the state just committed, and either way re-forms the
        job, runs the reset callbacks and calls ``func`` again. It returns what ``func`` returns.

    Raises:
        MemberRemoved: this worker's host left the job (a ``SystemExit(0)``).
        Exception: any other error of ``func``, which ends this worker.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not basics.is_initialized():
            basics.init()
        gateway.set_elastic(True)
        membership = Membership()
        membership.on_update = lambda kind: state.on_hosts_updated(time.time(), kind)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as exc:
                    skip_sync = exc.skip_sync
                before = set(membership.members)
                _reset(membership)
                if set(membership.members) - before:
                    # a worker new to the job waits for the state in its sync(): the survivors
                    # must sync too, even when they were told of a removal only
                    skip_sync = False
                state.on_reset()
                membership.after_reset()
        except Exception:
            membership.mark_exiting()  # not a failure hvd.elastic.run recovers from: this worker ends
            raise
        finally:
            membership.stop()
            gateway.set_elastic(False)

    return wrapper


def _reset(membership: Membership) -> None:
    """Leave the broken job, agree on the survivors, and start the new one."""
    basics.shutdown()
    membership.regroup()
    basics.init()
