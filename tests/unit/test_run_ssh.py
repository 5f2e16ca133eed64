"""The ssh command line; the remote script itself runs here under sh and bash (no ssh needed)."""
import os
import shutil
import subprocess

import pytest
from helpers.stacks import wait_until

from accord.errors import ConfigError
from accord.run.processes.ssh import SshOptions, remote_script, secret_line, ssh_argv

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


def test_secret_is_never_in_argv():
    script = remote_script(["python", "train.py"], {"ACCORD_RANK": "1"}, "/work dir", 5)
    argv = ssh_argv("node1", script, SshOptions())
    assert all(SECRET not in part for part in argv)
    assert "read -r ACCORD_JOB_SECRET" in script and "cd '/work dir'" in script
    assert secret_line(SECRET) == (SECRET + "\n").encode()


def test_bad_variable_name_rejected():
    with pytest.raises(ConfigError, match="HINT:"):
        remote_script(["true"], {"A-B": "1"}, "/", 1)


SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("shell", SHELLS)
def test_remote_script_runs_with_cwd_env_secret_and_exit_code(shell, tmp_path):
    work = tmp_path / "dir with 'quote"
    work.mkdir()
    body = 'echo "$ACCORD_JOB_SECRET|$A|$B|$(pwd)"; exit 7'
    script = remote_script(["sh", "-c", body], {"A": "x y'z", "B": "$HOME"}, str(work), 1)
    # stdin stays open while the worker runs (its end-of-file would mean "launcher gone")
    proc = subprocess.Popen([shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(secret_line(SECRET))
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
    script = remote_script(["sh", "-c", body], {}, "/", 3)
    proc = subprocess.Popen([shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(secret_line(SECRET))
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
