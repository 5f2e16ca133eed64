"""Where the members of a new communicator meet: a store only they use, private library groups, and
small exchanges among them.

A :class:`~accord.comm.backend.Backend` builds each communicator from a :class:`GroupContext`, on the
members only: ranks outside the set take no part, as with torch's ``new_group`` on a process group
backend, so a set can be made by its members alone (a ``torch.distributed`` sub-group) or by every
rank of the job (Horovod's ``add_process_set``) alike. Nothing here needs torch.distributed's
default process group: library groups are built directly on the store (``ProcessGroupGloo(store,
rank, size, timeout)``, as torch does inside ``new_group``), so the engine works under any default
group, accord's own included.

Every context has a key of its own (its store is the job store under ``accord/comm/<key>/``); the
session makes keys that the members agree on without talking (the set's id and the device kind).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Sequence

from accord.errors import BackendError, with_hint

if TYPE_CHECKING:  # torch is imported only where a group is built: accord.comm stays torch-free
    import torch.distributed as dist


@dataclass(frozen=True)
class GroupContext:
    """What one communicator's members share while it is built.

    Args:
        store: the job's store (already scoped to this init); keys go under ``accord/comm/<key>/``.
        key: unique among the communicators the job builds (the members agree on it).
        members: sorted global ranks of the communicator; this process is one of them.
        rank: this process's global rank.
        hostnames: the host of every global rank.
        timeout: seconds a collective (and this setup) may take.
    """

    store: dist.Store = field(repr=False)
    key: str
    members: tuple[int, ...]
    rank: int
    hostnames: tuple[str, ...] = field(repr=False)
    timeout: float

    def __post_init__(self) -> None:
        if self.rank not in self.members:
            raise ValueError(with_hint(f"rank {self.rank} builds a communicator over {list(self.members)}, "
                                       "which it is not a member of",
                                       "only the members of a set build its communicators"))

    @property
    def index(self) -> int:
        """This process's rank among the members."""
        return self.members.index(self.rank)

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.members)

    @property
    def private_store(self) -> dist.Store:
        """The store under this communicator's own prefix (the members' meeting place)."""
        import torch.distributed as dist

        return dist.PrefixStore(f"accord/comm/{self.key}", self.store)

    def sub(self, members: Sequence[int], key: str) -> "GroupContext":
        """A context for another communicator of this job (e.g. a host's part of a hierarchy)."""
        return GroupContext(self.store, f"{self.key}/{key}", tuple(members), self.rank, self.hostnames,
                            self.timeout)

    def gloo_group(self, tag: str = "gloo") -> dist.ProcessGroup:
        """A Gloo process group over the members, private to this communicator.

        Raises:
            BackendError: this torch has no Gloo.
        """
        import torch.distributed as dist

        if not dist.is_gloo_available():
            raise BackendError(with_hint("this torch build has no Gloo",
                                         "install a torch build with Gloo, or choose another CPU backend"))
        store = dist.PrefixStore(tag, self.private_store)
        return dist.ProcessGroupGloo(store, self.index, self.size, timedelta(seconds=self.timeout))

    def nccl_group(self, tag: str = "nccl") -> dist.ProcessGroup:
        """An NCCL process group over the members, private to this communicator.

        Raises:
            BackendError: this torch has no NCCL.
        """
        import torch.distributed as dist

        if not dist.is_nccl_available():
            raise BackendError(with_hint("this torch build has no NCCL",
                                         "install a CUDA build of torch with NCCL, or set ACCORD_GPU_BACKEND=host"))
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=self.timeout)
        store = dist.PrefixStore(tag, self.private_store)
        return dist.ProcessGroupNCCL(store, self.index, self.size, options)

    def allgather_bytes(self, tag: str, data: bytes) -> list[bytes]:
        """Every member's ``data`` in member order, through the store (setup traffic only).

        Raises:
            BackendError: a member did not publish within the timeout (the missing ones are named).
        """
        store = self.private_store
        store.set(f"{tag}/{self.index}", data)
        keys = [f"{tag}/{i}" for i in range(self.size)]
        self._wait(store, keys, tag)
        return [bytes(v) for v in store.multi_get(keys)]

    def broadcast_bytes(self, tag: str, data: bytes | None, root: int) -> bytes:
        """Member ``root``'s ``data`` on every member (``data`` is ignored elsewhere).

        Raises:
            BackendError: the root did not publish within the timeout.
        """
        store = self.private_store
        key = f"{tag}/root"
        if self.index == root:
            store.set(key, data or b"")
        self._wait(store, [key], tag)
        return bytes(store.get(key))

    def _wait(self, store: dist.Store, keys: list[str], tag: str) -> None:
        try:
            store.wait(keys, timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            try:
                missing = [self.members[i] for i, k in enumerate(keys) if not store.check([k])]
            except RuntimeError:
                missing = []
            raise BackendError(with_hint(
                f"rank {self.rank}: setting up communicator {self.key!r} over ranks {list(self.members)}, "
                f"ranks {missing or '(unknown)'} did not answer {tag!r} within {self.timeout:g}s",
                "every member of a process set must create it (the same calls in the same order); "
                "check the missing ranks' logs")) from exc

