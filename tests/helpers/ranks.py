"""Run a function on N real ranks over Gloo on loopback, with a hard timeout.

``run_ranks(fn, nprocs, *args)`` starts ``nprocs`` processes from a fork server that has
already imported torch and accord (so a rank starts in well under a second), gives each the environment
accordrun would give it, runs ``fn(rank, size, *args)`` and returns the results in rank order.

- ``init="torch"``: the parent starts a ``torch.distributed.TCPStore`` on a free port (port 0:
  the OS picks it, so there is no race) and each rank joins the default Gloo process group
  through it before ``fn`` runs.
- ``init="accord"``: the parent starts accord's authenticated rendezvous store on a free port
  and sets the worker contract (ACCORD_RANK, ACCORD_STORE_*, ACCORD_JOB_SECRET...); ``fn`` calls
  accord's own init.
- ``init="torchrun"``: the parent hosts a ``TCPStore`` as torchrun's agent does, and each rank
  gets torchrun's environment (:func:`torchrun_env`) and none of accordrun's; ``fn`` calls
  ``init_process_group`` itself (env://), as a script under torchrun does.
- ``init="none"``: only the worker contract's rank/size variables are set.

A rank that raises makes the call raise ``RanksFailed`` with every rank's traceback. On timeout
every rank dumps its Python stacks (faulthandler, SIGUSR1) and is killed; no process survives.
"""
from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
import traceback
from typing import Any, Callable

_CTX = None


class RanksFailed(AssertionError):
    """One or more ranks raised, crashed or hung."""


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        # torch._dynamo: torch.optim.Optimizer.__init__ imports it on first use, about 2 s of CPU
        # in every rank that builds an optimizer. (Python 3.11's fork server does not apply the
        # parent's sys.path, so only installed modules can be named here.)
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "numpy", "accord", "accord.torch"])
    return _CTX


def _rank_main(fn, rank, size, args, env, init, store_port, results, stack_file):
    # Each rank: stacks to a file on SIGUSR1 (hang diagnosis), the contract env, then fn. What
    # the rank inherited from the fork server is frozen out of the garbage collector: the full
    # collection in accord's shutdown() then walks only what fn made, not torch's whole graph.
    gc.freeze()
    with open(stack_file, "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        os.environ.update(env)
        try:
            import torch

            torch.set_num_threads(1)
            if init == "torch" or init.startswith("torch:"):
                from datetime import timedelta

                import torch.distributed as dist

                backend = init.partition(":")[2] or "gloo"
                if backend == "accord":
                    import accord.distributed  # noqa: F401 (registers the backend's name)
                store = dist.TCPStore("127.0.0.1", store_port, size, is_master=False,
                                      timeout=timedelta(seconds=30))
                dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                        timeout=timedelta(seconds=30))
            try:
                value = fn(rank, size, *args)
            finally:
                if init.startswith("torch"):  # torchrun's fn may leave its group too
                    import torch.distributed as dist

                    from accord.group_teardown import destroy_process_group

                    if dist.is_initialized():
                        destroy_process_group()  # (torch < 2.8's Gloo teardown deadlock avoided)
            results.put((rank, "ok", value))
        except BaseException:  # report everything, including SystemExit, to the parent
            results.put((rank, "error", traceback.format_exc()))


def torchrun_env(rank: int, size: int, store_port: int) -> dict[str, str]:
    """The environment torchrun gives a worker on a single host whose agent hosts the store."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none",
        "OMP_NUM_THREADS": "1",
    }


def rank_env(rank: int, size: int, init: str, store_port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a rank started with ``init`` finds in its environment, plus ``extra``."""
    if init == "torchrun":
        return {**torchrun_env(rank, size, store_port), **(extra or {})}
    return worker_env(rank, size, extra)


