"""The MPI Operator's ssh settings without a cluster: OMPI_MCA_plm_rsh_args reaches ssh (and the
rsh agent) where Open MPI's mpirun puts it, and --sync-dst-dir copies through an rsh agent (a
stand-in that runs rsync's remote side here) or fails naming the agent, with a HINT."""
import shutil

import pytest

from accord.errors import ConfigError, LaunchError
from accord.run.cli import build_parser
from accord.run.config.launch_config import config_from_args
from accord.run.processes.folder_copy import FolderCopy, rsync_argv
from accord.run.processes.ssh import SshOptions, ssh_argv
from accord.run.spec.mpi_operator import rsh_args

ENV = {"PATH": "/usr/bin:/bin"}


def _cfg(env, *argv):
    return config_from_args(build_parser().parse_args(list(argv)), {**ENV, **env}, cwd="/work")


def test_plm_rsh_args_come_right_after_ssh_so_that_their_options_win():
    cfg = _cfg({"OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10 -p 2222"}, "-H", "a:1,b:1", "python3")
    argv = ssh_argv("b", "SCRIPT", cfg.ssh)
    assert argv[:5] == ["ssh", "-o", "ConnectionAttempts=10", "-p", "2222"]
    assert argv[5] == "-T" and argv[-2:] == ["b", "SCRIPT"]
    # accordrun's own -p comes later: ssh keeps the last -p, so the flag beats the variable
    cfg = _cfg({"OMPI_MCA_plm_rsh_args": "-p 2222"}, "-H", "a:1,b:1", "-p", "3333", "python3")
    argv = ssh_argv("b", "S", cfg.ssh)
    assert argv.index("2222") < argv.index("3333")
    # Open MPI 5 (PRRTE) names it plm_ssh_args; a quoted value stays one argument
    cfg = _cfg({"PRTE_MCA_plm_ssh_args": "-o 'ProxyCommand=nc %h 22'"}, "-H", "a:1,b:1", "python3")
    assert cfg.ssh.extra_args == ("-o", "ProxyCommand=nc %h 22")
    assert _cfg({}, "-H", "a:1,b:1", "python3").ssh.extra_args == ()
    assert ssh_argv("b", "S", SshOptions())[:2] == ["ssh", "-T"]


def test_plm_rsh_args_go_to_the_rsh_agent_and_to_rsync_as_mpirun_passes_them():
    agent = shutil.which("true")
    cfg = _cfg({"OMPI_MCA_plm_rsh_agent": agent, "OMPI_MCA_plm_rsh_args": "--ctx prod"}, "-H", "a:1,b:1", "python3")
    assert ssh_argv("b", "S", cfg.ssh) == [agent, "--ctx", "prod", "b", "S"]
    argv = rsync_argv("/work", "b", "/tmp/job", cfg.ssh)
    assert argv[argv.index("-e") + 1] == f"{agent} --ctx prod" and argv[-1] == "b:/tmp/job/"
    over_ssh = rsync_argv("/work", "b", "/tmp/job", SshOptions(extra_args=("-o", "ConnectionAttempts=10")))
    assert over_ssh[over_ssh.index("-e") + 1].startswith("ssh -o ConnectionAttempts=10 -T")


def test_an_unclosed_quote_in_plm_rsh_args_is_a_config_error_with_a_hint():
    with pytest.raises(ConfigError, match=r"(?s)OMPI_MCA_plm_rsh_args='-o \"Port=2' cannot be split.*HINT"):
        rsh_args({"OMPI_MCA_plm_rsh_args": '-o "Port=2'})
    assert rsh_args({"OMPI_MCA_plm_rsh_args": "  "}) == ()


def _agent(tmp_path, body: str) -> tuple[str, ...]:
    path = tmp_path / "kubexec.sh"
    path.write_text("#!/bin/sh\nhost=$1; shift\n" + body + "\n")
    path.chmod(0o755)
    return (str(path),)


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_sync_dst_dir_copies_through_an_agent_that_runs_its_arguments_as_one_command(tmp_path):
    # like the MPI Operator's kubexec.sh (kubectl exec POD -- sh -c "$*"), but here
    agent = _agent(tmp_path, 'exec sh -c "$*"')
    source = tmp_path / "project"
    (source / "data").mkdir(parents=True)
    (source / "data" / "payload.txt").write_text("copied")
    dest = tmp_path / "dest"
    copy = FolderCopy(str(source), str(dest), SshOptions(rsh_agent=agent), ENV, timeout=30)
    assert copy.run(["worker-0"]) is True
    assert (dest / "data" / "payload.txt").read_text() == "copied"


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_sync_dst_dir_through_an_agent_that_drops_arguments_names_the_agent(tmp_path):
    agent = _agent(tmp_path, 'exec sh -c "$1"')  # runs `rsync` alone: rsync's server never starts
    source = tmp_path / "project"
    source.mkdir()
    (source / "f").write_text("x")
    copy = FolderCopy(str(source), str(tmp_path / "dest"), SshOptions(rsh_agent=agent), ENV, timeout=30)
    with pytest.raises(LaunchError) as info:
        copy.run(["worker-0"])
    text = str(info.value)
    assert "could not copy" in text and "worker-0 (rsync exit" in text
    assert f"rsh agent (OMPI_MCA_plm_rsh_agent): {agent[0]}" in text
    assert 'HINT:' in text and 'sh -c "$*"' in text
    assert not (tmp_path / "dest" / "f").exists()
