"""Worker output: ``[rank]<stdout>:`` prefixes on the console, raw copies in per-rank files.

One thread ("accord-output") reads every worker pipe through a selector. Bytes are decoded
incrementally as UTF-8 (a character split across reads is kept whole; invalid bytes become
U+FFFD), split into lines at ``\\n``, ``\\r\\n`` and ``\\r`` (so progress bars that redraw with
``\\r`` show up as they happen instead of as one endless line), and a last line without a newline
is still printed when the stream ends. Per-rank files (``DIR/rank.N/stdout`` and ``stderr``)
receive the bytes exactly as the worker wrote them (``rank.03`` in a job of 16 ranks: horovodrun's
zero-padded names, which sort in rank order). ``--ranks-filter`` limits the console only.

Parameter servers are registered under a text key (``server0``), printed ``[server0]<stderr>:``
and written to ``DIR/server.0/``; ``--ranks-filter`` does not hide them (it names worker ranks).
"""
from __future__ import annotations

import codecs
import collections
import os
import selectors
import threading
import time
from typing import BinaryIO, Iterable, Union

from accord.owned_files import open_for_writing
from accord.run.processes.rank_files import rank_dirname

Key = Union[int, str]  # a worker's rank, or a text label such as "server0"


def _default_dirname(key: Key, size: int) -> str:
    return rank_dirname(key, size) if isinstance(key, int) else f"rank.{key}"

_MAX_PENDING = 64 * 1024  # a "line" longer than this is printed in pieces


