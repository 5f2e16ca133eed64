"""Output of workers that write to their inherited console themselves (``accord.spawn`` and
``accord.run`` workers, which no launcher pipes): optional per-rank files and line prefixes.

:class:`ConsoleTee` works below Python (``os.dup2`` on descriptors 1 and 2), so output from C
extensions and child processes is caught too. Each stream goes through a pipe to a thread that
writes the bytes unchanged to ``folder/stdout`` (``stderr``) and to the console, there as whole
lines prefixed ``[rank]<stdout>:`` when a rank is given — accordrun's and horovod.run's console
format, which also keeps the ranks' lines from being cut into each other.
"""
from __future__ import annotations

import os
import threading
from typing import BinaryIO

from accord.owned_files import open_for_writing
from accord.run.processes.output import LineSplitter, format_line


class ConsoleTee:
    """Copies descriptors 1 and 2 into ``folder/stdout`` and ``folder/stderr`` (when ``folder``
    is given) while still writing them to the console they pointed at (prefixed with ``rank``'s
    ``[rank]<stream>:`` when given). :meth:`close` flushes and waits for the copies; call it
    before ``os._exit``."""

    def __init__(self, folder: str | None, rank: int | None = None) -> None:
        copies: dict[str, BinaryIO | None] = {"stdout": None, "stderr": None}
        if folder is not None:  # both opened before the console is redirected: either may be refused
            base, rank_dir = os.path.split(os.path.normpath(folder))
            os.makedirs(base or ".", exist_ok=True)  # the folder named: made as given
            try:
                for name in copies:
                    copies[name] = open_for_writing(base or ".", [rank_dir, name], "output_filename", buffering=0)
            except BaseException:
                for copy in copies.values():
                    if copy is not None:
                        copy.close()
                raise
        self._threads: list[threading.Thread] = []
        self._restore: list[tuple[int, int]] = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            console = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            copy = copies[name]
            prefix = None if rank is None else (rank, name)
            thread = threading.Thread(target=_pump, args=(read_end, console, copy, prefix),
                                      name=f"accord-tee-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
            self._restore.append((fd, console))

    def close(self) -> None:
        """Put the console back on 1 and 2 (ending the pipes) and wait for the copies to finish."""
        for fd, console in self._restore:
            os.dup2(console, fd)  # the pipe's last write end closes: its pump sees EOF
        for thread in self._threads:
            thread.join(5.0)
        for _, console in self._restore:
            os.close(console)
        self._restore.clear()


def _pump(read_end: int, console: int, copy: BinaryIO | None, prefix: tuple[int, str] | None) -> None:
    splitter = LineSplitter() if prefix is not None else None
    while True:
        chunk = os.read(read_end, 65536)
        if copy is not None and chunk:
            copy.write(chunk)
        if splitter is None:
            _write(console, chunk)
        else:
            lines = splitter.feed(chunk) if chunk else splitter.close()
            assert prefix is not None
            _write(console, "".join(format_line(prefix[0], prefix[1], line) for line in lines).encode())
        if not chunk:
            break
    if copy is not None:
        copy.close()
    os.close(read_end)


def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the console went away: the file still gets everything
        pass
