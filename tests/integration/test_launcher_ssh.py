"""The remote (ssh) path of the launcher, end to end, with a stand-in ssh client that runs the
remote script on this machine (no sshd needed): secret on stdin, environment forwarding,
working directory, exit codes, and remote workers stopped when the job stops."""
import dataclasses
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

from accord import config
from accord.run.cli import build_parser
from accord.run.config.launch_config import config_from_args
from accord.run.launcher import launch

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)


def _run(tmp_path, monkeypatch, *argv):
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    fake = tmp_path / "ssh"
    fake.write_text(f"#!/bin/sh\nexec {lib.PYTHON} {lib.script('fake_ssh.py')} \"$@\"\n")
    fake.chmod(0o755)
    ns = build_parser().parse_args(["--network-interface", "lo", "--grace-period", "1", *argv])
    cfg = config_from_args(ns, config.snapshot(), cwd=str(tmp_path))
    assert cfg.remote
    cfg = dataclasses.replace(cfg, ssh=dataclasses.replace(cfg.ssh, ssh_binary=str(fake)))
    out, err, messages = io.BytesIO(), io.BytesIO(), io.StringIO()
    code = launch(cfg, out, err, messages)
    return code, out.getvalue().decode(), err.getvalue().decode() + messages.getvalue(), log.read_text()


@pytest.mark.timeout(30)
def test_remote_workers_get_contract_and_secret_through_stdin(tmp_path, monkeypatch):
    code, out, err, ssh_log = _run(tmp_path, monkeypatch, "-H", "nodeA:2,nodeB:1", lib.PYTHON,
                                   lib.script("report.py"))
    assert code == 0, err
    reports = lib.env_reports(out)
    assert [(reports[r]["ACCORD_HOSTNAME"], reports[r]["ACCORD_LOCAL_RANK"], reports[r]["ACCORD_CROSS_RANK"])
            for r in range(3)] == [("nodeA", "0", "0"), ("nodeA", "1", "0"), ("nodeB", "0", "1")]
    assert all(r["secret_len"] == 64 for r in reports.values())  # read from ssh's stdin
    assert all(r["ACCORD_STORE_ADDR"] == "127.0.0.1" for r in reports.values())
    assert all(r["ACCORD_ERROR_FILE"] is None for r in reports.values())
    assert "[2]<stderr>:to stderr from 2" in err
    calls = [json.loads(line) for line in ssh_log.splitlines()]
    assert len(calls) == 3 and all("BatchMode=yes" in argv for argv in calls)
    # fake ssh processes start concurrently, so the log order is not the rank order
    assert sorted(argv[-2] for argv in calls) == ["nodeA", "nodeA", "nodeB"]
    assert not re.search(r"[0-9a-f]{64}", ssh_log)  # no secret on any ssh command line


@pytest.mark.timeout(30)
def test_remote_failure_stops_remote_workers(tmp_path, monkeypatch):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    code, out, err, _ = _run(tmp_path, monkeypatch, "-H", "nodeA:1,nodeB:1", lib.PYTHON, lib.script("fail.py"),
                             "--pid-dir", str(pid_dir), "--fail-rank", "1", "--code", "3", "--grandchild",
                             "--ignore-term")
    pids = [int(p) for f in pid_dir.glob("*.pids") for p in f.read_text().split()]
    try:
        assert code == 3, err
        assert "rank       : 1 (local_rank 0, host nodeB)" in err and "rank 1 failing with exit" in err
        assert len(pids) == 4 and lib.wait_dead(pids, 8) == []  # TERM ignored: KILL after the grace
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
def test_forwarded_variables_of_any_size_go_through_stdin_not_the_command_line(tmp_path, monkeypatch):
    """4 x 60 KiB of forwarded variables: more than one argv string may hold (128 KiB), which
    made the ssh client's exec fail with E2BIG when they were part of the remote script; and
    values on a command line are visible to every user through ps, on both hosts."""
    for i in range(4):
        monkeypatch.setenv(f"ACCORD_TEST_BIG{i}", f"v{i}" * 30_000)
    monkeypatch.setenv("ACCORD_TEST_ODD", "two\nlines 'quoted' $HOME")
    show = ("import os, json; print('SIZES', json.dumps([len(os.environ.get(f'ACCORD_TEST_BIG{i}', '')) "
            "for i in range(4)] + [os.environ.get('ACCORD_TEST_ODD')]))")
    code, out, err, ssh_log = _run(tmp_path, monkeypatch, "-H", "nodeA:1,nodeB:1", lib.PYTHON, "-c", show)
    assert code == 0, err
    sizes = [json.loads(line.split("SIZES ", 1)[1]) for line in out.splitlines() if "SIZES " in line]
    assert sizes == [[60_000] * 4 + ["two\nlines 'quoted' $HOME"]] * 2, out
    assert "v0v0v0" not in ssh_log and "quoted" not in ssh_log  # no value on the ssh command lines
