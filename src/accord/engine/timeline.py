"""A chrome://tracing (Trace Event Format) timeline of the engine's phases per tensor name.

One row (tid) per name under one process (pid = rank): NEGOTIATE_<OP> from submit until every rank agreed,
WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER, the collective itself (ALLREDUCE, ...), MEMCPY_OUT_FUSION_BUFFER.
Events are complete ("X") events buffered in memory (as tuples, formatted later) and appended to the file at
most about once a second from the engine thread; :meth:`Timeline.close` writes the closing bracket, after
which the file is valid JSON (before that, chrome://tracing still reads it: it tolerates a missing ``]}``).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

_FLUSH_EVENTS = 2048
_FLUSH_SECONDS = 1.0


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
        self._tids: dict[str, int] = {}
        self._pending: list = []  # formatted strings, or span tuples formatted at flush
        self._lock = threading.Lock()
        self._last_flush = self._start
        self._first = True
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._file.write('{"traceEvents": [\n')
        self._emit({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._file is None

    def _us(self, t: float) -> float:
        return round((t - self._start) * 1e6, 1)

    def _emit(self, event: dict[str, Any]) -> None:
        self._pending.append(json.dumps(event, separators=(",", ":")))

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
            # Formatting waits for the flush: the engine thread only appends a tuple here.
            self._pending.append((phase, self._tid(name), start, end, args))

    def cycle(self, t: float) -> None:
        """Mark the start of an engine cycle (only when ``mark_cycles``)."""
        if not self.mark_cycles:
            return
        with self._lock:
            if self._file is not None:
                self._emit({"name": "CYCLE_START", "ph": "i", "s": "p", "pid": self.rank, "tid": 0,
                            "ts": self._us(t)})

    def maybe_flush(self, now: float | None = None) -> None:
        """Write buffered events if there are many or the last write is a second old."""
        now = time.monotonic() if now is None else now
        if len(self._pending) >= _FLUSH_EVENTS or (self._pending and now - self._last_flush >= _FLUSH_SECONDS):
            with self._lock:
                self._flush_locked(now)

    def _flush_locked(self, now: float) -> None:
        if self._file is None or not self._pending:
            return
        text = ",\n".join(e if isinstance(e, str) else self._format(*e) for e in self._pending)
        self._file.write(text if self._first else ",\n" + text)
        self._first = False
        self._pending.clear()
        self._file.flush()
        self._last_flush = now

    def close(self) -> None:
        """Write everything and the closing ``]}``; idempotent."""
        with self._lock:
            if self._file is None:
                return
            self._flush_locked(time.monotonic())
            self._file.write("\n]}\n")
            self._file.close()
            self._file = None
