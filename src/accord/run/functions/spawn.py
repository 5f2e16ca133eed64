"""``accord.spawn``: run a function on N local workers with accordrun's environment.

Like Paddle's ``paddle.distributed.spawn`` and Horovod's ``horovod.run``: ``fn(*args)`` runs in
every worker (the worker learns its rank from the environment, e.g. through
``hvd.init()`` or ``ACCORD_RANK``); the return values come back in rank order, e.g.
``accord.spawn(train, args=(0.1,), nprocs=2)`` returns ``[0, 1]`` for a ``train`` that returns
its rank (the whole example is in docs/launcher.md; the worker function imports the frontend it
uses itself, since this launcher layer sits below the frontends).

Each worker gets the worker contract of :mod:`accord.run.spec.worker_env` (its own rendezvous
store is started here), runs in its own process group, and is killed with its children if
this process dies: the workers are members of a :class:`~accord.run.processes.supervisor.Supervisor`,
the same one accordrun's jobs run on (its guardian, and its stop: SIGTERM, grace, SIGKILL). The first failure stops the
others (SIGTERM, grace period, SIGKILL) and is re-raised here as
:class:`~accord.errors.WorkerFailedError` naming the rank, with the worker's traceback in
the message and the original exception as ``__cause__`` when it could be sent back.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import secrets
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from accord import config
from accord.errors import ConfigError, WorkerFailedError, with_hint
from accord.run.functions.payload import function_payload
from accord.run.processes import job_store
from accord.run.processes.console_tee import ConsoleTee
from accord.run.processes.failures import describe_returncode, exit_status
from accord.run.processes.rank_files import rank_dirname
from accord.run.processes.supervisor import Member, ProcessHandle, Supervisor
from accord.run.spec.assignment import assign_slots
from accord.run.spec.flag_values import grace_period
from accord.run.spec.hosts import HostSlots
from accord.run.spec.tuning import BY_NAME as TUNING_OPTIONS
from accord.run.spec.tuning import make_tuning
from accord.run.spec.worker_env import SECRET_VAR, JobEnv, worker_env

_OTHER_OPTIONS = ("grace_period", "env", "devices", "output_filename", "prefix_output")


def _worker_main(rank: int, conn: Any, payload: bytes, env: dict[str, str], output_folder: str | None,
                 prefix_output: bool) -> None:
    """Entry point of one worker process."""
    try:
        os.setsid()  # one process group per worker: the parent stops its whole tree at once
    except OSError:
        pass
    config.set_variables(env)  # again here: a forkserver child did not inherit the parent's env
    tee = None
    if output_folder is not None or prefix_output:
        tee = ConsoleTee(output_folder, rank if prefix_output else None)
    code = 0
    try:
        fn, args = pickle.loads(payload)
        message: tuple[str, Any] = ("ok", fn(*args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        message = ("ok", None) if code == 0 else ("error", _describe(exc))
    except BaseException as exc:  # everything goes back to the parent, KeyboardInterrupt too
        code = 1
        message = ("error", _describe(exc))
    try:
        conn.send(message)
    except Exception as exc:  # the result could not be pickled: report that instead
        code = 1
        conn.send(("error", _describe(exc)))
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    if tee is not None:
        tee.close()
    os._exit(code)  # skip atexit handlers a library may have left behind in the worker


def _describe(exc: BaseException) -> dict[str, Any]:
    try:
        original = pickle.dumps(exc)
        pickle.loads(original)
    except Exception:  # noqa: BLE001 - unpicklable exceptions still report type and text
        original = None
    return {
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "pickled": original,
    }


def _default_nprocs() -> int:
    """One worker per visible GPU, else one per CPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:
        pass
    return os.cpu_count() or 1


@dataclass(frozen=True)
class _Options:
    """spawn's keyword options, read and checked once."""

    tuning: Any
    grace: float
    extra_env: dict[str, str]
    devices: tuple[str, ...] | None
    output_dir: str | None  # absolute
    prefix_output: bool


