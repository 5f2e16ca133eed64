"""The ``Work`` objects the accord process group hands to torch: one per collective call.

A call submits one or more engine requests; once every one has completed, ``finish`` (run on the
engine's thread) copies the results where torch expects them and returns the future's value (a
list of tensors, as Gloo's futures hold: DDP's reducer reads it). Then the work is done and its
``torch.futures.Future`` is completed, with a real error when a request failed: a future failed
through ``Future.set_exception`` would look successful to C++ waiters (DDP's reducer,
``wait_tensor``), so the failure travels as a value that a ``then`` callback raises.

``wait()`` first waits on the engine the way ``hvd.synchronize`` does (the caller's thread may run
the engine's planned cycle), then on the work itself, and raises the collective's error. CUDA
results: the caller's current stream waits for the copies, as the NCCL process group's
``wait()`` makes it.

torch before 2.5 keeps only the C++ half of a Python ``Work`` that a C++ caller (DDP's reducer,
functional collectives) received once Python drops it, and a later ``wait()`` there never
returns. :func:`keep_alive` holds such works while pending and the last
:data:`KEPT_DONE` completed ones, on those torch versions only (:func:`needs_keep_alive`).
"""
from __future__ import annotations

import collections
import functools
import threading
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from accord import engine
from accord.errors import CollectiveError, with_hint

Finish = Callable[[], list[torch.Tensor]]

KEPT_DONE = 1024  # completed works kept on torch versions that need it (C++ may still wait on them)


