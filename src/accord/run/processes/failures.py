"""Worker and server failures: exit statuses, signal names and the launcher's root-cause report."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from accord.errors import RankFailedError, ShutdownError, ranks_not_answering


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``; unknown numbers -> ``"signal 64"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """Popen's returncode in words: ``"exit code 3"`` or ``"killed by SIGKILL (signal 9)"``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)} (signal {-returncode})"
    return f"exit code {returncode}"


def exit_status(returncode: int) -> int:
    """The status a shell would report: the exit code, or 128 + signal number."""
    return 128 - returncode if returncode < 0 else returncode


SSH_FAILED = 255  # ssh's status when it cannot connect or authenticate
# Errors a worker raises because another process failed or left first (its collective lost a
# peer; its peers shut down): the error file's "type" of such a failure.
PEER_CAUSED = tuple(f"{e.__module__}.{e.__qualname__}" for e in (RankFailedError, ShutdownError))


@dataclass
class Failure:
    """One worker (or parameter server) that ended badly.

    For a server, ``rank`` is the server's index and ``kind`` is ``"server"``: a server that
    exits before the workers are done is a failure even with status 0.
    """

    rank: int
    host: str
    pid: int
    returncode: int
    when: float = field(default_factory=time.time)
    stderr_tail: Sequence[str] = ()
    error: dict[str, Any] | None = None  # the worker's error file, when it wrote one
    local_rank: int = 0
    kind: str = "worker"  # or "server", or "scheduler" (MXNet's, with --ps mxnet)
    remote: bool = False  # started through ssh (status 255 is then most likely ssh's own)
    # A worker that did not fail itself but did not answer these ranks, whose collectives timed
    # out waiting for it (a frozen process: SIGSTOP, a hung device, a stuck host): still
    # running when the launcher stopped the job, so its status is the launcher's stop.
    silent_to: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """``rank 3``, ``server 1`` or ``scheduler`` (MXNet's)."""
        if self.kind == "scheduler":
            return "scheduler"
        return f"server {self.rank}" if self.kind == "server" else f"rank {self.rank}"

    @property
    def peer_caused(self) -> bool:
        """Whether its error file shows an error a peer's failure causes (:data:`PEER_CAUSED`)."""
        return bool(self.error) and self.error.get("type") in PEER_CAUSED

    @property
    def first_seen(self) -> float:
        """When it failed: the error file's timestamp when there is one (closer to the truth)."""
        if self.error and isinstance(self.error.get("timestamp"), (int, float)):
            return float(self.error["timestamp"])
        return self.when


def pick_root_cause(failures: Sequence[Failure]) -> Failure:
    """The first failure: a server's, else one not caused by a peer, then the earliest error-file
    timestamp, else earliest seen, then lowest rank.

    A server comes first because workers fail when a server goes away (their error files may
    carry an earlier time than the launcher's poll that saw the server end), never the reverse:
    servers keep serving when a worker dies. A worker whose collective lost a peer, or whose
    peers shut down, failed because of another one (:attr:`Failure.peer_caused`), even when it
    exited first: the failing worker's exit (atexit handlers, torch's teardown) can take longer
    than its peers' reaction to it.
    """
    return min(failures, key=lambda f: (f.kind not in ("server", "scheduler"), f.peer_caused,
                                        f.first_seen, f.rank))


def not_answered(failures: Sequence[Failure], running: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """The ranks still ``running`` (they never failed) that the peer-caused failures' errors
    name as not answering (:func:`accord.errors.ranks_not_answering`), each with the ranks that
    named it. Empty when a failure has a cause of its own (that failure is the root cause).

    A frozen rank fails nothing itself: its peers' collectives time out waiting for it and
    their errors come first, so without this the report would blame the first peer to time out.
    """
    if not failures or not all(f.kind == "worker" and f.peer_caused for f in failures):
        return {}
    named: dict[int, list[int]] = {}
    for f in failures:
        text = f"{f.error.get('message', '')}\n{f.error.get('traceback', '')}" if f.error else ""
        for rank in ranks_not_answering(text):
            if rank in running and rank != f.rank:
                named.setdefault(rank, []).append(f.rank)
    return {rank: tuple(sorted(set(by))) for rank, by in sorted(named.items())}


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line for line in text.rstrip("\n").splitlines())


def format_root_cause(
    root: Failure,
    others: Sequence[Failure] = (),
    stopped: Sequence[int] = (),
    title: str = "accordrun: job failed",
    width: int = 72,
    stopped_servers: Sequence[int] = (),
) -> str:
    """The boxed report printed when a job fails.

    Args:
        root: the first observed failure.
        others: later failures (shown one line each).
        stopped: ranks the launcher stopped because of ``root``.
        stopped_servers: parameter servers it stopped.
    """
    heavy, light = "=" * width, "-" * width
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.when))
    lines = [
        heavy,
        title,
        light,
        "Root Cause (first observed failure):",
        f"  server     : {root.rank} (parameter server, host {root.host})" if root.kind == "server"
        else f"  scheduler  : MXNet's ps-lite scheduler (host {root.host})" if root.kind == "scheduler"
        else f"  rank       : {root.rank} (local_rank {root.local_rank}, host {root.host})",
        f"  pid        : {root.pid}",
        f"  status     : {describe_returncode(root.returncode)}",
        f"  time       : {stamp}",
    ]
    if root.silent_to:
        lines[-2] = (f"  status     : did not answer rank(s) {list(root.silent_to)}, whose collectives "
                     "timed out waiting for it (ACCORD_COLLECTIVE_TIMEOUT); it was still running "
                     f"(frozen?) and the launcher stopped it ({describe_returncode(root.returncode)})")
        lines.append(f"  HINT: look at what rank {root.rank} was doing on {root.host} (a stopped "
                     "process, a hung device or file system, a host out of memory); its peers' "
                     "errors are listed below")
    if root.kind in ("server", "scheduler") and root.returncode == 0:
        lines.append("  (the server ended before the workers did)")
    if root.remote and root.returncode == SSH_FAILED:
        lines.append(f"  ssh        : could not reach {root.host} through ssh (or the program there "
                     f"exited {SSH_FAILED} itself)")
        lines.append(f"  HINT: check `ssh -o BatchMode=yes {root.host} true` from this host: is the "
                     "host up and its name right, does sshd run there, is your key accepted?")
    if root.error:
        lines.append(f"  error      : {root.error.get('type', '?')}: {root.error.get('message', '')}")
        lines.append("  traceback  :")
        lines.append(_indent(str(root.error.get("traceback", "")), "    "))
    elif root.stderr_tail:
        lines.append(f"  last {len(root.stderr_tail)} stderr lines:")
        lines.extend("    " + line for line in root.stderr_tail)
    else:
        lines.append("  (no error file and nothing on stderr)")
    if others:
        lines.append(light)
        lines.append("Other failures:")
        for f in sorted(others, key=lambda f: (f.kind, f.rank)):
            lines.append(f"  {f.name} (host {f.host}, pid {f.pid}): {describe_returncode(f.returncode)}")
    if stopped or stopped_servers:
        lines.append(light)
    if stopped:
        lines.append(f"Stopped by the launcher: ranks {', '.join(str(r) for r in sorted(stopped))}")
    if stopped_servers:
        lines.append("Stopped by the launcher: servers "
                     f"{', '.join(str(r) for r in sorted(stopped_servers))}")
    lines.append(heavy)
    return "\n".join(lines)
