"""A RayExecutor job of fixed size: ``num_workers`` actors (or ``num_hosts`` x
``num_workers_per_host``) in a placement group, ranked by node (:mod:`accord.ray.layout`).

``start()`` reserves the resources (waiting up to ``placement_group_timeout_s``), starts the
actors, hosts the store (:mod:`accord.ray.hosting`) and gives every actor its environment.
``run``/``execute`` then call a function on every rank and return the results in rank order.
The first failure (a function that raised, an actor that died) stops every worker, releases
the placement group and the store, and is raised as :class:`~accord.errors.WorkerFailedError`
naming the rank (:mod:`accord.ray.failures`): a rank that waits for a dead peer would otherwise
wait for its collective's timeout. ``start()`` again begins a new job.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from accord.errors import ConfigError, LaunchError, RankFailedError, ShutdownError, WorkerFailedError, with_hint
from accord.ray import failures
from accord.ray.actor import ERROR, LEFT, Worker
from accord.ray.hosting import HostedStore, bind_address
from accord.ray.layout import environment, place, visible_devices
from accord.ray.requirement import need_ray
from accord.ray.settings import RaySettings
from accord.run.spec.worker_env import JobEnv

CLOSE_TIMEOUT_S = 10.0  # how long a worker may take to shut its engine down at shutdown()
DEAD_TIMEOUT_S = 30.0  # how long Ray may take to confirm a killed actor is gone
# how long a rank that lost its peer waits for the peer's own failure to be reported, so that
# the error names the rank that died rather than the one that noticed
ROOT_CAUSE_WAIT_S = 15.0


def error_is_secondary(error: WorkerFailedError) -> bool:
    """Whether ``error`` is a rank's collective failing because another rank failed first."""
    return isinstance(error.__cause__, (RankFailedError, ShutdownError))


def check_driver(ray: Any) -> None:
    """Refuse a Ray Client connection: the workers must reach this process's store."""
    if ray.util.client.ray.is_connected():
        raise ConfigError(with_hint(
            "RayExecutor runs its driver (which hosts the job's store) in this process, but this "
            "process is connected to the cluster through Ray Client (ray://), outside the cluster",
            "run the script on a node of the cluster, e.g. with `ray job submit -- python train.py`"))