class _Failure:
    """The value that fails a future for C++ waiters too (see the module docstring)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _raise_failure(future: torch.futures.Future) -> Any:
    value = future.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


class AccordWork(dist.Work):
    """A collective in flight: the engine's handles, what to do once they are done, and a future.

    A synchronous call (torch's wrapper waits at once) never asks for the future, so it is made
    on the first :meth:`get_future` only (already completed when the work is). Once complete, the
    work lets go of its handles and its ``finish``: a work outlives its call (torch's caller, the
    group's names wait on it before a name recurs), and the handles hold the engine's results,
    which for the gathers and reduce-scatters are tensors as large as the call's output.

    Args:
        handles: the engine requests of this call.
        finish: run once every handle has succeeded (on the engine's thread); returns the
            future's value.
        what: the call, for messages ("allreduce on group '0'").
        on_error: called (on the engine's thread, before any waiter wakes) when the call failed.
    """

    def __init__(self, handles: Sequence[Any], finish: Finish, what: str,
                 on_error: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._on_error = on_error
        self._handles: Sequence[Any] = handles
        self._finish_fn: Finish | None = finish
        self._what = what
        # A bare lock held until completion (as the engine's Handle): cheaper to make than an Event
        self._gate = threading.Lock()
        self._gate.acquire()
        self._finished = False
        self._error: BaseException | None = None
        self._value: list[torch.Tensor] = []
        self._cuda_event: Any = None
        self._source: _FutureSource | None = None
        self._lock = threading.Lock()  # guards _source against completion
        self._remaining = len(handles)
        keep_alive(self)
        if not handles:
            self._complete()
        elif len(handles) == 1:
            handles[0].add_done_callback(self._last_done)
        else:
            for handle in handles:
                handle.add_done_callback(self._one_done)

    @classmethod
    def done_with(cls, value: list[torch.Tensor], what: str) -> "AccordWork":
        """A work that is complete already (a collective with nothing to move)."""
        return cls([], lambda: value, what)

    # --- completion (engine side) -------------------------------------------------------------

    def _one_done(self, _handle: Any) -> None:
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._complete()

    def _last_done(self, _handle: Any) -> None:
        self._complete()

    def _complete(self) -> None:
        try:
            for handle in self._handles:
                handle.result()  # raises the engine's error
            self._value = self._finish_fn()  # type: ignore[misc]
            for t in self._value:
                if t.is_cuda:
                    self._cuda_event = torch.cuda.Event()
                    self._cuda_event.record()
                    break
        except BaseException as exc:  # noqa: BLE001 (handed to every waiter)
            self._error = exc if isinstance(exc, RuntimeError) else CollectiveError(
                with_hint(f"{self._what} failed: {type(exc).__name__}: {exc}",
                          "see the error above; every rank of the group raises it"))
        if self._error is not None and self._on_error is not None:
            self._on_error()
        self._handles, self._finish_fn = (), None
        with self._lock:
            self._finished = True
            source = self._source
        self._gate.release()
        done_keeping(self)
        if source is not None:
            source.set(self._outcome())

    def _outcome(self) -> Any:
        return self._value if self._error is None else _Failure(self._error)

    # --- torch's Work API ---------------------------------------------------------------------

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the collective is done and raise its error (``timeout``: none, or 0 as C++
        callers pass for "no timeout").

        Raises:
            RuntimeError: the collective failed (accord's error, on every rank of the group), or
                did not finish within ``timeout``.
        """
        if not self._finished:
            if timeout is None or timeout.total_seconds() <= 0:
                self.drive()
            elif not self._wait_for(timeout.total_seconds()):
                raise CollectiveError(with_hint(
                    f"{self._what} did not finish within the {timeout.total_seconds():g} s timeout of "
                    "this wait", "a rank may not have called it (every rank of the group must make the "
                    "same calls in the same order); the engine's stall report names the missing ranks"))
        if self._error is not None:
            raise self._error
        if self._cuda_event is not None:
            torch.cuda.current_stream().wait_event(self._cuda_event)
        return True

    def drive(self) -> None:
        """Wait until done without raising (the engine's cycle runs on this thread where it can)."""
        for handle in self._handles:
            if not handle.done():
                try:
                    engine.synchronize(handle)
                except Exception:  # noqa: BLE001 (the work keeps its own error for its waiters)
                    pass
        self._wait_gate(None)

    def _wait_for(self, seconds: float) -> bool:
        for handle in self._handles:
            engine.poll(handle)  # a caller waits: the engine's gathering ends now
        return self._wait_gate(seconds)

    def _wait_gate(self, seconds: float | None) -> bool:
        if not self._finished and self._gate.acquire(timeout=-1 if seconds is None else seconds):
            self._gate.release()  # let the next waiter through
        return self._finished

    def is_completed(self) -> bool:
        """Whether the collective has finished (successfully or not)."""
        return self._finished

    def is_success(self) -> bool:
        """Whether it finished without error (False while pending)."""
        return self._finished and self._error is None

    def exception(self) -> BaseException | None:
        """The collective's error, or None (also while pending)."""
        return self._error

    def result(self) -> list[torch.Tensor]:
        """The output tensors (after :meth:`wait`)."""
        self.wait()
        return self._value

    def get_future(self) -> torch.futures.Future:
        """A future completed with the output tensors (DDP's reducer and comm hooks use it)."""
        with self._lock:
            source = self._source
            if source is None:
                source = self._source = _FutureSource()
                finished = self._finished
            else:
                finished = False  # completed, or to be completed, by whoever made it
        if finished:
            source.set(self._outcome())
        return source.future

    def _source_rank(self) -> int:
        return -1

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self._finished else "pending"
        return f"AccordWork({self._what}, {state})"


class _FutureSource:
    """The future torch sees, and the one completed on this side (see the module docstring)."""

    __slots__ = ("_inner", "future")

    def __init__(self) -> None:
        self._inner = torch.futures.Future()
        self.future = self._inner.then(_raise_failure)

    def set(self, value: Any) -> None:
        self._inner.set_result(value)


# --- keeping works alive on torch versions that drop them -------------------------------------

_kept_pending: set[AccordWork] = set()
_kept_done: collections.deque[AccordWork] = collections.deque(maxlen=KEPT_DONE)
_kept_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def needs_keep_alive() -> bool:
    """Whether this torch forgets a Python work handed to C++ (before 2.5 it does: a work
    returned through the C++ process group comes back as the Python object only when C++
    holds the Python half)."""

    class _Probe(dist.Work):
        pass

    held: list[_Probe] = []

    class _ProbeGroup(dist.ProcessGroup):
        def allreduce(self, tensors: Any, opts: Any = None) -> _Probe:
            held.append(_Probe())
            return held[-1]

        def getBackendName(self) -> str:  # noqa: N802 (torch's name)
            return "accord-probe"

    returned = dist.ProcessGroup.allreduce(_ProbeGroup(0, 1), [torch.zeros(1)], dist.AllreduceOptions())
    return type(returned) is _Probe


def keep_alive(work: AccordWork) -> None:
    """Hold ``work`` while it is pending, where torch needs that."""
    if needs_keep_alive():
        with _kept_lock:
            _kept_pending.add(work)


def done_keeping(work: AccordWork) -> None:
    """``work`` is done: keep it among the last completed ones only."""
    if needs_keep_alive():
        with _kept_lock:
            _kept_pending.discard(work)
            _kept_done.append(work)
