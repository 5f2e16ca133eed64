"""The guardian's program (see :mod:`accord.run.processes.guardian`): ``python -I -S THIS_FILE GRACE``.

It reads the launcher's pipe on stdin: ``+PGID`` watch a process group, ``-PGID`` forget it,
``dPATH`` remove that directory after the kill, ``q`` the launcher ends normally. At end of
file without ``q`` (the launcher died) it sends SIGTERM to every watched group, waits up to
GRACE seconds, sends SIGKILL, then removes the directories.

Standard library only, and nothing of accord: the launcher runs this file by its path in an
isolated interpreter (``-I -S``), so neither the user's environment (PYTHONPATH, PYTHONSTARTUP,
site and sitecustomize hooks) nor the way accord was installed can keep it from running.
"""
import os
import shutil
import signal
import sys
import time


def read_orders(fd: int) -> tuple[set, list, bool]:
    """Read the launcher's orders until end of file: (groups to kill, directories to remove, quit)."""
    groups, dirs, buf, quit_ = set(), [], b"", False
    while True:
        data = os.read(fd, 4096)
        if not data:
            return groups, dirs, quit_
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"q":
                quit_ = True
            elif line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
            elif line[:1] == b"d":
                dirs.append(os.fsdecode(line[1:]))


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except OSError:
        return False


def stop(groups: set, dirs: list, grace: float) -> None:
    """SIGTERM every group, wait up to ``grace`` seconds, SIGKILL, then remove ``dirs``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_alive(g) for g in groups):
            time.sleep(0.05)
    for path in dirs:  # after the kill: nobody writes there any more
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    """Watch stdin; stop the groups when it ends without ``q``. Returns the exit status (0)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    grace = float(sys.argv[1])
    groups, dirs, quit_ = read_orders(0)
    if not quit_:
        stop(groups, dirs, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
