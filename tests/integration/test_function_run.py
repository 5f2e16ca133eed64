"""accord.run(fn, ...): Horovod's horovod.run on this host: results in rank order from real
workers, Horovod's argument rules, per-rank output files, and clear refusals of what needs
other hosts."""
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import pytest

import accord
from accord.errors import ConfigError


def averaged(offset, scale=1.0):
    """A Horovod-style job function: init, one allreduce of a rank-dependent value, its result."""
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        value = hvd.allreduce(torch.tensor([float(hvd.rank()) * scale + offset]), op=hvd.Average)
        print(f"rank {hvd.rank()} says hello")
        print(f"rank {hvd.rank()} warns", file=sys.stderr)
        return hvd.rank(), hvd.size(), value.item()
    finally:
        hvd.shutdown()


def rank_of_worker():
    return int(os.environ["ACCORD_RANK"])


@pytest.mark.timeout(90)
def test_runs_the_function_on_every_rank_and_returns_results_in_rank_order(tmp_path, capfd):
    # the mean of rank * 2 + 1 over ranks 0..2 is 3; computed here from the same definition
    expected_mean = sum(r * 2.0 + 1.0 for r in range(3)) / 3
    results = accord.run(averaged, args=(1.0,), kwargs={"scale": 2.0}, num_proc=3,
                         hosts="localhost:3", output_filename=str(tmp_path / "out"))
    assert results == [(r, 3, pytest.approx(expected_mean)) for r in range(3)]
    for rank in range(3):  # also on the console, as Horovod's output_filename writes both
        folder = tmp_path / "out" / f"rank.{rank}"
        assert f"rank {rank} says hello" in (folder / "stdout").read_text()
        assert f"rank {rank} warns" in (folder / "stderr").read_text()
    captured = capfd.readouterr()  # the console: whole lines, prefixed as horovod.run's
    assert "[2]<stdout>:rank 2 says hello\n" in captured.out and "[1]<stderr>:rank 1 warns\n" in captured.err
    assert "[0]<stdout>:" not in (tmp_path / "out" / "rank.0" / "stdout").read_text()  # files: raw


@pytest.mark.timeout(60)
def test_deprecated_np_and_the_other_import_forms():
    from accord.run import run

    with pytest.warns(DeprecationWarning, match="np is deprecated") as direct:
        assert run(rank_of_worker, np=2) == [0, 1]
    with pytest.warns(DeprecationWarning) as package:  # num_proc given: np does not override it (Horovod)
        assert accord.run(rank_of_worker, num_proc=3, np=2) == [0, 1, 2]
    # the warnings name the caller's line, whichever way run was called
    assert [w.filename for w in direct.list + package.list] == [__file__, __file__]


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"hosts": "localhost:2", "hostfile": "hosts.txt"}, ValueError, "hosts and hostfile only allow one"),
    ({"use_gloo": True, "use_mpi": True}, ValueError, "use_gloo and use_mpi only allow one"),
    ({"hosts": "localhost:2,node-elsewhere-9:2"}, ConfigError, "this host only; hosts ['node-elsewhere-9']"),
    ({"hosts": "localhost:1", "num_proc": 2}, ConfigError, "num_proc=2 is more than the 1 slots"),
    ({"min_num_proc": 1}, ConfigError, "does not run elastic jobs"),
    ({"min_np": 1}, ConfigError, "does not run elastic jobs"),
    ({"reset_limit": 2}, ConfigError, "does not run elastic jobs"),
    ({"use_mpi": True}, ConfigError, "use_mpi=True"),
    ({"executable": "/opt/other/python"}, ConfigError, "not executable='/opt/other/python'"),
    ({"num_proc": 0}, ConfigError, "num_proc >= 1, got 0"),
])
def test_refusals_name_the_argument_with_a_hint(kwargs, error, fragment):
    with warnings.catch_warnings(), pytest.raises(error) as info:
        warnings.simplefilter("ignore", DeprecationWarning)  # min_np's
        accord.run(rank_of_worker, **kwargs)
    assert fragment in str(info.value)
    if error is ConfigError:
        assert "HINT:" in str(info.value)


@pytest.mark.timeout(60)
def test_this_hosts_own_name_and_a_hostfile_are_accepted(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{socket.gethostname()} slots=2\n")
    assert accord.run(rank_of_worker, num_proc=2, hostfile=str(hostfile),
                      ssh_port=22, start_timeout=30, verbose=True, use_gloo=True) == [0, 1]



@pytest.mark.timeout(90)
def test_a_function_of_an_interactive_session_goes_by_value():
    # `python -c` has a __main__ without a file, as a notebook: its workers cannot import `double`
    program = textwrap.dedent("""
        import accord
        def double(x, extra=0):
            import os
            return int(os.environ["ACCORD_RANK"]) * 100 + 2 * x + extra
        print("results", accord.run(double, args=(3,), kwargs={"extra": 1}, num_proc=2))
        print("lambda", accord.spawn(lambda y: y + 1, args=(41,), nprocs=1))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "results [7, 107]" in done.stdout and "lambda [42]" in done.stdout, done.stdout


def test_without_cloudpickle_a_function_that_must_go_by_value_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "cloudpickle", None)
    with pytest.raises(ConfigError) as info:
        accord.spawn(lambda: 1, nprocs=1)
    text = str(info.value)
    assert "cannot be imported by the workers" in text and "HINT: pip install cloudpickle" in text
    assert accord.spawn(rank_of_worker, nprocs=1) == [0]  # an importable function needs no cloudpickle


def fail_on_rank_1():
    import time

    if os.environ["ACCORD_RANK"] == "1":
        raise KeyError("missing 42")
    time.sleep(120)


@pytest.mark.timeout(60)
def test_a_failing_rank_raises_runtime_error_naming_it_and_stops_the_others():
    # horovod.run raises RuntimeError when a process fails; scripts catch that. Rank 0 sleeps
    # 120 s, past the test's 60 s timeout: the call returns only if rank 0 was stopped.
    with pytest.raises(RuntimeError, match="(?s)rank 1 of 2 failed: KeyError.*missing 42"):
        accord.run(fail_on_rank_1, num_proc=2)


def many_lines():
    for i in range(200):
        print(f"rank {os.environ['ACCORD_RANK']} line {i}", flush=True)


@pytest.mark.timeout(60)
def test_ranks_lines_are_never_cut_into_each_other(capfd):
    accord.run(many_lines, num_proc=2)
    lines = [line for line in capfd.readouterr().out.splitlines() if "line" in line]
    assert len(lines) == 400
    for line in lines:  # each line whole, under its own rank's prefix
        rank = line[1]
        assert line.startswith(f"[{rank}]<stdout>:rank {rank} line "), line
        assert line.split(" line ")[1].isdigit(), line
    assert accord.spawn(many_lines, nprocs=1) == [None]  # spawn: no prefix unless asked
    assert capfd.readouterr().out.startswith("rank 0 line 0\n")
