"""The ssh command line; the remote script itself runs here under sh and bash (no ssh needed)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.stacks import wait_until

from accord.errors import ConfigError
from accord.run.processes.ssh import SshOptions, environment_lines, remote_script, secret_line, ssh_argv, stdin_preamble

SECRET = "5e" * 32


def test_argv_has_batch_mode_policy_port_identity():
    argv = ssh_argv("node1", "echo hi", SshOptions(port=2222, identity_file="/k/id", strict_host_key_checking="yes"))
    assert argv[0] == "ssh" and argv[-2:] == ["node1", "echo hi"]
    joined = " ".join(argv)
    for part in ("-o BatchMode=yes", "-o StrictHostKeyChecking=yes", "-p 2222", "-i /k/id", "-T"):
        assert part in joined
    default = ssh_argv("n", "x", SshOptions())
    assert "StrictHostKeyChecking=accept-new" in " ".join(default) and "-p" not in default
    with pytest.raises(ConfigError, match="HINT:"):
        ssh_argv("n", "x", SshOptions(strict_host_key_checking="maybe"))


def test_neither_the_secret_nor_the_variables_are_in_argv():
    script = remote_script(["python", "train.py"], "/work dir", 5)
    argv = ssh_argv("node1", script, SshOptions())
    assert all(SECRET not in part and "ACCORD_RANK" not in part for part in argv)
    assert "read -r ACCORD_JOB_SECRET" in script and "cd '/work dir'" in script
    assert secret_line(SECRET) == (SECRET + "\n").encode()
    assert stdin_preamble(SECRET, {"ACCORD_RANK": "1"}) == (SECRET + "\nACCORD_RANK=1\n\n").encode()


def test_bad_variable_name_rejected():
    for name in ("A-B", "_accord_nl"):  # a shell cannot export it; the script's own name
        with pytest.raises(ConfigError, match="HINT:"):
            environment_lines({name: "1"})


SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("shell", SHELLS)
def test_remote_script_runs_with_cwd_env_secret_and_exit_code(shell, tmp_path):
    work = tmp_path / "dir with 'quote"
    work.mkdir()
    body = 'echo "$ACCORD_JOB_SECRET|$A|$B|$(pwd)"; exit 7'
    script = remote_script(["sh", "-c", body], str(work), 1)
    # stdin stays open while the worker runs (its end-of-file would mean "launcher gone")
    proc = subprocess.Popen([shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(stdin_preamble(SECRET, {"A": "x y'z", "B": "$HOME"}))
        proc.stdin.flush()
        assert proc.wait(10) == 7
        assert proc.stdout.read().decode().strip() == f"{SECRET}|x y'z|$HOME|{work}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.timeout(40)
@pytest.mark.parametrize("shell", SHELLS)
def test_remote_script_kills_worker_tree_when_stdin_closes(shell):
    # the worker notes the SIGTERM it ignores and has a child that ignores it too: EOF -> TERM,
    # grace, KILL of the whole group. The worker's note ("term") shows the TERM came first and
    # was survived; its status shows the KILL. The 3 s grace is ample time for the note.
    # The child says "ready" once it ignores TERM: a TERM sent before would end it at once.
    body = ('trap "echo term" TERM; sh -c \'trap "" TERM; echo ready; exec sleep 60\' & echo $$ $!; '
            'while kill -0 $! 2>/dev/null; do wait $!; done')
    script = remote_script(["sh", "-c", body], "/", 3)
    proc = subprocess.Popen([shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(stdin_preamble(SECRET, {}))
        proc.stdin.flush()
        lines = [proc.stdout.readline().decode().strip() for _ in range(2)]
        assert "ready" in lines, lines
        pids = [int(p) for p in next(line for line in lines if line != "ready").split()]
        assert len(pids) == 2
        proc.stdin.close()  # what the remote shell sees when the launcher or ssh dies
        # killed, not waited for: the child sleeps 60 s, three times this wait
        assert proc.wait(20) == 128 + 9  # the worker was SIGKILLed after the grace
        assert proc.stdout.read().decode().split() == ["term"], "no SIGTERM before the SIGKILL"
        for pid in pids:  # (zombies until their parent reaps them)
            assert wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}")
                              or open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=10), pid
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shell", SHELLS)
def test_forwarded_values_arrive_exactly_through_stdin_whatever_their_size(shell, tmp_path):
    """Newlines, quotes, backslashes, $ and non-ASCII text arrive unchanged; 4 x 60 KiB of
    variables (more than the 128 KiB one argv string may hold, which failed with E2BIG when
    they were part of the script) arrive too, and none of it is on a command line (ps)."""
    odd = "line 1\nline 2\n\n'single' \"double\" \\back\\slash $HOME `id` \u00e9\r end\n"
    env = {"ODD": odd, "EMPTY": "", **{f"BIG{i}": chr(ord("a") + i) * 60_000 for i in range(4)}}
    body = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
            "['ODD', 'EMPTY', 'BIG0', 'BIG1', 'BIG2', 'BIG3', 'ACCORD_JOB_SECRET']}))")
    script = remote_script([sys.executable, "-c", body], str(tmp_path), 1)
    assert len(script) < 4096 and "line 2" not in script and "aaaa" not in script
    proc = subprocess.Popen([shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(stdin_preamble(SECRET, env))
        proc.stdin.flush()
        got = json.loads(proc.stdout.read())  # (read before the wait: more than a pipe holds)
        assert proc.wait(20) == 0
        assert got == {**env, "ACCORD_JOB_SECRET": SECRET}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