def worker_env(rank: int, size: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment accordrun gives a worker on a single host."""
    env = {
        "ACCORD_RANK": str(rank),
        "ACCORD_SIZE": str(size),
        "ACCORD_LOCAL_RANK": str(rank),
        "ACCORD_LOCAL_SIZE": str(size),
        "ACCORD_CROSS_RANK": "0",
        "ACCORD_CROSS_SIZE": "1",
        "ACCORD_HOSTNAME": "localhost",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra or {})
    return env


def run_ranks(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    timeout: float = 60.0,
    init: str = "torch",
    env: dict[str, str] | None = None,
    per_rank_env: Callable[[int], dict[str, str]] | None = None,
) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` ranks; return results in rank order.

    ``fn`` must be importable (defined at module level) and its results picklable. ``init``:
    ``"torch"`` (torch.distributed's default group on Gloo, over a TCPStore), ``"torch:<backend>"``
    (the same with that backend, e.g. ``"torch:accord"``), ``"torchrun"`` (torchrun's store and
    environment; ``fn`` initialises), ``"accord"`` (accord's store and the worker contract, as
    accordrun gives them) or anything else for none.
    """
    ctx = _context()
    results = ctx.Queue()
    store = None
    store_port = 0
    common = dict(env or {})
    if init.startswith("torch"):
        store = agent_store(nprocs)
        store_port = store.port
    elif init == "accord":
        store, extra = _start_accord_store()
        common.update(extra)

    tmp = tempfile.mkdtemp(prefix="accord-ranks-")
    stack_files = [os.path.join(tmp, f"stacks.{r}") for r in range(nprocs)]
    procs = []
    try:
        for rank in range(nprocs):
            env_of_rank = rank_env(rank, nprocs, init, store_port, common)
            if per_rank_env is not None:
                env_of_rank.update(per_rank_env(rank))
            p = ctx.Process(
                target=_rank_main,
                args=(fn, rank, nprocs, args, env_of_rank, init, store_port, results, stack_files[rank]),
                daemon=True,
            )
            p.start()
            procs.append(p)
        return _collect(procs, results, nprocs, timeout, stack_files)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        if store is not None and hasattr(store, "close"):
            store.close()
        del store
        shutil.rmtree(tmp, ignore_errors=True)  # the stack dumps were read by _hang_report


def agent_store(nprocs: int) -> Any:
    """A ``TCPStore`` on a free loopback port (port 0: the OS picks it, so there is no race),
    hosted here as torchrun's agent hosts it."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=30))


def _collect(procs, results, nprocs, timeout, stack_files) -> list[Any]:
    deadline = time.monotonic() + timeout
    got: dict[int, tuple[str, Any]] = {}
    while len(got) < nprocs:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RanksFailed(_hang_report(procs, got, timeout, stack_files))
        try:
            rank, status, value = results.get(timeout=min(0.2, remaining))
            got[rank] = (status, value)
            continue
        except queue.Empty:
            pass
        # A rank that died without reporting (SIGKILL, os._exit) is a failure too.
        dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
        if dead:
            time.sleep(0.5)  # let its last queue message (if any) arrive
            while True:
                try:
                    rank, status, value = results.get_nowait()
                    got[rank] = (status, value)
                except queue.Empty:
                    break
            dead = [r for r in dead if r not in got]
            for r in dead:
                got[r] = ("error", f"rank {r} exited with code {procs[r].exitcode} without a result")
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    if errors:
        text = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise RanksFailed(f"{len(errors)} of {nprocs} ranks failed:\n{text}")
    return [got[r][1] for r in range(nprocs)]


def _hang_report(procs, got, timeout, stack_files) -> str:
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(1.0)
    parts = [f"timed out after {timeout:.0f}s; ranks done: {sorted(got)}"]
    for r, path in enumerate(stack_files):
        if r in got:
            continue
        try:
            with open(path) as fh:
                parts.append(f"--- rank {r} stacks ---\n{fh.read()}")
        except OSError:
            parts.append(f"--- rank {r}: no stack dump ---")
    return "\n".join(parts)


def _start_accord_store():
    """Start accord's authenticated store on a free loopback port; return it and the env."""
    import secrets

    from accord.store.server import StoreServer

    secret = secrets.token_bytes(32)
    server = StoreServer(host="127.0.0.1", port=0, secret=secret)
    server.start()
    env = {
        "ACCORD_STORE_ADDR": "127.0.0.1",
        "ACCORD_STORE_PORT": str(server.port),
        "ACCORD_JOB_SECRET": secret.hex(),
    }
    return server, env