class LineSplitter:
    """Incremental UTF-8 decoding and line splitting for one stream."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> list[str]:
        """Add bytes; return the complete lines (without terminators)."""
        return self._split(self._pending + self._decoder.decode(data), final=False)

    def close(self) -> list[str]:
        """End of stream: return what is left, including a last line without a newline."""
        return self._split(self._pending + self._decoder.decode(b"", final=True), final=True)

    def _split(self, text: str, final: bool) -> list[str]:
        lines: list[str] = []
        start = 0
        i = 0
        n = len(text)
        while i < n:
            ch = text[i]
            if ch == "\n":
                lines.append(text[start:i])
                start = i + 1
            elif ch == "\r":
                if i + 1 == n and not final:
                    break  # a "\r\n" may be split across reads: decide when more arrives
                segment = text[start:i]
                if i + 1 < n and text[i + 1] == "\n":
                    lines.append(segment)
                    i += 1
                elif segment:  # a redraw; an empty one (leading "\r") is not a line
                    lines.append(segment)
                start = i + 1
            i += 1
        rest = text[start:]
        if final:
            if rest.rstrip("\r"):
                lines.append(rest.rstrip("\r"))
            rest = ""
        elif len(rest) > _MAX_PENDING:
            lines.append(rest)
            rest = ""
        self._pending = rest
        return lines


def format_line(rank: Key, stream: str, line: str, prefix: bool = True, timestamp: float | None = None) -> str:
    """One console line: ``[0]<stdout>:text``, optionally preceded by a timestamp."""
    head = ""
    if timestamp is not None:
        millis = int((timestamp % 1) * 1000)
        head = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)) + f".{millis:03d} "
    if prefix:
        head += f"[{rank}]<{stream}>:"
    return f"{head}{line}\n"


class _Stream:
    def __init__(self, rank: Key, name: str, pipe: BinaryIO, tee: BinaryIO | None, sink: BinaryIO | None):
        self.rank, self.name, self.pipe, self.tee, self.sink = rank, name, pipe, tee, sink
        self.splitter = LineSplitter()


class OutputMux:
    """Reads every worker's stdout/stderr on one thread and routes the lines.

    Register all pipes with :meth:`add`, then :meth:`start`; :meth:`close` waits for the
    streams to end (or gives up after a timeout, when a leftover process holds a pipe open).
    """

    def __init__(
        self,
        console_out: BinaryIO | None,
        console_err: BinaryIO | None,
        *,
        prefix: bool = True,
        timestamps: bool = False,
        ranks_filter: Iterable[int] | None = None,
        output_dir: str | None = None,
        tail_lines: int = 30,
        size: int = 1,
    ) -> None:
        self._console = {"stdout": console_out, "stderr": console_err}
        self._prefix = prefix
        self._timestamps = timestamps
        self._filter = None if ranks_filter is None else frozenset(ranks_filter)
        self._output_dir = output_dir
        self._size = size  # the job's worker count: rank folders are padded to its width
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._tails: dict[Key, collections.deque[str]] = {}
        self._tail_lines = tail_lines
        self._open: dict[Key, int] = {}  # rank -> streams still open
        self._done: dict[Key, threading.Event] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="accord-output", daemon=True)
        self._stopping = False
        self._closed = False

    def open_files(self, rank: Key, dirname: str | None = None) -> dict[str, BinaryIO]:
        """With ``output_dir``: open ``rank``'s ``stdout`` and ``stderr`` files there (see
        :meth:`add`; before the process starts, so that a refused file starts nothing).

        Raises:
            ConfigError: a file or its folder is a link, or not this user's
                (:func:`accord.owned_files.open_for_writing`).
        """
        files: dict[str, BinaryIO] = {}
        if self._output_dir is None:
            return files
        folder = dirname or _default_dirname(rank, self._size)
        try:
            for name in ("stdout", "stderr"):
                files[name] = open_for_writing(self._output_dir, [folder, name], "--output-filename", buffering=0)
        except BaseException:
            for f in files.values():
                f.close()
            raise
        return files

    def add(self, rank: Key, stdout: BinaryIO | None, stderr: BinaryIO | None,
            dirname: str | None = None, files: dict[str, BinaryIO] | None = None) -> None:
        """Register a worker's pipes (before :meth:`start`).

        Args:
            rank: the worker's rank, or a text label (``"server0"``) for another process.
            dirname: its folder under ``output_dir`` (default ``rank.<rank>``, the rank padded
                with zeros to the width of the largest rank, as horovodrun names them).
            files: what :meth:`open_files` returned for it (opened here when not given).
        """
        if files is None:
            files = self.open_files(rank, dirname)
        self._tails[rank] = collections.deque(maxlen=self._tail_lines)
        self._done[rank] = threading.Event()
        opened = 0
        for name, pipe in (("stdout", stdout), ("stderr", stderr)):
            if pipe is None:
                if name in files:
                    files.pop(name).close()
                continue
            tee = files.get(name)
            shown = self._filter is None or not isinstance(rank, int) or rank in self._filter
            stream = _Stream(rank, name, pipe, tee, self._console[name] if shown else None)
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
            opened += 1
        self._open[rank] = opened
        if opened == 0:
            self._done[rank].set()

    def start(self) -> None:
        """Start the reader thread."""
        self._thread.start()

    def wait_rank(self, rank: Key, timeout: float) -> bool:
        """Wait until both of ``rank``'s streams ended; False on timeout."""
        return self._done[rank].wait(timeout)

    def stderr_tail(self, rank: Key) -> list[str]:
        """The last stderr lines of ``rank`` (no prefixes)."""
        with self._lock:
            return list(self._tails.get(rank, ()))

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for every stream to end, then stop reading and flush (idempotent)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        if self._thread.is_alive():
            for event in self._done.values():
                event.wait(max(0.0, deadline - time.monotonic()))
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(5.0)
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                self._drain(key.data)
                self._finish(key.data)
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # --- the reader thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping and len(self._selector.get_map()) > 1:
            for key, _ in self._selector.select(timeout=1.0):
                stream = key.data
                if stream is None:  # woken by close()
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._finish(stream)
                    continue
                if stream.tee is not None:
                    stream.tee.write(data)
                self._emit(stream, stream.splitter.feed(data))

    def _drain(self, stream: _Stream) -> None:
        """Read what is already in a pipe without waiting (used when giving up on it)."""
        while True:
            try:
                data = os.read(stream.pipe.fileno(), 65536)
            except OSError:
                return
            if not data:
                return
            if stream.tee is not None:
                stream.tee.write(data)
            self._emit(stream, stream.splitter.feed(data))

    def _finish(self, stream: _Stream) -> None:
        self._selector.unregister(stream.pipe.fileno())
        self._emit(stream, stream.splitter.close())
        if stream.tee is not None:
            stream.tee.close()
        stream.pipe.close()
        self._open[stream.rank] -= 1
        if self._open[stream.rank] == 0:
            self._done[stream.rank].set()

    def _emit(self, stream: _Stream, lines: list[str]) -> None:
        if not lines:
            return
        if stream.name == "stderr":
            with self._lock:
                self._tails[stream.rank].extend(lines)
        if stream.sink is None:
            return
        stamp = time.time() if self._timestamps else None
        text = "".join(format_line(stream.rank, stream.name, line, self._prefix, stamp) for line in lines)
        try:
            stream.sink.write(text.encode("utf-8", errors="replace"))
            stream.sink.flush()
        except (BrokenPipeError, ValueError):
            stream.sink = None  # the console went away (e.g. `| head`); keep draining the pipe
