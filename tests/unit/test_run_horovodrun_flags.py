"""horovodrun's command line under accordrun: its tuning flags reach the workers' variables, its
aliases parse, flags for features accord lacks are accepted with one warning, and flags that
would need mpirun/jsrun or a config file exit 2 with a HINT (horovodrun 0.28.1's parser is the
reference for the names)."""
import os

import pytest

from accord.run.cli import build_parser, main
from accord.run.launch_config import config_from_args
from accord.run.tuning import tuning_env

pytestmark = pytest.mark.timeout(30)

ENV = {"PATH": "/usr/bin:/bin"}


def _cfg(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), ENV, cwd="/work")


def test_horovodrun_tuning_flags_become_the_workers_variables():
    cfg = _cfg("-np", "2", "--cache-capacity", "7", "--timeline-mark-cycles", "--gloo-timeout-seconds", "12.5",
               "--no-hierarchical-allreduce", "python3")
    env = tuning_env(cfg.tuning)
    assert env["ACCORD_CACHE_CAPACITY"] == "7" and env["ACCORD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["ACCORD_COLLECTIVE_TIMEOUT"] == "12.5" and env["ACCORD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert tuning_env(_cfg("-np", "2", "--hierarchical-allreduce", "python3").tuning)[
        "ACCORD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert "ACCORD_HIERARCHICAL_ALLREDUCE" not in tuning_env(_cfg("-np", "2", "python3").tuning)


def test_horovodrun_spellings_of_existing_flags(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=3\n")
    assert _cfg("-hostfile", str(hostfile), "-np", "2", "python3").num_proc == 2
    assert _cfg("-np", "1", "-prefix-timestamp", "python3").prefix_timestamp
    assert _cfg("-np", "1", "--prefix-output-with-timestamp", "python3").prefix_timestamp


def test_version_short_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["-v"])
    assert info.value.code == 0 and "accordrun (accord)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [
    (["--mpi"], "--mpi"), (["--jsrun"], "--jsrun"), (["--mpi-args=--map-by ppr:1:node"], "--mpi-args"),
    (["--binding-args", "--rankfile f"], "--binding-args"), (["--config-file", "hvd.yaml"], "--config-file"),
])
def test_flags_that_need_mpirun_or_a_config_file_exit_2_with_a_hint(argv, flag, capsys):
    assert main([*argv, "-np", "1", "python3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accordrun: error:") and f"horovodrun's {flag} is not supported" in err
    assert "HINT:" in err


def test_contradicting_hierarchical_flags_exit_2(capsys):
    assert main(["-np", "1", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "python3"]) == 2
    err = capsys.readouterr().err
    assert "--hierarchical-allreduce and --no-hierarchical-allreduce contradict" in err and "HINT:" in err


def test_ignored_and_satisfied_flags(monkeypatch, capsys):
    """Flags for features accord lacks are named in one warning; --gloo, --tcp, --disable-cache
    and --stall-check need nothing and say nothing. The job itself is not run here."""
    seen = {}

    def fake_launch(cfg):
        seen["cfg"] = cfg
        return 0

    monkeypatch.setattr("accord.run.launcher.launch", fake_launch)
    monkeypatch.setenv("NCCL_IB_DISABLE", "before")  # restored after the test: main() sets it
    assert main(["--gloo", "--disable-cache", "--stall-check", "--no-autotune", "--no-timeline-mark-cycles",
                 "--no-mpi-threads-disable", "-np", "1", "python3"]) == 0
    assert capsys.readouterr().err == "" and seen["cfg"].num_proc == 1
    assert os.environ["NCCL_IB_DISABLE"] == "before"
    assert main(["--tcp", "-np", "1", "python3"]) == 0  # as horovodrun: NCCL stays off InfiniBand
    assert capsys.readouterr().err == "" and os.environ["NCCL_IB_DISABLE"] == "1"
    assert main(["--autotune", "--autotune-log-file", "/tmp/x.csv", "--num-nccl-streams", "2",
                 "--thread-affinity", "1", "--hierarchical-allgather", "--log-without-timestamp",
                 "-np", "1", "python3"]) == 0
    err = capsys.readouterr().err
    assert err.count("accordrun: warning:") == 1
    for flag in ("--autotune,", "--autotune-log-file", "--num-nccl-streams", "--thread-affinity",
                 "--hierarchical-allgather", "--log-without-timestamp"):
        assert flag in err
    assert "ignored" in err
