"""The shared-memory segment of one ``shm`` communicator: its layout, creation and attachment.

The segment is a file in ``/dev/shm`` (tmpfs; a temporary directory where there is none) that the set's first
rank creates with a random name, mode 0600, and fills with ``posix_fallocate`` so that a full tmpfs fails here
with a clear error instead of a SIGBUS later. The other ranks map it, then every member unlinks the name
(whoever comes first): from then on the memory lives only as long as some rank maps it, so nothing is left in
``/dev/shm`` even when ranks are killed. Only a leader killed inside ``create``, before it shared the name, can
leave its ``accord-shm-<pid>-*`` file; accordrun and accord.spawn remove those of their workers once they have
exited (:func:`accord.worker_contract.remove_shm_segments`). Layout (every area aligned to 64 bytes, data
areas to 4096)::

    header   magic, token (proves that a rank mapped the segment its leader created), sizes
             the barrier counter and abort word, each on its own cache line
             one 128-byte record per rank: pid, process start time, per-bank op descriptors
    bank 0   ``size`` input slots of ``chunk`` bytes, then one result area of ``chunk`` bytes
    bank 1   the same (consecutive phases alternate banks: see accord.comm.shm.backend)
"""
from __future__ import annotations

import mmap
import os
import secrets
import struct
from dataclasses import dataclass

from accord.errors import BackendError, with_hint
from accord.worker_contract import SHM_SEGMENT_PREFIX, shm_segment_dir

MAGIC = b"accord-shm-v1\0\0\0"
_HEAD = struct.Struct("<16s16sQQ")  # magic, token, size, chunk
COUNTER_OFFSET = 64
ABORT_OFFSET = 128
_RECORDS = 256
_RECORD_BYTES = 128
_META = struct.Struct("<qqqqq")  # op descriptor: kind, dtype/op code, bytes, root, extra
META_COMPARED = 32  # ranks must agree on the first four fields; ``extra`` may differ


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class Layout:
    """Byte offsets inside a segment for ``size`` ranks and ``chunk``-byte slots."""

    size: int
    chunk: int

    @property
    def header(self) -> int:
        return _round_up(_RECORDS + _RECORD_BYTES * self.size, 4096)

    @property
    def bank_bytes(self) -> int:
        return (self.size + 1) * self.chunk

    @property
    def total(self) -> int:
        return self.header + 2 * self.bank_bytes

    def slot(self, bank: int, rank: int) -> int:
        """Offset of ``rank``'s input slot in ``bank``."""
        return self.header + bank * self.bank_bytes + rank * self.chunk

    def result(self, bank: int) -> int:
        """Offset of ``bank``'s result area."""
        return self.header + bank * self.bank_bytes + self.size * self.chunk

    def record(self, rank: int) -> int:
        return _RECORDS + _RECORD_BYTES * rank

    def meta(self, bank: int, rank: int) -> int:
        """Offset of ``rank``'s op descriptor for ops whose first chunk is in ``bank``."""
        return self.record(rank) + 16 + _META.size * bank


def write_identity(buffer: mmap.mmap, layout: Layout, rank: int, pid: int, start: int) -> None:
    """Publish this rank's process identity (for the peers' liveness checks)."""
    struct.pack_into("<qq", buffer, layout.record(rank), pid, start)


def read_identity(buffer: mmap.mmap, layout: Layout, rank: int) -> tuple[int, int]:
    """(pid, start time) that ``rank`` published."""
    return struct.unpack_from("<qq", buffer, layout.record(rank))


def write_meta(buffer: mmap.mmap, offset: int, kind: int, code: int, nbytes: int, root: int,
               extra: int) -> None:
    """Describe the op this rank is starting (checked by every rank after the first barrier)."""
    _META.pack_into(buffer, offset, kind, code, nbytes, root, extra)


def read_meta(buffer: mmap.mmap, offset: int) -> tuple[int, int, int, int, int]:
    """An op descriptor written by :func:`write_meta`."""
    return _META.unpack_from(buffer, offset)


def segment_dir() -> str:
    """Where segments are created: /dev/shm if usable, else the temporary directory."""
    return shm_segment_dir()


def _map(fd: int, nbytes: int) -> mmap.mmap:
    # MAP_POPULATE maps every page now: no page faults inside the first collectives.
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def create_segment(layout: Layout) -> tuple[str, bytes, mmap.mmap]:
    """Create, size and map a new segment; returns (path, token, mapping).

    Raises:
        BackendError: the file cannot be created or the file system lacks the space.
    """
    directory = segment_dir()
    # named after this process, so that its launcher can remove the file if it is killed first
    path = os.path.join(directory, f"{SHM_SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
    token = secrets.token_bytes(16)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise BackendError(with_hint(
            f"could not create the shared-memory segment {path}: {exc.strerror}",
            f"make {directory} writable for this user, or use the gloo backend")) from None
    try:
        try:
            os.posix_fallocate(fd, 0, layout.total)
        except OSError as exc:
            if exc.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: no fallocate here, size it plainly
                raise BackendError(with_hint(
                    f"could not reserve {layout.total} bytes for the shared-memory segment in "
                    f"{directory} ({layout.size} ranks x 2 banks of {layout.chunk}-byte slots): "
                    f"{exc.strerror}",
                    f"free space in {directory} (in Docker: --shm-size), or lower the slot size "
                    "(ACCORD_SHM_CHUNK_BYTES)")) from None
            os.ftruncate(fd, layout.total)
        buffer = _map(fd, layout.total)
    except BaseException:
        unlink_quietly(path)
        raise
    finally:
        os.close(fd)
    _HEAD.pack_into(buffer, 0, MAGIC, token, layout.size, layout.chunk)
    return path, token, buffer


def attach_segment(path: str, token: bytes, layout: Layout) -> mmap.mmap:
    """Map the segment the leader created and check that it is that segment.

    Raises:
        OSError: the file is missing or unreadable (e.g. the leader is on another host).
        BackendError: the file is not the leader's segment.
    """
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != layout.total:
            raise BackendError(with_hint(
                f"shared-memory segment {path} has {os.fstat(fd).st_size} bytes, expected {layout.total}",
                "the ranks of one shm communicator must run on one host and agree on "
                "ACCORD_SHM_CHUNK_BYTES"))
        buffer = _map(fd, layout.total)
    finally:
        os.close(fd)
    magic, seen, size, chunk = _HEAD.unpack_from(buffer, 0)
    if (magic, seen, size, chunk) != (MAGIC, token, layout.size, layout.chunk):
        buffer.close()
        raise BackendError(with_hint(
            f"{path} is not the shared-memory segment this communicator's first rank created",
            "the ranks of one shm communicator must run on one host and share /dev/shm "
            "(containers: --ipc=host)"))
    return buffer


def unlink_quietly(path: str) -> None:
    """Remove the segment's name if it still exists (the mappings stay valid)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
