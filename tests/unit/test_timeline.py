"""Timeline files: valid chrome://tracing JSON with the recorded phases."""
import json
import time

import pytest

from accord.engine.cycle.timeline import Timeline

pytestmark = pytest.mark.timeout(60)


def test_spans_become_complete_events_with_a_row_per_name(tmp_path):
    path = tmp_path / "tl.json"
    tl = Timeline(str(path), rank=0, mark_cycles=True)
    t0 = time.monotonic()
    tl.cycle(t0)
    tl.span("grad.a", "NEGOTIATE_ALLREDUCE", t0, t0 + 0.001)
    tl.span("grad.b", "ALLREDUCE", t0 + 0.001, t0 + 0.003)
    tl.span("grad.a", "ALLREDUCE", t0 + 0.001, t0 + 0.003)
    tl.close()
    tl.close()  # idempotent
    tl.span("late", "ALLREDUCE", t0, t0)  # ignored after close
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    threads = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert set(threads) == {"grad.a", "grad.b"} and threads["grad.a"] != threads["grad.b"]
    spans = [(e["name"], e["tid"], e["dur"]) for e in events if e["ph"] == "X"]
    assert spans == [("NEGOTIATE_ALLREDUCE", threads["grad.a"], 1000.0),
                     ("ALLREDUCE", threads["grad.b"], 2000.0),
                     ("ALLREDUCE", threads["grad.a"], 2000.0)]
    assert any(e["name"] == "CYCLE_START" and e["ph"] == "i" for e in events)
    assert all(e["pid"] == 0 for e in events)


def test_the_writer_thread_appends_events_while_the_timeline_is_open(tmp_path):
    path = tmp_path / "tl.json"
    tl = Timeline(str(path), rank=3)
    t0 = time.monotonic()
    tl.span("x", "ALLREDUCE", t0, t0)
    # written within ~50 ms, while open (30 s only ends a wait for a write that comes at close)
    deadline = time.monotonic() + 30
    while '"ALLREDUCE"' not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    text = path.read_text()
    assert '"ALLREDUCE"' in text and not text.rstrip().endswith("]}")
    tl.span("y", "ALLGATHER", t0, t0)
    tl.close()
    doc = json.loads(path.read_text())
    assert [e["pid"] for e in doc["traceEvents"]] == [3] * 5
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == ["ALLREDUCE", "ALLGATHER"]
    assert not tl._writer.is_alive()


def test_empty_timeline_is_valid_json(tmp_path):
    path = tmp_path / "tl.json"
    Timeline(str(path)).close()
    assert json.loads(path.read_text())["traceEvents"][0]["name"] == "process_name"


def test_the_file_records_the_wall_clock_time_of_its_start(tmp_path):
    """Horovod's timeline names its start in UTC microseconds (start_time_since_epoch_in_micros,
    which Horovod's test_timeline_api looks for); ts values are relative to it."""
    path = tmp_path / "tl.json"
    before = time.time() * 1e6
    tl = Timeline(str(path), rank=1)
    after = time.time() * 1e6
    tl.close()
    meta = json.loads(path.read_text())["traceEvents"][0]
    assert meta["name"] == "process_name" and meta["args"]["name"] == "rank 1"
    start = meta["args"]["start_time_since_epoch_in_micros"]
    assert isinstance(start, int) and before - 1 <= start <= after + 1
