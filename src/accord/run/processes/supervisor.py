"""The one place that starts, watches and stops a job's processes: accordrun's workers and
parameter servers (commands, through a :mod:`runner <accord.run.processes.runners>`) and ``accord.spawn``'s
workers (functions in :mod:`multiprocessing` processes) alike.

A :class:`Supervisor` owns the guardian (nothing outlives a launcher, even a SIGKILLed one),
knows every process of the job as a :class:`Member`, collects exit codes, and stops the job
the same way whoever asks: the runner's own stop step (ssh: end-of-file), then the signal to
every process group, the grace period, and SIGKILL. What an exit *means* (a failure, an elastic
loss, a server that ended early) is the caller's policy; reporting it uses :mod:`accord.run.processes.failures`.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from accord.run.processes.guardian import Guardian, signal_group, stop_groups
from accord.run.processes.runners import Runner, StartOptions, runner_for
from accord.worker_contract import remove_shm_segments


class ProcessHandle:
    """A :mod:`multiprocessing` process seen through the ``subprocess.Popen`` methods the
    supervisor uses (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.stdin = None

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()


@dataclass(eq=False)
class Member:
    """One process of the job: a worker (``index`` = rank) or a server/scheduler."""

    kind: str  # "worker", "server" or "scheduler"
    index: int
    label: str | int  # its output key: the rank, "server0", MXNet's "scheduler", ...
    host: str
    proc: Any  # subprocess.Popen, or a ProcessHandle
    runner: Runner | None = None
    error_file: str | None = None
    returncode: int | None = None
    stopped: bool = False  # the supervisor asked it to stop

    @property
    def remote(self) -> bool:
        return self.runner is not None and self.runner.remote


class Supervisor:
    """The processes of one job (see the module docstring)."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.guardian = Guardian(grace)
        self.members: list[Member] = []

    def start(self, kind: str, index: int, label: str | int, host: str, argv: Sequence[str],
              environ: Mapping[str, str], added: Mapping[str, str], options: StartOptions,
              error_file: str | None = None) -> Member:
        """Start ``argv`` on ``host`` through its runner and watch it.

        Raises:
            OSError: the program (or ssh) cannot be started.
        """
        runner = runner_for(host)
        proc = runner.start(host, argv, environ, added, options)
        return self.adopt(Member(kind, index, label, host, proc, runner, error_file))

    def adopt(self, member: Member) -> Member:
        """Watch a process started elsewhere (accord.spawn's)."""
        self.guardian.watch(member.proc.pid)
        self.members.append(member)
        return member

    def of_kind(self, *kinds: str) -> list[Member]:
        """The members of these kinds, in start order."""
        return [m for m in self.members if m.kind in kinds]

    def reap(self) -> list[Member]:
        """Collect exit codes; return the members that ended since the last call."""
        ended = []
        for m in self.members:
            if m.returncode is None:
                m.returncode = m.proc.poll()
                if m.returncode is not None:
                    ended.append(m)
        return ended

    def stop(self, first_signal: int = signal.SIGTERM,
             skip_grace: Callable[[], bool] = lambda: False) -> list[Member]:
        """Stop every process group (finished members' too: their children must not outlive the
        job): the runner's stop step, ``first_signal``, the grace period (ended early when every
        group is gone or ``skip_grace()`` says so), SIGKILL. Return the members that were still
        running."""
        running = [m for m in self.members if m.proc.poll() is None]
        for m in running:
            m.stopped = True
        for m in self.members:
            if m.runner is not None:
                m.runner.ask_to_stop(m.proc)

        def reap() -> bool:
            self.reap()
            return skip_grace()

        grace = self.grace if running else 0.0
        stop_groups([m.proc.pid for m in self.members], grace, reap=reap, first_signal=first_signal)
        for m in self.members:
            if m.proc.poll() is None:  # not (yet) in a group of its own: kill it directly
                m.proc.kill()
            try:
                m.proc.wait(5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent already
                pass
            m.returncode = m.proc.poll()
        return running

    def ask_to_stop(self, member: Member) -> None:
        """Stop one member without waiting (elastic: its host left the job): the runner's stop
        step (ssh: end-of-file, the remote side does TERM, grace, KILL), and SIGTERM to a
        local process group. :meth:`kill_one` is the follow-up after the grace period."""
        member.stopped = True
        if member.runner is not None:
            member.runner.ask_to_stop(member.proc)
        if not member.remote and member.proc.poll() is None:
            signal_group(member.proc.pid, signal.SIGTERM)

    def kill_one(self, member: Member) -> None:
        """SIGKILL one member's process group at once."""
        if member.proc.poll() is None and not signal_group(member.proc.pid, signal.SIGKILL):
            member.proc.kill()

    def kill(self) -> None:
        """SIGKILL whatever still runs, at once (after an error while starting)."""
        for m in self.members:
            if m.proc.poll() is None:
                try:
                    os.killpg(m.proc.pid, signal.SIGKILL)
                except OSError:
                    m.proc.kill()
                m.proc.wait()
            if m.runner is not None:
                m.runner.ask_to_stop(m.proc)

    def close(self) -> None:
        """The normal end: the guardian exits without killing anything. Then the shared-memory
        segments of local members that were killed while creating one are removed."""
        self.guardian.close()
        for m in self.members:
            if not m.remote and m.proc.poll() is not None:
                remove_shm_segments(m.proc.pid)
