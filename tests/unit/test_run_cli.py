"""Command line -> LaunchConfig, and bad input -> exit 2 with a HINT (nothing started)."""
import pytest

from accord.run.cli import build_parser, main
from accord.run.config.launch_config import config_from_args
from accord.run.spec.hosts import HostSlots

ENV = {"PATH": "/usr/bin:/bin"}


def _cfg(*argv, environ=ENV):
    return config_from_args(build_parser().parse_args(list(argv)), environ, cwd="/work")


def test_defaults_single_host():
    cfg = _cfg("-np", "2", "python3", "train.py", "--lr", "0.1", "-np", "9")
    assert cfg.command == ("python3", "train.py", "--lr", "0.1", "-np", "9")
    assert cfg.num_proc == 2 and cfg.hosts == (HostSlots("localhost", 2),)
    assert [s.local_rank for s in cfg.slots] == [0, 1] and not cfg.remote
    assert cfg.prefix and not cfg.prefix_timestamp and cfg.start_timeout is None
    assert cfg.store_port == 0 and cfg.master_port == 0 and cfg.cwd == "/work"


def test_hosts_hostfile_ips_and_np_default(tmp_path):
    cfg = _cfg("-H", "a:2,b:2", "python3", "x.py")
    assert cfg.num_proc == 4 and cfg.remote and [s.hostname for s in cfg.slots] == ["a", "a", "b", "b"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=3\n")
    assert _cfg("--hostfile", str(hostfile), "-np", "2", "python3").num_proc == 2
    cfg = _cfg("--ips", "10.0.0.1,10.0.0.2", "--nproc-per-node", "2", "python3")
    assert cfg.num_proc == 4 and cfg.hosts[1] == HostSlots("10.0.0.2", 2)
    assert _cfg("--nproc-per-node", "3", "python3").num_proc == 3


def test_this_hosts_own_address_in_ips_runs_here_without_ssh():
    """--ips naming only this host's own (non-loopback) address is a one-host job: no ssh, the
    store stays on loopback."""
    from accord.run.spec.hosts import this_host_addresses

    own = sorted(str(a) for a in this_host_addresses() if not a.is_loopback and a.version == 4)
    if not own:
        pytest.skip("this machine has no non-loopback IPv4 address")
    cfg = _cfg("--ips", own[0], "--nproc-per-node", "2", "python3")
    assert cfg.num_proc == 2 and not cfg.remote
    assert _cfg("--ips", f"{own[0]},198.51.100.7", "--nproc-per-node", "1", "python3").remote


def test_tuning_output_and_verbose_alias():
    cfg = _cfg("-np", "2", "--fusion-threshold-mb", "16", "--cycle-time-ms", "3", "--hierarchical-allreduce",
               "--log-level", "DEBUG", "--ranks-filter", "1", "--no-prefix", "--prefix-timestamp",
               "--start-timeout", "7", "--grace-period", "0", "--", "python3", "-V",
               environ={**ENV, "PS_VERBOSE": "1"})
    assert cfg.command == ("python3", "-V")
    assert cfg.tuning.fusion_threshold_mb == 16 and cfg.tuning.cycle_time_ms == 3
    assert cfg.tuning.hierarchical_allreduce and cfg.tuning.log_level == "debug"
    assert cfg.ranks_filter == frozenset({1}) and not cfg.prefix and cfg.prefix_timestamp
    assert cfg.start_timeout == 7 and cfg.grace_period == 0 and cfg.verbose and cfg.tuning.verbose


@pytest.mark.parametrize("argv, fragment", [
    (["-np", "3", "-H", "localhost:2", "python3"], "more than the 2 slots"),
    (["-H", "a:0", "python3"], "0 slots"),
    (["-H", "a::", "python3"], "not a host name"),
    (["-np", "2"], "no command"),
    (["python3"], "number of workers"),
    (["-np", "2", "no-such-program-xyz"], "not found on PATH"),
    (["-np", "2", "-H", "a:2", "--ips", "b", "python3"], "both name hosts"),
    (["--ips", "a,b", "python3"], "needs --nproc-per-node"),
    (["-np", "2", "--gpus", "0", "python3"], "1 device(s)"),
    (["-np", "2", "--ranks-filter", "5", "python3"], "names rank 5"),
    (["-np", "2", "--start-timeout", "0", "python3"], "--start-timeout must be > 0"),
    (["-np", "2", "--master-port", "70000", "python3"], "between 0 and 65535"),
    (["-np", "2", "--log-level", "loud", "python3"], "is not a level"),
    (["-np", "2", "-i", "/no/such/key", "python3"], "does not exist"),
    (["-np", "2", "--network-interface", "nope0", "python3"], "not found"),
])
def test_bad_input_exits_2_with_hint(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "HINT:" in err and err.startswith("accordrun: error:")


@pytest.mark.parametrize("argv", [["--bogus", "-np", "2", "python3"], ["-np", "two", "python3"],
                                  ["--num-servers"], ["--verb", "-np", "1", "x"]])
def test_argparse_errors_exit_2_with_hint(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "accordrun: error:" in err and "HINT:" in err


def test_version_and_help_env(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and "accordrun (accord) 0.1.0" in capsys.readouterr().out
    assert main(["--help-env"]) == 0
    assert "ACCORD_FUSION_THRESHOLD" in capsys.readouterr().out
