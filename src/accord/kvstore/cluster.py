"""A parameter-server cluster on this host for tests and examples, without the launcher.

``LocalCluster`` starts accord's authenticated store in this process (it plays MXNet's
scheduler: servers register there, workers find them there) and N server processes on loopback,
and gives the environment a worker needs::

    with LocalCluster(num_servers=2, num_workers=2) as cluster:
        env = cluster.worker_env(rank=0)   # ACCORD_STORE_*, ACCORD_JOB_SECRET, ACCORD_NUM_SERVERS, ...
        ...                                 # start workers with env (run_ranks, subprocess, ...)

:func:`start_servers` starts just the server processes (``python -m accord.kvstore.server``)
for a store that runs elsewhere. ``accordrun --num-servers`` does the same with the launcher's
own store.
"""
from __future__ import annotations

import secrets
import signal
import subprocess
import time
from typing import Any, Mapping

from accord import config
from accord.errors import LaunchError, with_hint
from accord.kvstore.directory import SERVER_KEY
from accord.worker_contract import server_command

__all__ = ["LocalCluster", "server_environment", "start_servers"]

_JOB_VARIABLES = {
    "ACCORD_RANK", "ACCORD_SIZE", "ACCORD_LOCAL_RANK", "ACCORD_LOCAL_SIZE", "ACCORD_CROSS_RANK",
    "ACCORD_CROSS_SIZE", "ACCORD_STORE_ADDR", "ACCORD_STORE_PORT", "ACCORD_JOB_SECRET",
    "ACCORD_SECRET_FILE", "ACCORD_NUM_SERVERS", "ACCORD_NUM_WORKERS", "ACCORD_PS_ROOT_URI",
    "ACCORD_PS_ROOT_PORT", "ACCORD_ROLE", "ACCORD_JOB_ID", "ACCORD_SERVER_INDEX",
}


class LocalCluster:
    """A store in this process plus ``num_servers`` server processes (loopback, free ports).

    Args:
        num_servers, num_workers: the job's shape.
        env: extra variables for the servers (e.g. ``{"ACCORD_VERBOSE": "1"}``).
        stderr: where servers write their logs (default: inherited).
    """

    def __init__(self, num_servers: int, num_workers: int, *, env: Mapping[str, str] | None = None,
                 stderr: Any = None) -> None:
        from accord.store.server import StoreServer

        self.num_servers, self.num_workers = num_servers, num_workers
        self.secret = secrets.token_bytes(32)
        self.store = StoreServer(host="127.0.0.1", port=0, secret=self.secret).start()
        base = config.snapshot()
        for name in list(base):  # servers inherit tuning (ACCORD_KVSTORE_*), not another job's place
            if name.startswith(("DMLC_", "HOROVOD_")) or name in _JOB_VARIABLES:
                del base[name]
        base.update(self.job_env())
        base.update(env or {})
        try:
            self.servers: list[subprocess.Popen] = start_servers(num_servers, base, stderr=stderr)
        except BaseException:
            self.store.close()
            raise

    def job_env(self) -> dict[str, str]:
        """What every process of the job needs: store, secret, counts."""
        return {
            "ACCORD_STORE_ADDR": "127.0.0.1",
            "ACCORD_STORE_PORT": str(self.store.port),
            "ACCORD_JOB_SECRET": self.secret.hex(),
            "ACCORD_NUM_SERVERS": str(self.num_servers),
            "ACCORD_NUM_WORKERS": str(self.num_workers),
        }

    def worker_env(self, rank: int | None = None) -> dict[str, str]:
        """A worker's environment (with ACCORD_RANK/ACCORD_SIZE when ``rank`` is given)."""
        env = self.job_env()
        if rank is not None:
            env.update({"ACCORD_RANK": str(rank), "ACCORD_SIZE": str(self.num_workers)})
        return env

    def wait_ready(self, timeout: float = 30.0) -> "LocalCluster":
        """Return once every server has registered.

        Raises:
            LaunchError: a server exited or did not register in time.
        """
        keys = [SERVER_KEY.format(index=i) for i in range(self.num_servers)]
        deadline = time.monotonic() + timeout
        while not self.store.has_keys(keys):
            dead = [p.returncode for p in self.servers if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise LaunchError(with_hint(
                    f"{len(keys)} parameter servers did not all register within {timeout:.0f}s "
                    f"(exit codes of those that ended: {dead})",
                    "run `python -m accord.kvstore.server` by hand with PS_VERBOSE=1 to see why"))
            time.sleep(0.02)
        return self

    def close(self, grace: float = 5.0) -> list[int | None]:
        """Stop the servers (SIGTERM, then SIGKILL after ``grace``) and the store; return their
        exit codes."""
        for proc in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.servers:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.store.close()
        return [p.returncode for p in self.servers]

    def __enter__(self) -> "LocalCluster":
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_environment(env: Mapping[str, str], num_servers: int) -> dict[str, str]:
    """``env`` plus the server role and MXNet's names (DMLC_ROLE/NUM_SERVER/NUM_WORKER).

    ``env`` must already hold the store address (ACCORD_STORE_ADDR/PORT), the secret and
    ACCORD_NUM_WORKERS (or ACCORD_SIZE).
    """
    out = dict(env)
    out.update({"ACCORD_ROLE": "server", "DMLC_ROLE": "server",
                "ACCORD_NUM_SERVERS": str(num_servers), "DMLC_NUM_SERVER": str(num_servers)})
    workers = out.get("ACCORD_NUM_WORKERS") or out.get("DMLC_NUM_WORKER") or out.get("ACCORD_SIZE")
    if workers:
        out.setdefault("ACCORD_NUM_WORKERS", workers)
        out.setdefault("DMLC_NUM_WORKER", workers)
    return out


def start_servers(num_servers: int, env: Mapping[str, str], *, stdout: Any = None,
                  stderr: Any = None, cwd: str | None = None) -> list[subprocess.Popen]:
    """Start ``num_servers`` server processes (each in its own session) and return them.

    Args:
        env: the full environment for the servers (see :func:`server_environment`).
        stdout, stderr: as for :class:`subprocess.Popen` (e.g. ``subprocess.PIPE``).
    """
    procs: list[subprocess.Popen] = []
    full = server_environment(env, num_servers)
    try:
        for _ in range(num_servers):
            procs.append(subprocess.Popen(server_command(), env=full, cwd=cwd, stdin=subprocess.DEVNULL,
                                          stdout=stdout, stderr=stderr, start_new_session=True))
    except OSError:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return procs
