"""Exit statuses, signal names and the root-cause report."""
import signal

from accord.run.processes.failures import (
    Failure,
    describe_returncode,
    exit_status,
    format_root_cause,
    pick_root_cause,
    signal_name,
)


def test_status_words_and_codes():
    assert describe_returncode(3) == "exit code 3"
    assert describe_returncode(-9) == "killed by SIGKILL (signal 9)"
    assert exit_status(3) == 3 and exit_status(-int(signal.SIGKILL)) == 137 and exit_status(-2) == 130
    assert signal_name(15) == "SIGTERM" and signal_name(200) == "signal 200"


def test_root_cause_prefers_earliest_error_file_then_rank():
    late = Failure(rank=0, host="a", pid=1, returncode=1, when=10.0)
    early_file = Failure(rank=2, host="b", pid=2, returncode=1, when=11.0, error={"timestamp": 5.0})
    tie = Failure(rank=1, host="a", pid=3, returncode=1, when=10.0)
    assert pick_root_cause([late, early_file, tie]) is early_file
    assert pick_root_cause([tie, late]) is late


def test_report_with_traceback_others_and_stopped():
    root = Failure(rank=1, host="node1", pid=42, returncode=1, local_rank=1,
                   error={"type": "ValueError", "message": "bad", "traceback": "Traceback...\nValueError: bad\n"})
    other = Failure(rank=3, host="node2", pid=43, returncode=-9)
    text = format_root_cause(root, [other], stopped=[0, 2])
    assert "Root Cause (first observed failure):" in text
    assert "rank       : 1 (local_rank 1, host node1)" in text and "pid        : 42" in text
    assert "error      : ValueError: bad" in text and "    ValueError: bad" in text
    assert "rank 3 (host node2, pid 43): killed by SIGKILL (signal 9)" in text
    assert "Stopped by the launcher: ranks 0, 2" in text


def test_report_falls_back_to_stderr_tail():
    root = Failure(rank=0, host="a", pid=1, returncode=3, stderr_tail=["line 1", "line 2"])
    text = format_root_cause(root)
    assert "status     : exit code 3" in text and "last 2 stderr lines:" in text and "    line 2" in text
