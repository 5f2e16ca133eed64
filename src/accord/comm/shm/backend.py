"""The ``shm`` backend: collectives through shared memory among ranks on one host (CPU tensors).

``ShmBackend().create(ranks)`` is collective over every rank of the job, like Gloo's
``new_group``, and runs over torch.distributed's default process group (which must use Gloo
for CPU tensors):

1. every rank allgathers its host name (ACCORD_HOSTNAME, else ``socket.gethostname()``) and
   whether it has a usable futex; members on different hosts make every rank raise
   BackendError;
2. the set's first rank (the leader) chooses the settings (slot size, sync, reduction split)
   and creates the segment, then broadcasts the settings, the segment's path and a random
   token (or its error) to every rank, so members never disagree about settings;
3. members map the segment and check the token (a same-named file elsewhere does not pass),
   publish their pid, and allgather whether they succeeded; then every member unlinks the name
   (whoever is first), so no file outlives the setup, even if ranks are killed later.

The data path is in :mod:`accord.comm.shm.communicator`, the waiting in
:mod:`accord.comm.shm.sync`, the segment layout in :mod:`accord.comm.shm.segment`.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from accord.comm.backend import Backend
from accord.comm.base_communicator import normalize_ranks
from accord.comm.settings import CommSettings, shm_chunk_bytes
from accord.comm.shm import segment as shm_segment
from accord.comm.shm.communicator import ShmCommunicator
from accord.comm.shm.segment import Layout
from accord.comm.shm.sync import FutexBarrier, GlooBarrier, PeerWatch, futex, process_start_time
from accord.errors import BackendError, with_hint

__all__ = ["ShmBackend", "ShmCommunicator"]

DEFAULT_SPIN_S = 50e-6
_SYNCS = ("auto", "futex", "gloo")
_HOST_RECORD = 256
# status, sync, chunk, direct_max_ranks, split_min_bytes, token, len(path), len(error)
_OFFER = struct.Struct("<BBxxxxxxqqq16sHH")
_OFFER_BYTES = 2048
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
            ``socket.gethostname()``, gathered over the default group).
        chunk_bytes: slot size (default ACCORD_SHM_CHUNK_BYTES); the segment holds
            ``2 * (members + 1)`` slots.
        sync: "futex" (Linux), "gloo" (``dist.barrier`` on a group of the members) or "auto"
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

    def create(self, ranks: Sequence[int]) -> ShmCommunicator | None:
        """Make a communicator over ``ranks`` (collective over every rank; None on non-members).

        Raises:
            BackendError: torch.distributed is not initialized, the members span hosts, or the
                segment cannot be created or mapped (on every rank alike).
            ValueError: ``ranks`` is empty, has duplicates or ranks outside the job.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise BackendError(with_hint(
                "the shm backend needs torch.distributed's default process group to set up its "
                "segment, and it is not initialized",
                "call accord's init (hvd.init()) or torch.distributed.init_process_group() first"))
        world, me = dist.get_world_size(), dist.get_rank()
        members = normalize_ranks(ranks, world)
        settings = CommSettings.from_config()
        futex_ok, hosts = _gather_hosts(world, settings.hostname)
        if self._hostnames is not None:
            hosts = self._hostnames
        _check_one_host(members, hosts)
        leader = members[0]
        buffer = None
        mine = None
        if me == leader:
            mine, buffer = self._make_offer(members, all(futex_ok[r] for r in members))
        try:
            offer = _broadcast_offer(mine, leader)
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
            if offer.sync == "gloo":  # new_group is collective over the whole job, members or not
                timeout = timedelta(seconds=settings.collective_timeout)
                group = dist.new_group(list(members), timeout=timeout, backend="gloo")
            if me in members and me != leader:
                try:
                    buffer = shm_segment.attach_segment(offer.path, offer.token, layout)
                except (OSError, BackendError) as exc:
                    problem = str(exc).splitlines()[0]
            if buffer is not None:
                shm_segment.write_identity(buffer, layout, members.index(me), os.getpid(),
                                           process_start_time(os.getpid()))
            failed = _gather_failures(world, me in members and buffer is None)
        finally:
            if me in members:
                shm_segment.unlink_quietly(offer.path)  # whoever is first; the mappings stay valid
        if failed:
            if buffer is not None:
                buffer.close()
            raise BackendError(with_hint(
                f"ranks {failed} could not map the shared-memory segment {offer.path} created by "
                f"rank {leader}" + (f"; here (rank {me}): {problem}" if problem else ""),
                "every member of an shm communicator must run on the same host and see the same "
                "/dev/shm (containers: --ipc=host); otherwise use the gloo backend"))
        if me not in members:
            return None
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


def _gather_hosts(world: int, hostname: str | None) -> tuple[list[bool], list[str]]:
    """Every rank's futex support and host name (``hostname``, else the system's), over the default group."""
    name = (hostname or socket.gethostname()).encode()[:_HOST_RECORD - 2]
    mine = torch.zeros(_HOST_RECORD, dtype=torch.uint8)
    mine[0] = 1 if futex() is not None else 0
    mine[1] = len(name)
    if name:
        mine[2:2 + len(name)] = torch.frombuffer(bytearray(name), dtype=torch.uint8)
    table = torch.empty(world * _HOST_RECORD, dtype=torch.uint8)
    _all_gather_single(table, mine)
    rows = table.view(world, _HOST_RECORD).tolist()
    return [bool(r[0]) for r in rows], [bytes(r[2:2 + r[1]]).decode(errors="replace") for r in rows]


def _check_one_host(members: tuple[int, ...], hosts: Sequence[str]) -> None:
    seen = {hosts[r] for r in members}
    if len(seen) > 1:
        where = ", ".join(f"rank {r} on {hosts[r]!r}" for r in members)
        raise BackendError(with_hint(
            f"the shm backend needs every member on one host, but ranks {list(members)} span "
            f"{len(seen)} hosts: {where}",
            "use shm for the ranks of one host (e.g. the local process set) and gloo or mpi "
            "across hosts"))


def _broadcast_offer(offer: _Offer | None, leader: int) -> _Offer:
    """Send the leader's offer to every rank (bytes over the default group: no pickle)."""
    data = torch.zeros(_OFFER_BYTES, dtype=torch.uint8)
    if offer is not None:
        path, error = offer.path.encode(), offer.error.encode()[:_OFFER_BYTES // 2]
        blob = _OFFER.pack(int(offer.ok), _SYNCS.index(offer.sync), offer.chunk, offer.direct_max_ranks,
                           offer.split_min_bytes, offer.token, len(path), len(error)) + path + error
        data[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    dist.broadcast(data, src=leader)
    raw = bytes(data.tolist())
    ok, sync, chunk, direct, split, token, npath, nerror = _OFFER.unpack_from(raw)
    at = _OFFER.size
    return _Offer(bool(ok), _SYNCS[sync], chunk, direct, split, raw[at:at + npath].decode(), token,
                  raw[at + npath:at + npath + nerror].decode(errors="replace"))


def _gather_failures(world: int, failed: bool) -> list[int]:
    """Global ranks that report ``failed`` (a member that could not map the segment)."""
    table = torch.empty(world, dtype=torch.uint8)
    _all_gather_single(table, torch.tensor([1 if failed else 0], dtype=torch.uint8))
    return [r for r, bad in enumerate(table.tolist()) if bad]
