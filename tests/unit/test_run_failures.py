"""Exit statuses, signal names and the root-cause report."""
import signal

from accord.errors import not_answering, ranks_not_answering
from accord.run.processes.failures import (
    Failure,
    describe_returncode,
    exit_status,
    format_root_cause,
    not_answered,
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


_LOST = "accord.errors.RankFailedError"


def _peer_error(rank, message, when=10.0):
    return Failure(rank=rank, host="a", pid=100 + rank, returncode=1, when=when,
                   error={"type": _LOST, "message": message, "traceback": "", "timestamp": when})


def test_the_ranks_an_error_names_as_not_answering_are_read_back():
    text = f"timed out ... peer {not_answering([3, 1])} while rank 0 waited"
    assert "rank(s) [1, 3] did not answer" in text
    assert ranks_not_answering(text + "\n" + not_answering([2])) == [1, 2, 3]
    assert ranks_not_answering("rank 2 exited; 1 peer rank(s) missing") == []


def test_a_frozen_rank_named_by_its_peers_timeouts_is_the_root_cause():
    timed_out = _peer_error(0, f"allreduce: timed out after 3s: peer {not_answering([1])} while rank 0 waited")
    aborted = _peer_error(2, "peer rank 0 aborted the shm communicator", when=9.0)
    # rank 1 never failed: it was still running when the launcher stopped the job
    assert not_answered([timed_out, aborted], running=[1]) == {1: (0,)}
    assert not_answered([timed_out, aborted], running=[]) == {}  # it failed (or ended) itself
    own = Failure(rank=3, host="b", pid=5, returncode=3)  # a failure of its own is the root cause
    assert not_answered([timed_out, own], running=[1]) == {}
    frozen = Failure(rank=1, host="a", pid=101, returncode=-9, silent_to=(0,), stderr_tail=["..."])
    text = format_root_cause(frozen, [timed_out, aborted], stopped=[1])
    assert "rank       : 1 (local_rank 0, host a)" in text
    assert ("status     : did not answer rank(s) [0], whose collectives timed out waiting for it "
            "(ACCORD_COLLECTIVE_TIMEOUT); it was still running (frozen?) and the launcher stopped it "
            "(killed by SIGKILL (signal 9))") in text
    assert "HINT: look at what rank 1 was doing on a" in text
    assert "rank 0 (host a, pid 100): exit code 1" in text and "rank 2 (host a, pid 102): exit code 1" in text
