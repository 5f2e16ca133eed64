"""The ``shm`` backend: collectives through shared memory among ranks on one host (CPU tensors).

``ShmBackend().create(context)`` is collective over the members, who meet through their
context's store (:mod:`accord.comm.groups`):

1. members on different hosts (the job's host names) make every member raise BackendError; the
   members exchange whether each has a usable futex;
2. the set's first rank (the leader) chooses the settings (slot size, sync, reduction split)
   and creates the segment, then publishes the settings, the segment's path and a random
   token (or its error) to every member, so members never disagree about settings;
3. members map the segment and check the token (a same-named file elsewhere does not pass),
   publish their pid, and exchange whether they succeeded; then every member unlinks the name
   (whoever is first), so no file outlives the setup, even if ranks are killed later.

The data path is in :mod:`accord.comm.shm.communicator`, the waiting in
:mod:`accord.comm.shm.sync`, the segment layout in :mod:`accord.comm.shm.segment`.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from accord.comm.backend import Backend
from accord.comm.groups import GroupContext
from accord.comm.settings import CommSettings, shm_chunk_bytes
from accord.comm.shm import segment as shm_segment
from accord.comm.shm.communicator import ShmCommunicator
from accord.comm.shm.segment import Layout
from accord.comm.shm.sync import FutexBarrier, GlooBarrier, PeerWatch, futex, process_start_time
from accord.errors import BackendError, with_hint

__all__ = ["ShmBackend", "ShmCommunicator"]

DEFAULT_SPIN_S = 50e-6
_SYNCS = ("auto", "futex", "gloo")
# status, sync, chunk, direct_max_ranks, split_min_bytes, token, len(path), len(error)
_OFFER = struct.Struct("<BBxxxxxxqqq16sHH")
_OFFER_BYTES = 2048


@dataclass
class _Offer:
    """What the leader tells every rank: the settings and the segment (or why there is none)."""

    ok: bool
    sync: str
    chunk: int
    direct_max_ranks: int
    split_min_bytes: int
    path: str = ""
    token: bytes = bytes(16)
    error: str = ""


class ShmBackend(Backend):
    """A Backend whose communicators share memory; every member must run on one host.

    Args:
        hostnames: host of every global rank (default: each rank's ACCORD_HOSTNAME, else
            ``socket.gethostname()``, exchanged at init).
        chunk_bytes: slot size (default ACCORD_SHM_CHUNK_BYTES); the segment holds
            ``2 * (members + 1)`` slots.
        sync: "futex" (Linux), "gloo" (a barrier on a Gloo group of the members) or "auto"
            (futex where every member has one).
        spin_s: how long a waiting rank polls before it sleeps in the kernel.
        direct_max_ranks: up to this many members, every rank reduces whole chunks itself
            (fewest phases); above it, reductions of at least ``split_min_bytes`` are split
            across ranks (less work per rank, one more phase).

    The set's first rank's ``chunk_bytes``, ``sync``, ``direct_max_ranks`` and
    ``split_min_bytes`` apply to every member.
    """

    name = "shm"
    device_types = frozenset({"cpu"})

    def __init__(self, hostnames: Sequence[str] | None = None, chunk_bytes: int | None = None,
                 sync: str = "auto", spin_s: float = DEFAULT_SPIN_S, direct_max_ranks: int = 3,
                 split_min_bytes: int = 64 * 1024) -> None:
        if sync not in _SYNCS:
            raise BackendError(with_hint(f"unknown shm sync {sync!r}; known: {', '.join(_SYNCS)}",
                                         "pass sync='auto' (futex where available, else gloo)"))
        self._hostnames = list(hostnames) if hostnames is not None else None
        self._chunk_bytes = chunk_bytes
        self._sync = sync
        self._spin_s = spin_s
        self._direct_max_ranks = direct_max_ranks
        self._split_min_bytes = split_min_bytes

    def create(self, context: GroupContext) -> ShmCommunicator:
        """Make this rank's communicator over ``context.members`` (collective over the members).

        Raises:
            BackendError: the members span hosts, or the segment cannot be created or mapped (on
                every member alike).
        """
        members, me = context.members, context.rank
        settings = CommSettings.from_config()
        hosts = self._hostnames if self._hostnames is not None else context.hostnames
        _check_one_host(members, hosts)
        futex_ok = [flag == b"1" for flag in
                    context.allgather_bytes("futex", b"1" if futex() is not None else b"0")]
        leader = members[0]
        buffer = None
        mine = None
        if me == leader:
            mine, buffer = self._make_offer(members, all(futex_ok))
        try:
            offer = _decode_offer(context.broadcast_bytes("offer", _encode_offer(mine), 0))
        except BaseException:
            if mine is not None and mine.path:
                shm_segment.unlink_quietly(mine.path)
            raise
        if not offer.ok:
            raise BackendError(offer.error)
        layout = Layout(len(members), offer.chunk)
        group = None
        problem = ""
        try:
            if offer.sync == "gloo":
                group = context.gloo_group()
            if me != leader:
                try:
                    buffer = shm_segment.attach_segment(offer.path, offer.token, layout)
                except (OSError, BackendError) as exc:
                    problem = str(exc).splitlines()[0]
            if buffer is not None:
                shm_segment.write_identity(buffer, layout, members.index(me), os.getpid(),
                                           process_start_time(os.getpid()))
            mapped = context.allgather_bytes("mapped", b"0" if buffer is None else b"1")
            failed = [members[i] for i, ok in enumerate(mapped) if ok != b"1"]
        finally:
            shm_segment.unlink_quietly(offer.path)  # whoever is first; the mappings stay valid
        if failed:
            if buffer is not None:
                buffer.close()
            raise BackendError(with_hint(
                f"ranks {failed} could not map the shared-memory segment {offer.path} created by "
                f"rank {leader}" + (f"; here (rank {me}): {problem}" if problem else ""),
                "every member of an shm communicator must run on the same host and see the same "
                "/dev/shm (containers: --ipc=host); otherwise use the gloo backend"))
        return self._communicator(members, me, buffer, layout, offer, group, settings.collective_timeout)

    def _make_offer(self, members: tuple[int, ...], futex_everywhere: bool) -> tuple[_Offer, Any]:
        """The leader's part: choose the settings, create the segment; errors go into the offer."""
        chunk = int(self._chunk_bytes or shm_chunk_bytes())
        chunk = max(64 * len(members), -(-chunk // 64) * 64)  # alltoall needs 1 piece per rank
        sync = self._sync if self._sync != "auto" else ("futex" if futex_everywhere else "gloo")
        offer = _Offer(True, sync, chunk, self._direct_max_ranks, self._split_min_bytes)
        if sync == "futex" and not futex_everywhere:
            offer.ok, offer.error = False, with_hint(
                "sync='futex' was asked of the shm backend, but some members have no usable futex",
                "pass sync='auto' (futex where available, else gloo)")
            return offer, None
        try:
            offer.path, offer.token, buffer = shm_segment.create_segment(Layout(len(members), chunk))
        except BackendError as exc:
            offer.ok, offer.error = False, str(exc)
            return offer, None
        return offer, buffer

    def _communicator(self, members: tuple[int, ...], me: int, buffer: Any, layout: Layout,
                      offer: _Offer, group: Any, timeout: float) -> ShmCommunicator:
        index = members.index(me)
        if offer.sync == "gloo":
            barrier: Any = GlooBarrier(group)
        else:
            peers = [(members[i], *shm_segment.read_identity(buffer, layout, i))
                     for i in range(len(members)) if i != index]
            barrier = FutexBarrier(buffer, shm_segment.COUNTER_OFFSET, shm_segment.ABORT_OFFSET,
                                   len(members), members, index, timeout,
                                   self._spin_s, PeerWatch(peers))
        return ShmCommunicator(members, index, buffer, layout, barrier, offer.direct_max_ranks,
                               offer.split_min_bytes, offer.path)


def _check_one_host(members: tuple[int, ...], hosts: Sequence[str]) -> None:
    seen = {hosts[r] for r in members}
    if len(seen) > 1:
        where = ", ".join(f"rank {r} on {hosts[r]!r}" for r in members)
        raise BackendError(with_hint(
            f"the shm backend needs every member on one host, but ranks {list(members)} span "
            f"{len(seen)} hosts: {where}",
            "use shm for the ranks of one host (e.g. the local process set) and gloo or mpi "
            "across hosts"))


def _encode_offer(offer: _Offer | None) -> bytes:
    """The leader's offer as bytes (no pickle: the store is shared by the job)."""
    if offer is None:
        return b""
    path, error = offer.path.encode(), offer.error.encode()[:_OFFER_BYTES // 2]
    return _OFFER.pack(int(offer.ok), _SYNCS.index(offer.sync), offer.chunk, offer.direct_max_ranks,
                       offer.split_min_bytes, offer.token, len(path), len(error)) + path + error


def _decode_offer(raw: bytes) -> _Offer:
    ok, sync, chunk, direct, split, token, npath, nerror = _OFFER.unpack_from(raw)
    at = _OFFER.size
    return _Offer(bool(ok), _SYNCS[sync], chunk, direct, split, raw[at:at + npath].decode(), token,
                  raw[at + npath:at + npath + nerror].decode(errors="replace"))
