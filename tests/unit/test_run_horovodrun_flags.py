"""horovodrun's command line under accordrun: its tuning flags reach the workers' variables, its
aliases parse, flags for features accord lacks are accepted with one warning, and flags that
would need mpirun/jsrun or a config file exit 2 with a HINT (horovodrun 0.28.1's parser is the
reference for the names), and its --config-file YAML settings."""
import os
import sys

import pytest

from accord.run.cli import build_parser, main
from accord.run.config.launch_config import config_from_args
from accord.run.spec.tuning import tuning_env

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
    (["--binding-args", "--rankfile f"], "--binding-args"),
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


CONFIG = """\
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 7
  cache_capacity: 2048
  hierarchical_allreduce: false
timeline:
  filename: tl.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 30
library_options:
  gloo_timeout_seconds: 90
logging:
  level: DEBUG
"""


def _from_file(monkeypatch, tmp_path, text, *flags):
    """main() with a config file; the job is not run: returns (exit code, its LaunchConfig)."""
    path = tmp_path / "horovod.yaml"
    path.write_text(text)
    seen = {}
    monkeypatch.setattr("accord.run.launcher.launch", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    return main(["--config-file", str(path), *flags, "-np", "1", "python3"]), seen.get("cfg")


def test_config_file_settings_reach_the_workers_and_flags_win(monkeypatch, tmp_path, capsys):
    code, cfg = _from_file(monkeypatch, tmp_path, CONFIG, "--cycle-time-ms", "3")
    assert code == 0 and capsys.readouterr().err == ""
    env = tuning_env(cfg.tuning)
    assert env["ACCORD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["ACCORD_CYCLE_TIME"] == "3"  # the command line wins over the file's 7
    assert env["ACCORD_CACHE_CAPACITY"] == "2048" and env["ACCORD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert env["ACCORD_TIMELINE"].endswith("/tl.json") and env["ACCORD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["ACCORD_STALL_CHECK_DISABLE"] == "1" and env["ACCORD_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["ACCORD_COLLECTIVE_TIMEOUT"] == "90" and env["ACCORD_LOG_LEVEL"] == "debug"
    code, cfg = _from_file(monkeypatch, tmp_path, "params:\n  hierarchical_allreduce: true\n")
    assert code == 0 and tuning_env(cfg.tuning)["ACCORD_HIERARCHICAL_ALLREDUCE"] == "1"


def test_config_file_autotune_and_unknown_keys_are_named_in_warnings(monkeypatch, tmp_path, capsys):
    code, _ = _from_file(monkeypatch, tmp_path, "autotune:\n  enabled: true\nparams:\n  speed: 11\ncontroller: gloo\n")
    err = capsys.readouterr().err
    assert code == 0 and err.count("accordrun: warning:") == 2
    assert "--autotune has no effect" in err and "params.speed is not" in err


@pytest.mark.parametrize("text, fragment", [
    ("params: [1, 2\n", "is not valid YAML"),
    ("- params\n", "must map sections to settings"),
    ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms must be a float, got 'fast'"),
    ("stall_check:\n  enabled: maybe\n", "stall_check.enabled must be true or false"),
    ("params:\n  cycle_time_ms: -1\n", "--cycle-time-ms must be > 0"),
    ("controller: mpi\n", "horovodrun's --mpi is not supported"),
    ("controller: ucx\n", "controller 'ucx' is not one of gloo, mpi"),
])
def test_bad_config_files_exit_2_with_a_hint(monkeypatch, tmp_path, text, fragment, capsys):
    code, _ = _from_file(monkeypatch, tmp_path, text)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "HINT:" in err, err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["--config-file", str(tmp_path / "none.yaml"), "-np", "1", "python3"]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "HINT:" in err


def test_config_file_without_pyyaml_exits_2_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now raises ImportError
    code, cfg = _from_file(monkeypatch, tmp_path, CONFIG)
    err = capsys.readouterr().err
    assert code == 2 and cfg is None
    assert "--config-file needs PyYAML" in err and "HINT: pip install pyyaml" in err, err
