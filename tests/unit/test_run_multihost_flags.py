"""Multi-host launcher pieces without processes: server placement (--server-hosts), --sync-dst-dir
(rsync's argv), and the root cause of a host that ssh cannot reach."""
import pytest

from accord.errors import ConfigError
from accord.run.cli import build_parser
from accord.run.config.launch_config import config_from_args
from accord.run.processes.failures import Failure, format_root_cause
from accord.run.processes.folder_copy import rsync_argv
from accord.run.processes.ssh import SshOptions
from accord.run.spec.server_roles import server_placement

ENV = {"PATH": "/usr/bin:/bin"}


def _cfg(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), ENV, cwd="/work")


@pytest.mark.parametrize("servers, chosen, workers, expected", [
    (3, [], ["a", "a", "b", "b"], ["a", "b", "a"]),   # spread over the worker hosts, MXNet's order
    (2, [], ["a", "a"], ["localhost", "localhost"]),  # one worker host: the launch host
    (3, ["c"], ["a", "b"], ["c", "c", "c"]),
    (3, ["b", "c"], ["a"], ["b", "c", "b"]),
    (0, [], ["a", "b"], []),
])
def test_server_placement(servers, chosen, workers, expected):
    assert server_placement(servers, chosen, workers) == expected


def test_server_hosts_flag_and_remote():
    cfg = _cfg("-H", "a:1,b:1", "--num-servers", "3", "python3")
    assert cfg.server_hosts == ("a", "b", "a")
    cfg = _cfg("-np", "2", "--num-servers", "2", "--server-hosts", "nodeS", "python3")
    assert cfg.server_hosts == ("nodeS", "nodeS") and cfg.remote  # only a server is elsewhere
    assert cfg.job_hosts == ("localhost", "nodeS")
    assert not _cfg("-np", "2", "--num-servers", "1", "python3").remote
    with pytest.raises(ConfigError, match="(?s)--num-servers is 0.*HINT"):
        _cfg("-np", "2", "--server-hosts", "a", "python3")


def test_sync_dst_dir_flag():
    cfg = _cfg("-H", "a:1,b:1", "--sync-dst-dir", "/tmp/job/", "python3")
    assert cfg.sync_dst_dir == "/tmp/job" and cfg.worker_cwd == "/tmp/job" and cfg.cwd == "/work"
    assert _cfg("-np", "1", "python3").worker_cwd == "/work"
    for bad in ("relative/dir", "/"):
        with pytest.raises(ConfigError, match="(?s)absolute folder.*HINT"):
            _cfg("-np", "1", "--sync-dst-dir", bad, "python3")


def test_rsync_argv_uses_the_jobs_ssh_options():
    argv = rsync_argv("/work/", "h2", "/tmp/job", SshOptions(port=2222, identity_file="/k"))
    assert argv[:3] == ["rsync", "-a", "--mkpath"] and argv[-2:] == ["/work/", "h2:/tmp/job/"]
    shell = argv[argv.index("-e") + 1]
    assert shell.startswith("ssh -T -o BatchMode=yes") and "-p 2222" in shell and "-i /k" in shell
    assert rsync_argv("/w", "fe80::1", "/d", SshOptions())[-1] == "[fe80::1]:/d/"
    assert rsync_argv("/w", None, "/d", SshOptions()) == ["rsync", "-a", "--mkpath", "/w/", "/d/"]


def test_root_cause_of_an_unreachable_host_names_it_with_a_hint():
    remote = Failure(rank=2, host="h2", pid=9, returncode=255, remote=True)
    text = format_root_cause(remote, [], [0, 1])
    assert "could not reach h2 through ssh" in text and "HINT: check `ssh -o BatchMode=yes h2 true`" in text
    local = Failure(rank=2, host="localhost", pid=9, returncode=255)
    assert "through ssh" not in format_root_cause(local, [], [0, 1])
