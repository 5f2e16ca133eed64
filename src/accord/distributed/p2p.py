"""Point-to-point for the accord process group: ``send``, ``recv`` and ``recv`` from any source.

These take a direct path, not the engine: a transfer between two ranks has nothing to negotiate
among the others, and the engine's cycles are collective. Each pair of ranks that exchanges
messages gets a two-rank Gloo group of its own, made the first time either of them sends to or
receives from the other (both sides make it: every send has its receive), on the job's store.
The ranks' operations are issued in call order per peer on a thread of that peer's, so ``isend``
and ``irecv`` return at once and a ring of sends cannot wait on itself.

A receive from any source cannot know which pair to listen on, so every send first leaves its
source rank in the receiver's inbox on the store (one counter per receiver and tag); a receive
from any source takes the inbox's next entry and receives from that rank. Messages from one rank
to another arrive in the order they were sent, as in Gloo.
"""
from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from accord import engine
from accord.errors import CollectiveError, with_hint


class P2PWork(dist.Work):
    """One send or receive: done once the Gloo operation behind it is."""

    def __init__(self, what: str, tensor: torch.Tensor) -> None:
        super().__init__()
        self._what = what
        self._tensor = tensor
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.source = -1
        self._future = torch.futures.Future()

    def finish(self, error: BaseException | None, source: int = -1) -> None:
        """Record the outcome (the peer's thread calls it)."""
        self._error, self.source = error, source
        self._done.set()
        if error is None:
            self._future.set_result([self._tensor])
        else:
            self._future.set_exception(error)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the transfer is done; raise its error.

        Raises:
            RuntimeError: the transfer failed, or did not finish within ``timeout``.
        """
        seconds = None if timeout is None or timeout.total_seconds() <= 0 else timeout.total_seconds()
        if not self._done.wait(seconds):
            raise CollectiveError(with_hint(f"{self._what} did not finish within {seconds:g} s",
                                            "the peer must make the matching call"))
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the transfer has finished."""
        return self._done.is_set()

    def is_success(self) -> bool:
        """Whether it finished without error."""
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        """The transfer's error, or None."""
        return self._error

    def result(self) -> list[torch.Tensor]:
        """The tensor sent or received (after the transfer)."""
        self.wait()
        return [self._tensor]

    def get_future(self) -> torch.futures.Future:
        """A future completed with ``[tensor]``."""
        return self._future

    def _source_rank(self) -> int:
        """The group rank a receive from any source got its message from."""
        self.wait()
        return self.source


class _Peer:
    """The link to one other rank: its two-rank Gloo group, and the thread that issues operations."""

    def __init__(self, make_group: Callable[[], Any], name: str) -> None:
        self._make_group = make_group
        self._jobs: queue.Queue = queue.Queue()
        self._group: Any = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Callable[[Any], Any] | None) -> None:
        """Queue ``job(group)`` (None ends the thread)."""
        self._jobs.put(job)

    def _run(self) -> None:
        broken: BaseException | None = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._group is None and broken is None:
                try:
                    self._group = self._make_group()
                except Exception as exc:  # noqa: BLE001 (every later job gets the reason)
                    broken = exc
            job(self._group if broken is None else broken)

    def close(self) -> None:
        """End the thread after the queued operations."""
        self.put(None)


