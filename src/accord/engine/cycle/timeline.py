"""A chrome://tracing (Trace Event Format) timeline of the engine's phases per tensor name.

One row (tid) per name under one process (pid = rank): NEGOTIATE_<OP> from submit until every rank agreed,
WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER, the collective itself (ALLREDUCE, ...), MEMCPY_OUT_FUSION_BUFFER.
Events are complete ("X") events buffered in memory (as tuples) by the engine thread; a writer thread
formats them and appends them to the file about 20 times a second, so a running job's timeline shows
each finished collective within ~50 ms while the engine thread never formats or writes.
The first event (``process_name``) carries ``start_time_since_epoch_in_micros``, the wall-clock
time of ts 0, as Horovod's timeline does.
:meth:`Timeline.close` writes the rest and the closing bracket, after which the file is valid JSON
(before that, chrome://tracing still reads it: it tolerates a missing ``]}``).
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from accord.owned_files import open_for_writing

_WRITE_SECONDS = 0.05


class Timeline:
    """Collects phase spans and writes them to ``path``.

    Times are ``time.monotonic()`` seconds; they are written relative to the timeline's start
    in microseconds. Thread-safe (the engine thread records; a user thread may close).
    """

    def __init__(self, path: str, rank: int = 0, mark_cycles: bool = False) -> None:
        self.path = path
        self.rank = rank
        self.mark_cycles = mark_cycles
        self._start = time.monotonic()
        # Wall-clock time of ts 0, as Horovod's timeline records it: lets tools line up the
        # relative timestamps of files from different runs or hosts.
        start_epoch_us = time.time_ns() // 1000
        self._tids: dict[str, int] = {}
        self._pending: list = []  # event dicts and span tuples, formatted by the writer thread
        self._lock = threading.Lock()  # guards _pending and _tids (engine thread vs writer)
        self._write_lock = threading.Lock()  # one writer of the file at a time (writer vs close)
        self._first = True
        folder, name = os.path.split(path)
        self._file = open_for_writing(folder or ".", [name], "the timeline file", mode="w", encoding="utf-8")
        self._file.write('{"traceEvents": [\n')
        self._emit({"name": "process_name", "ph": "M", "pid": rank,
                    "args": {"name": f"rank {rank}", "start_time_since_epoch_in_micros": start_epoch_us}})
        self._stopping = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="accord-timeline", daemon=True)
        self._writer.start()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._file is None

    def _us(self, t: float) -> float:
        return round((t - self._start) * 1e6, 1)

    def _emit(self, event: dict[str, Any]) -> None:
        self._pending.append(event)

    def _format(self, phase: str, tid: int, start: float, end: float, args: dict | None) -> str:
        event = {"name": phase, "ph": "X", "pid": self.rank, "tid": tid, "ts": self._us(start),
                 "dur": round(max(end - start, 0.0) * 1e6, 1)}
        if args:
            event["args"] = args
        return json.dumps(event, separators=(",", ":"))

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                        "args": {"name": name}})
        return tid

    def span(self, name: str, phase: str, start: float, end: float, args: dict | None = None) -> None:
        """Record that ``name`` spent [start, end] in ``phase``."""
        with self._lock:
            if self._file is None:
                return
            # The engine thread only appends a tuple here: the writer thread formats it.
            self._pending.append((phase, self._tid(name), start, end, args))

    def cycle(self, t: float) -> None:
        """Mark the start of an engine cycle (only when ``mark_cycles``)."""
        if not self.mark_cycles:
            return
        with self._lock:
            if self._file is not None:
                self._emit({"name": "CYCLE_START", "ph": "i", "s": "p", "pid": self.rank, "tid": 0,
                            "ts": self._us(t)})

    def _write_loop(self) -> None:
        while not self._stopping.wait(_WRITE_SECONDS):
            self._write_pending()

    def _write_pending(self) -> None:
        """Append what the engine recorded since the last write (formatted here, off its thread)."""
        with self._write_lock:
            with self._lock:
                events, self._pending = self._pending, []
            if self._file is None or not events:
                return
            text = ",\n".join(json.dumps(e, separators=(",", ":")) if isinstance(e, dict)
                               else self._format(*e) for e in events)
            self._file.write(text if self._first else ",\n" + text)
            self._first = False
            self._file.flush()

    def close(self) -> None:
        """Write everything and the closing ``]}``; idempotent."""
        self._stopping.set()
        if self._writer is not threading.current_thread():
            self._writer.join()
        self._write_pending()
        with self._write_lock, self._lock:
            if self._file is None:
                return
            self._file.write("\n]}\n")
            self._file.close()
            self._file = None