def _split_options(options: Mapping[str, Any]) -> _Options:
    unknown = sorted(set(options) - set(TUNING_OPTIONS) - set(_OTHER_OPTIONS))
    if unknown:
        raise ConfigError(with_hint(f"accord.spawn got unknown options {unknown}",
                                    f"use some of {sorted([*TUNING_OPTIONS, *_OTHER_OPTIONS])}"))
    devices = options.get("devices")
    output = options.get("output_filename")
    grace = float(options.get("grace_period", 5.0))
    grace_period(grace, "accord.spawn's grace_period")
    return _Options(
        tuning=make_tuning({k: v for k, v in options.items() if k in TUNING_OPTIONS}, "accord.spawn"),
        grace=grace,
        extra_env={str(k): str(v) for k, v in dict(options.get("env") or {}).items()},
        devices=None if devices is None else tuple(str(d) for d in devices),
        output_dir=None if output is None else os.path.abspath(os.fspath(output)),
        prefix_output=bool(options.get("prefix_output", False)))


class SpawnContext:
    """The running workers of one :func:`spawn` call.

    ``join()`` waits (True when every worker finished, False on timeout) and raises
    :class:`WorkerFailedError` on the first failure; ``results`` holds the return values in
    rank order once ``join()`` returned True.

    Made by ``spawn(..., join=False)``; its arguments are spawn's internals.

    Args:
        processes: the worker processes, in rank order.
        conns: per worker, the pipe its result or error comes back on.
        store: the job's rendezvous store, closed with the context (None when there is none).
        supervisor: what stops the remaining workers after a failure.
        master: the held ``MASTER_PORT``, released with the context (None when there is none).
    """

    def __init__(self, processes: Sequence[Any], conns: Sequence[Any],
                 store: job_store.JobStore | None, supervisor: Supervisor,
                 master: job_store.ReservedPort | None = None) -> None:
        self.processes = list(processes)
        self._conns = list(conns)
        self._store = store
        self._master = master
        self._supervisor: Supervisor | None = supervisor
        self._got: dict[int, tuple[str, Any]] = {}
        self.results: list[Any] | None = None

    def pids(self) -> list[int]:
        """The workers' process ids.

        Returns:
            One pid per worker, in rank order.
        """
        return [p.pid for p in self.processes]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers.

        Args:
            timeout: seconds to wait at most; None: until every worker finished.

        Returns:
            True when every worker finished (``results`` is then set), False on timeout.

        Raises:
            WorkerFailedError: a worker raised or died (the others are stopped first).
        """
        if self.results is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while len(self._got) < len(self.processes):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                waiting = {c: r for r, c in enumerate(self._conns) if r not in self._got}
                sentinels = {self.processes[r].sentinel: r for r in waiting.values()}
                ready = mpc.wait([*waiting, *sentinels], remaining)
                if not ready and deadline is not None:
                    return False
                for obj in ready:
                    rank = waiting.get(obj, sentinels.get(obj))
                    if rank is not None and rank not in self._got:
                        self._receive(rank)
                failed = sorted(r for r, (status, _) in self._got.items() if status == "error")
                if failed:
                    self._fail(failed[0])
        except BaseException:
            self.close()
            raise
        for p in self.processes:
            p.join()
        self.results = [self._got[r][1] for r in range(len(self.processes))]
        self.close()
        return True

    def _receive(self, rank: int) -> None:
        conn = self._conns[rank]
        try:
            if conn.poll(0.5):  # a worker that just exited may still have its answer in the pipe
                self._got[rank] = conn.recv()
                return
        except (EOFError, OSError):
            pass
        proc = self.processes[rank]
        proc.join(1.0)
        code = proc.exitcode if proc.exitcode is not None else -9
        self._got[rank] = ("error", {"type": "WorkerExited", "message": describe_returncode(code),
                                     "traceback": "", "pickled": None, "exitcode": code})

    def _fail(self, rank: int) -> None:
        info = self._got[rank][1]
        self.processes[rank].join(2.0)  # it exits right after answering: keep its own exit code
        code = self.processes[rank].exitcode
        self.close()
        tb = info.get("traceback") or ""
        text = f"accord.spawn: rank {rank} of {len(self.processes)} failed: {info['type']}: {info['message']}"
        if tb:
            text += f"\n\nTraceback from rank {rank}:\n{tb.rstrip()}"
        error = WorkerFailedError(
            with_hint(text, "the traceback is the worker's own; fix the error there (the other "
                            "workers were stopped)"),
            rank=rank,
            exit_code=exit_status(code) if code is not None else None,
        )
        original = pickle.loads(info["pickled"]) if info.get("pickled") else None
        raise error from original

    def close(self) -> None:
        """Stop every worker still running (SIGTERM, grace period, SIGKILL); release the store and port."""
        if self._supervisor is not None:
            self._supervisor.stop()
            self._supervisor.close()
            self._supervisor = None
        for c in self._conns:
            c.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._master is not None:
            self._master.release()
            self._master = None


def spawn(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    nprocs: int = -1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    **options: Any,
) -> list[Any] | SpawnContext:
    """Run ``fn(*args)`` on ``nprocs`` local workers; return their results in rank order.

    Args:
        fn: the function each worker runs. It goes by reference when the workers can import
            it, else (a lambda, a notebook's function) by value with cloudpickle
            (:mod:`accord.run.functions.payload`).
        args: positional arguments of ``fn``, the same on every worker.
        nprocs: number of workers; -1 = one per visible GPU, else one per CPU.
        join: False returns a :class:`SpawnContext` at once instead of waiting.
        daemon: as in :mod:`multiprocessing`.
        start_method: as in :mod:`multiprocessing` (a script calls spawn under
            ``if __name__ == "__main__":``).
        options: ``grace_period`` (s), ``env`` (extra variables), ``devices`` (one per worker),
            ``output_filename`` (a folder: each worker's stdout and stderr are also written to
            ``rank.N/stdout`` and ``rank.N/stderr`` there, as accordrun's flag), ``prefix_output``
            (True: each worker's console lines start ``[rank]<stdout>:``), and the tuning
            flags of accordrun with underscores (``fusion_threshold_mb``, ...).

    Returns:
        With ``join=True``, the workers' return values in rank order; with ``join=False``, the
        :class:`SpawnContext` of the running workers.

    Raises:
        WorkerFailedError: a worker raised or died (first failure; the others are stopped).
        ConfigError: an unknown option or an invalid ``nprocs``, or ``fn`` cannot be sent.
    """
    opts = _split_options(options)
    n = _default_nprocs() if nprocs == -1 else nprocs
    if n < 1:
        raise ConfigError(with_hint(f"accord.spawn needs nprocs >= 1 (or -1), got {nprocs}", "pass nprocs=2"))
    if opts.devices is not None and len(opts.devices) < n:
        raise ConfigError(with_hint(f"accord.spawn got {len(opts.devices)} devices for {n} workers",
                                    "pass one device per worker, or fewer workers"))
    ctx = mp.get_context(start_method)
    payload = function_payload(fn, args)
    secret = secrets.token_bytes(32)
    store = job_store.start_store("127.0.0.1", 0, secret)
    master = job_store.ReservedPort(host="127.0.0.1")
    job = JobEnv(job_id=uuid.uuid4().hex[:12], master_addr="127.0.0.1", master_port=master.port,
                 store_addr="127.0.0.1" if store else None, store_port=store.port if store else None)
    environ = config.snapshot()
    supervisor = Supervisor(opts.grace)
    processes, conns = [], []
    try:
        for slot in assign_slots([HostSlots("localhost", n)], n):
            env = worker_env(slot, job, tuning=opts.tuning, user_env=environ, cpu_count=os.cpu_count() or 1,
                             devices=opts.devices)
            env.update(opts.extra_env)
            env[SECRET_VAR] = secret.hex()
            reader, writer = ctx.Pipe(duplex=False)
            folder = None if opts.output_dir is None else os.path.join(opts.output_dir, rank_dirname(slot.rank, n))
            proc = ctx.Process(target=_worker_main, args=(slot.rank, writer, payload, env, folder,
                                                          opts.prefix_output),
                               name=f"accord-spawn-{slot.rank}", daemon=daemon)
            # set for the start only: a "spawn" child reads its environment before our code runs
            config.set_variables(env)
            try:
                proc.start()
            finally:
                config.set_variables({k: environ.get(k) for k in env})
            writer.close()
            supervisor.adopt(Member("worker", slot.rank, slot.rank, "localhost", ProcessHandle(proc)))
            processes.append(proc)
            conns.append(reader)
    except BaseException:
        supervisor.grace = 0.0
        SpawnContext(processes, conns, store, supervisor, master).close()
        raise
    context = SpawnContext(processes, conns, store, supervisor, master)
    if not join:
        return context
    context.join()
    assert context.results is not None
    return context.results