class PointToPoint:
    """The direct links of one process group's rank.

    Args:
        members: the group's global ranks, in group-rank order.
        rank: this rank within the group.
        timeout: how long a transfer may take.
        key: the group's name on the job's store.
    """

    def __init__(self, members: Sequence[int], rank: int, timeout: timedelta, key: str) -> None:
        self._members = tuple(members)
        self._rank = rank
        self._timeout = timeout
        self._key = key
        self._peers: dict[int, _Peer] = {}
        self._lock = threading.Lock()
        self._cursor: dict[int, int] = {}  # tag -> inbox entries read by receives from any source
        self._claimed: dict[tuple[int, int], int] = {}  # (src, tag) -> receives issued
        self._passed: dict[tuple[int, int], int] = {}  # (src, tag) -> its inbox entries read
        self._any: _Peer | None = None

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> P2PWork:
        """Send ``tensor`` to group rank ``dst``."""
        self._check_peer(dst, "send to")
        work = P2PWork(f"send to rank {dst}", tensor)
        store = self._store()
        at = int(store.add(f"{self._key}/inbox/{dst}/{tag}", 1))
        store.set(f"{self._key}/inbox/{dst}/{tag}/{at}", str(self._rank))
        peer_side = 1 - self._side(dst)
        self._peer(dst).put(lambda group: self._issue(group, work, lambda g: g.send([tensor], peer_side, tag)))
        return work

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> P2PWork:
        """Receive into ``tensor`` from group rank ``src``."""
        self._check_peer(src, "receive from")
        self._claim(src, tag)
        work = P2PWork(f"receive from rank {src}", tensor)
        peer_side = 1 - self._side(src)
        self._peer(src).put(lambda group: self._issue(group, work, lambda g: g.recv([tensor], peer_side, tag), src))
        return work

    def recv_any(self, tensor: torch.Tensor, tag: int) -> P2PWork:
        """Receive into ``tensor`` from the rank whose message reached this rank's inbox first."""
        work = P2PWork("receive from any rank", tensor)
        with self._lock:
            if self._any is None:
                self._any = _Peer(lambda: None, f"accord-p2p-any-{self._key}")
        self._any.put(lambda _: self._receive_any(work, tensor, tag))
        return work

    def close(self) -> None:
        """End the links' threads (their groups go with them)."""
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
            any_peer, self._any = self._any, None
        for peer in peers + ([any_peer] if any_peer else []):
            peer.close()

    # --- helpers --------------------------------------------------------------------------------

    def _store(self) -> dist.Store:
        return engine.runtime().store

    def _side(self, other: int) -> int:
        """This rank's index in its two-rank group with ``other`` (the lower rank is 0)."""
        return 0 if self._rank < other else 1

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < len(self._members) or peer == self._rank:
            raise ValueError(with_hint(f"cannot {what} rank {peer} in a group of {len(self._members)} "
                                       f"as rank {self._rank}", "pass another rank of the group"))

    def _peer(self, other: int) -> _Peer:
        with self._lock:
            peer = self._peers.get(other)
            if peer is None:
                low, high = sorted((self._rank, other))
                side = self._side(other)
                prefix = f"{self._key}/pair/{low}-{high}"

                def make_group() -> Any:
                    store = dist.PrefixStore(prefix, self._store())
                    return dist.ProcessGroupGloo(store, side, 2, self._timeout)

                peer = self._peers[other] = _Peer(make_group, f"accord-p2p-{self._key}-{other}")
            return peer

    def _claim(self, src: int, tag: int) -> None:
        """Count a receive from ``src``: a receive from any source skips as many of ``src``'s
        inbox entries (their messages are taken already)."""
        with self._lock:
            self._claimed[(src, tag)] = self._claimed.get((src, tag), 0) + 1

    @staticmethod
    def _issue(group: Any, work: P2PWork, op: Callable[[Any], Any], source: int = -1) -> None:
        if isinstance(group, BaseException):
            work.finish(CollectiveError(with_hint(f"{work._what}: the link could not be made: {group}",
                                                  "check that the peer makes the matching call")))
            return
        try:
            gloo_work = op(group)
        except Exception as exc:  # noqa: BLE001 (handed to the waiter)
            work.finish(exc)
            return
        threading.Thread(target=_complete, args=(gloo_work, work, source), daemon=True).start()

    def _receive_any(self, work: P2PWork, tensor: torch.Tensor, tag: int) -> None:
        store = self._store()
        while True:  # the first entry whose message no receive has taken yet
            at = self._cursor.get(tag, 0) + 1
            self._cursor[tag] = at
            key = f"{self._key}/inbox/{self._rank}/{tag}/{at}"
            try:
                store.wait([key], self._timeout)
                src = int(store.get(key))
            except Exception as exc:  # noqa: BLE001 (handed to the waiter)
                work.finish(CollectiveError(with_hint(f"receive from any rank: no message arrived: {exc}",
                                                      "a rank must send to this one")))
                return
            with self._lock:
                passed = self._passed[(src, tag)] = self._passed.get((src, tag), 0) + 1
                taken = passed <= self._claimed.get((src, tag), 0)
            if not taken:
                break
        inner = self.recv(tensor, src, tag)
        try:
            inner.wait()
            work.finish(None, src)
        except Exception as exc:  # noqa: BLE001
            work.finish(exc)


def _complete(gloo_work: Any, work: P2PWork, source: int) -> None:
    try:
        gloo_work.wait()
        work.finish(None, source)
    except Exception as exc:  # noqa: BLE001 (handed to the waiter)
        work.finish(exc)
