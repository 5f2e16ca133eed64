"""Per-rank output files: horovodrun's ``--output-filename`` layout, and a tee for workers that
write to their inherited console themselves (``accord.spawn``/``accord.run`` workers).

The folder of rank ``r`` in a job of ``size`` ranks is ``rank.<r>`` with ``r`` zero-padded to
the width of the largest rank (``rank.03`` of 16 ranks), as horovodrun names them, so the
folders sort in rank order.
"""
from __future__ import annotations

import os
import threading
from typing import BinaryIO


def rank_dirname(rank: int, size: int) -> str:
    """``rank.<rank>`` padded to the width of ``size - 1`` (``rank_dirname(3, 16) == "rank.03"``)."""
    width = len(str(max(size - 1, 0)))
    return f"rank.{str(rank).zfill(width)}"


class ConsoleTee:
    """Copies this process's file descriptors 1 and 2 into ``folder/stdout`` and
    ``folder/stderr`` while still writing them to the console they pointed at.

    Works below Python (``os.dup2``), so output from C extensions and child processes is caught
    too. :meth:`close` flushes and waits for the copies; call it before ``os._exit``.
    """

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self._threads: list[threading.Thread] = []
        self._restore: list[tuple[int, int]] = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            console = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            copy = open(os.path.join(folder, name), "wb", buffering=0)
            thread = threading.Thread(target=_pump, args=(read_end, console, copy),
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


def _pump(read_end: int, console: int, copy: BinaryIO) -> None:
    with copy:
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            copy.write(chunk)
            try:
                while chunk:
                    chunk = chunk[os.write(console, chunk):]
            except OSError:  # the console went away: the file still gets everything
                pass
    os.close(read_end)
