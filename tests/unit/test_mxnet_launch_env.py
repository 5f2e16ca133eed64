"""`accordrun --ps mxnet` and `accord-mxnet-launch` without starting processes: the flag, the
DMLC_* roles and environment, launch.py's flags mapped to accordrun's, and their errors."""
import pytest

from accord.errors import ConfigError
from accord.run.cli import build_parser
from accord.run.config.launch_config import config_from_args
from accord.run.mxnet_launch import accordrun_argv, env_pairs, main, read_hostfile, round_robin
from accord.run.mxnet_launch import build_parser as launch_parser
from accord.run.processes.failures import Failure, format_root_cause, pick_root_cause
from accord.run.spec.mxnet_roles import MXNetJob, node_env, nodes

ENV = {"PATH": "/usr/bin:/bin"}


def _cfg(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), ENV, cwd="/work")


def test_ps_flag_defaults_and_server_count():
    assert _cfg("-np", "2", "python3").ps == "accord"
    cfg = _cfg("-np", "3", "--ps", "mxnet", "python3", "train.py")
    assert (cfg.ps, cfg.num_servers, cfg.num_proc) == ("mxnet", 3, 3)  # -s defaults to -n
    assert _cfg("-np", "2", "--ps", "mxnet", "--num-servers", "1", "python3").num_servers == 1
    with pytest.raises(ConfigError, match="at least one server"):
        _cfg("-np", "2", "--ps", "mxnet", "--num-servers", "0", "python3")


def test_node_env_on_one_host():
    job = MXNetJob("127.0.0.1", 9091, num_workers=2, num_servers=1, local=True)
    assert nodes(["localhost", "localhost"]) == [("scheduler", "scheduler", "localhost"),
                                                 ("server0", "server", "localhost"),
                                                 ("server1", "server", "localhost")]
    for role in ("scheduler", "server", "worker"):
        env = node_env(role, job, {})
        assert env["DMLC_ROLE"] == role
        assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]) == ("127.0.0.1", "9091")
        assert (env["DMLC_NUM_WORKER"], env["DMLC_NUM_SERVER"]) == ("2", "1")
        assert (env["DMLC_INTERFACE"], env["DMLC_NODE_HOST"]) == ("lo", "127.0.0.1")
        assert ("OMP_NUM_THREADS" in env) == (role != "worker")
    mine = node_env("server", job, {"DMLC_INTERFACE": "eth1", "DMLC_NODE_HOST": "10.1.1.1",
                                    "OMP_NUM_THREADS": "2"})
    assert "DMLC_INTERFACE" not in mine and "DMLC_NODE_HOST" not in mine and "OMP_NUM_THREADS" not in mine
    with pytest.raises(ValueError, match="unknown MXNet role"):
        node_env("coordinator", job, {})


def test_node_env_across_hosts():
    job = MXNetJob("10.0.0.5", 9000, 4, 2, local=False, interface="eth0")
    # nodes on the launch host advertise its address on the job's interface ...
    for role in ("scheduler", "server", "worker"):
        env = node_env(role, job, {})
        assert (env["DMLC_NODE_HOST"], env["DMLC_INTERFACE"]) == ("10.0.0.5", "eth0")
    # ... nodes elsewhere let ps-lite find their own address there (on DMLC_INTERFACE)
    for role in ("server", "worker"):
        env = node_env(role, job, {}, remote=True)
        assert "DMLC_NODE_HOST" not in env and env["DMLC_INTERFACE"] == "eth0"
        assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]) == ("10.0.0.5", "9000")
    assert node_env("server", job, {"DMLC_NODE_HOST": "h2"}, remote=True).get("DMLC_NODE_HOST") is None
    with pytest.raises(ValueError, match="scheduler stays here"):
        node_env("scheduler", job, {}, remote=True)
    no_interface = MXNetJob("10.0.0.5", 9000, 4, 2, local=False)
    assert "DMLC_INTERFACE" not in node_env("server", no_interface, {}, remote=True)


def test_mxnet_servers_spread_over_the_worker_hosts():
    cfg = _cfg("-np", "4", "-H", "h1:2,h2:2", "--ps", "mxnet", "--num-servers", "2", "python3", "t.py")
    assert cfg.server_hosts == ("h1", "h2")
    assert [host for _, _, host in nodes(cfg.server_hosts)] == ["localhost", "h1", "h2"]
    chosen = _cfg("-np", "4", "-H", "h1:2,h2:2", "--ps", "mxnet", "--num-servers", "3",
                  "--server-hosts", "h2", "python3", "t.py")
    assert chosen.server_hosts == ("h2", "h2", "h2")
    assert _cfg("-np", "2", "--ps", "mxnet", "python3").server_hosts == ("localhost", "localhost")