def kill_all(ray: Any, workers: Sequence[Any]) -> None:
    """End the actors and wait (up to :data:`DEAD_TIMEOUT_S`) until Ray reports them dead."""
    for w in workers:
        try:
            ray.kill(w, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    probes = [w.__ray_ready__.remote() for w in workers]
    if probes:
        ray.wait(probes, num_returns=len(probes), timeout=DEAD_TIMEOUT_S)


class StaticJob:
    """The workers of one fixed-size job (see the module docstring)."""

    def __init__(self, settings: RaySettings, num_workers: int | None, num_hosts: int | None,
                 num_workers_per_host: int, cpus_per_worker: float, use_gpu: bool,
                 gpus_per_worker: float, use_current_placement_group: bool) -> None:
        self.settings = settings
        if num_workers is None and num_hosts is None:
            raise ConfigError(with_hint("RayExecutor needs num_workers (or num_hosts)", "pass num_workers=2"))
        if num_workers is not None and num_hosts is not None:
            raise ConfigError(with_hint("RayExecutor got both num_workers and num_hosts",
                                        "pass one of them (num_hosts with num_workers_per_host)"))
        self.num_hosts = num_hosts
        self.per_host = int(num_workers_per_host)
        self.num_workers = int(num_workers) if num_workers is not None else int(num_hosts or 0) * self.per_host
        if self.num_workers < 1:
            raise ConfigError(with_hint(f"RayExecutor needs at least one worker, got {self.num_workers}",
                                        "pass num_workers=2"))
        self.cpus = cpus_per_worker
        self.gpus = gpus_per_worker if use_gpu else 0
        self.use_gpu = use_gpu
        self.use_current_pg = use_current_placement_group
        self.workers: list[Any] = []  # actor handles, in rank order
        self.descriptions: list[dict[str, Any]] = []
        self._pg: Any = None
        self._own_pg = False
        self._store: HostedStore | None = None

    # --- start ------------------------------------------------------------------------------------
    def start(self, executable_cls: Callable[..., Any] | None, executable_args: Any, executable_kwargs: Any,
              extra_env_vars: dict[str, str] | None) -> None:
        ray = need_ray()
        check_driver(ray)
        if self.workers or self._store is not None:
            self.shutdown()
        try:
            actors = self._start_actors(ray)
            self.workers = actors  # known at once: a failure below must still end them
            described = self._wait(ray, [w.describe.remote() for w in actors], "start its actors")
            placed = place(described)
            self.workers = [actors[p.actor] for p in placed]
            self.descriptions = [described[p.actor] for p in placed]
            self._store = HostedStore(bind_address(ray.util.get_node_ip_address(),
                                                   [d["ip"] for d in described], False,
                                                   next(iter(self.settings.nics or ()), None)))
            rank0 = self.descriptions[0]
            job = JobEnv(job_id=self._store.job_id, master_addr=rank0["ip"], master_port=rank0["free_port"],
                         store_addr=self._store.address, store_port=self._store.port)
            extra = {**self.settings.worker_variables(), **{str(k): str(v) for k, v in (extra_env_vars or {}).items()}}
            devices = visible_devices(described, placed) if self.use_gpu else {}
            envs = []
            for p in placed:
                env = environment(p.slot, job, self._store.secret_hex, extra)
                if p.actor in devices:
                    env["CUDA_VISIBLE_DEVICES"] = devices[p.actor]
                envs.append(env)
            self._wait(ray, [w.set_env.remote(env) for w, env in zip(self.workers, envs)], "set up its workers")
            self._wait(ray, [w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                             for w in self.workers], "build executable_cls on every worker")
        except BaseException:
            self._stop(ray)
            raise

    def _start_actors(self, ray: Any) -> list[Any]:
        from ray.util.placement_group import get_current_placement_group, placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        current = get_current_placement_group() if self.use_current_pg else None
        if current is not None:  # inside Ray Tune or another job's group: use its bundles
            self._pg, self._own_pg = current, False
            bundle_of = [-1] * self.num_workers
        else:
            per_bundle = self.per_host if self.num_hosts else 1
            bundle = {"CPU": self.cpus * per_bundle, "GPU": self.gpus * per_bundle}
            bundle = {k: v for k, v in bundle.items() if v}
            if not bundle:
                raise ConfigError(with_hint("RayExecutor: each worker asks for no CPU and no GPU",
                                            "pass cpus_per_worker=1"))
            count = self.num_hosts or self.num_workers
            strategy = "STRICT_SPREAD" if self.num_hosts else "PACK"
            self._pg, self._own_pg = placement_group([dict(bundle) for _ in range(count)], strategy=strategy), True
            bundle_of = [i // per_bundle for i in range(self.num_workers)]
            try:
                ray.get(self._pg.ready(), timeout=self.settings.placement_group_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise LaunchError(with_hint(
                    f"RayExecutor: Ray could not reserve {count} x {bundle} ({strategy}) within "
                    f"placement_group_timeout_s={self.settings.placement_group_timeout_s:g}s; the cluster has "
                    f"{ray.cluster_resources()}, {ray.available_resources()} of it free",
                    "lower num_workers or the resources per worker, add nodes, or raise "
                    "placement_group_timeout_s in create_settings")) from None
        remote = ray.remote(Worker)
        return [remote.options(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0, max_task_retries=0,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(
                                   self._pg, placement_group_bundle_index=b)).remote()
                for b in bundle_of]

    def _wait(self, ray: Any, refs: list[Any], doing: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(with_hint(f"RayExecutor: timed out after {self.settings.placement_group_timeout_s:g}s "
                                        f"waiting to {doing}",
                                        "look at `ray status` for actors that cannot be scheduled, or raise "
                                        "placement_group_timeout_s in create_settings")) from None
        except ray.exceptions.RayError as exc:
            raise LaunchError(with_hint(f"RayExecutor: could not {doing}: {type(exc).__name__}: {exc}",
                                        "the error above is Ray's or executable_cls's")) from exc

    # --- calls ------------------------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], args: Any, kwargs: Any, on_executable: bool,
             ranks: Sequence[int] | None = None) -> list[Any]:
        """``fn`` on ``ranks`` (default: every rank); their results in rank order."""
        ray = need_ray()
        if not self.workers:
            raise ConfigError(with_hint("RayExecutor has no workers running", "call start() first"))
        chosen = list(range(len(self.workers))) if ranks is None else list(ranks)
        pending = {self.workers[r].call.remote(fn, args, kwargs, on_executable): r for r in chosen}
        results: dict[int, Any] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                rank = pending.pop(ref)
                error, value = self._outcome(ray, ref, rank)
                if error is not None:
                    if error_is_secondary(error):
                        error = self._root_cause(ray, pending, error)
                    raise self._fail(ray, error)
                results[rank] = value
        return [results[r] for r in chosen]

    def _outcome(self, ray: Any, ref: Any, rank: int) -> tuple[WorkerFailedError | None, Any]:
        """What ``rank``'s call gave: ``(None, result)``, or the failure to raise."""
        who, where = self._who(rank), self._where(rank)
        try:
            status, value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return failures.died(who, rank, where, exc), None
        except ray.exceptions.RayError as exc:  # the actor lives, its result did not come
            return failures.unsent(who, rank, where, exc), None
        if status == ERROR:
            return failures.raised(who, rank, value, where), None
        return None, None if status == LEFT else value

    def _root_cause(self, ray: Any, pending: dict[Any, int], first: WorkerFailedError) -> WorkerFailedError:
        """The failure that caused ``first`` (a rank that lost its peer), when another rank's
        call ends badly within :data:`ROOT_CAUSE_WAIT_S`: the dead actor, not its survivor."""
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=ROOT_CAUSE_WAIT_S)
        later = [e for e in (self._outcome(ray, ref, pending[ref])[0] for ref in ready) if e is not None]
        primary = [e for e in later if not error_is_secondary(e)]
        return primary[0] if primary else first

    def call_remote(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> list[Any]:
        """One ObjectRef per rank (Ray's own error handling)."""
        if not self.workers:
            raise ConfigError(with_hint("RayExecutor has no workers running", "call start() first"))
        return [w.call_plain.remote(fn, args, kwargs) for w in self.workers]

    def _who(self, rank: int) -> str:
        return f"rank {rank} of {len(self.workers)}"

    def _where(self, rank: int) -> str:
        return failures.where(self.descriptions[rank]) if rank < len(self.descriptions) else "not started"

    def _fail(self, ray: Any, error: Exception) -> Exception:
        self._stop(ray)
        return error

    # --- the end ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Shut every worker's engine down, end the actors, release the resources and the store."""
        if not self.workers and self._store is None and self._pg is None:
            return
        ray = need_ray()
        if self.workers:
            ray.wait([w.close.remote() for w in self.workers], num_returns=len(self.workers),
                     timeout=CLOSE_TIMEOUT_S)
        self._stop(ray)

    def _stop(self, ray: Any) -> None:
        workers, self.workers, self.descriptions = self.workers, [], []
        kill_all(ray, workers)
        if self._pg is not None and self._own_pg:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
        self._pg = None
        if self._store is not None:
            self._store.close()
            self._store = None