def test_launch_py_ssh_hostfile_maps_onto_the_multi_host_path(tmp_path):
    """accord-mxnet-launch -n 2 -s 2 -H hosts --launcher ssh: one worker and one server per host."""
    hosts = tmp_path / "hosts"
    hosts.write_text("h1\nh2\n")
    argv = _launch("-n", "2", "-s", "2", "-H", str(hosts), "--launcher", "ssh", "python", "train.py")
    assert argv == ["--ps", "mxnet", "-np", "2", "--num-servers", "2", "-H", "h1:1,h2:1", "python", "train.py"]
    cfg = _cfg(*argv)
    assert [(s.hostname, s.rank) for s in cfg.slots] == [("h1", 0), ("h2", 1)]
    assert (cfg.ps, cfg.num_servers, cfg.server_hosts) == ("mxnet", 2, ("h1", "h2"))


def test_scheduler_failure_is_reported_as_the_root_cause():
    sched = Failure(rank=0, host="localhost", pid=10, returncode=1, kind="scheduler", when=5.0)
    worker = Failure(rank=1, host="localhost", pid=11, returncode=1, when=1.0)
    assert pick_root_cause([worker, sched]) is sched and sched.name == "scheduler"
    assert "MXNet's ps-lite scheduler" in format_root_cause(sched, [worker])


def _launch(*argv, has_sync=False):
    return accordrun_argv(launch_parser().parse_args(list(argv)), has_sync)


def test_launch_py_flags_become_accordrun_flags(tmp_path):
    assert _launch("-n", "2", "python", "t.py", "--kv-store", "dist_sync") == \
        ["--ps", "mxnet", "-np", "2", "--num-servers", "2", "python", "t.py", "--kv-store", "dist_sync"]
    assert _launch("-n", "2", "-s", "1", "--launcher", "local", "python", "t.py")[:6] == \
        ["--ps", "mxnet", "-np", "2", "--num-servers", "1"]
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode1\n\nnode2:1\nnode3  # spare\n")
    assert read_hostfile(str(hosts)) == [("node1", None), ("node2", 1), ("node3", None)]
    hosts.write_text("[::1]:2\n[fe80::1]\n")  # bracketed IPv6, as accordrun's -H takes them
    assert read_hostfile(str(hosts)) == [("[::1]", 2), ("[fe80::1]", None)]
    assert _launch("-n", "3", "-H", str(hosts), "python", "t.py")[6:8] == ["-H", "[::1]:2,[fe80::1]:1"]
    for bad in ("node1:+2", "node1:1_0", "node1:\u0662", "node1:", "fe80::1:2", "[::1"):
        hosts.write_text(bad + "\n")
        with pytest.raises(ValueError, match="HINT:"):
            read_hostfile(str(hosts))
    hosts.write_text("# cluster\nnode1\n\nnode2:1\nnode3  # spare\n")
    assert _launch("-n", "5", "-s", "1", "-H", str(hosts), "python", "t.py")[6:8] == \
        ["-H", "node1:2,node2:1,node3:2"]  # ssh by default with -H; round-robin, node2 holds 1
    assert _launch("-n", "2", "-H", str(hosts), "--launcher", "local", "python", "t.py")[6:] == ["python", "t.py"]
    assert round_robin([("a", None), ("b", None)], 1) == [("a", 1)]
    assert "--sync-dst-dir" in _launch("-n", "1", "--sync-dst-dir", "/tmp/x", "python", "t.py", has_sync=True)
    assert env_pairs(["PS_VERBOSE:1", "A=b:c"]) == {"PS_VERBOSE": "1", "A": "b:c"}


@pytest.mark.parametrize("argv, message", [
    (["-n", "2", "--launcher", "yarn", "python"], "--launcher yarn is not supported"),
    (["-n", "2", "--launcher", "ssh", "python"], "needs -H"),
    (["-n", "0", "python"], "must be >= 1"),
    (["-n", "2", "-s", "0", "python"], "must be >= 1"),
    (["-n", "2", "--env-server", "A:1", "python"], "not supported"),
    (["-n", "2"], "no command"),
    (["-n", "2", "-H", "/nonexistent/hosts", "python"], "cannot read '/nonexistent/hosts'"),
    (["-n", "2", "-H", "/dev/zero", "python"], "'/dev/zero' is a device, not a regular file"),
    (["-n", "2", "--env", "novalue", "python"], "is not NAME:VALUE"),
])
def test_bad_launch_flags_exit_2_with_a_hint(argv, message, capsys, monkeypatch):
    import accord.run.cli as cli

    monkeypatch.setattr(cli, "main", lambda argv: pytest.fail("accordrun must not start"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "HINT:" in err
