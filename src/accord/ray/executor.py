"""``accord.ray.RayExecutor``: Horovod's ``horovod.ray.RayExecutor``, on accord.

Same constructor and methods as Horovod 0.28's::

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train, args=[config])      # one result per rank, in rank order
    executor.shutdown()

Fixed-size jobs (``num_workers``, or ``num_hosts`` x ``num_workers_per_host``) are
:mod:`accord.ray.static`; ``min_workers``/``max_workers`` make an elastic job
(:mod:`accord.ray.elastic`) that re-forms as Ray's nodes come and go, with ``hvd.elastic.run``
in the function. ``callbacks`` (Horovod's queue of rank 0's logged values) are not supported:
they are refused with a HINT.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from accord.errors import ConfigError, with_hint
from accord.ray.settings import RaySettings, create_settings


class RayExecutor:
    """A job of accord workers on Ray actors (see the module docstring and docs/ray.md).

    Args:
        settings: :meth:`create_settings`'s result.
        num_workers: workers of a fixed-size job.
        num_hosts, num_workers_per_host: instead of ``num_workers``: that many workers on each
            of ``num_hosts`` distinct nodes.
        cpus_per_worker, use_gpu, gpus_per_worker: the Ray resources of each worker.
        use_current_placement_group: inside a placement group (Ray Tune), place the workers in it.
        min_workers, max_workers: an elastic job: it starts once ``min_workers`` slots exist, on
            up to ``max_workers``, and re-forms as nodes leave or join.
        reset_limit, cooldown_range, elastic_timeout: the elastic job's limits, as horovodrun's
            ``--reset-limit``, ``--blacklist-cooldown-range`` and ``--elastic-timeout``.
        override_discovery: must stay True: the elastic job discovers Ray's nodes itself.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: float = 100,
                        nics: Iterable[str] | None = None) -> RaySettings:
        """The job's settings (:class:`~accord.ray.settings.RaySettings`)."""
        return create_settings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file, ssh_str=ssh_str,
                               placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings: RaySettings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: Sequence[float] | None = None, elastic_timeout: float = 600,
                 override_discovery: bool = True) -> None:
        if max_workers and (not min_workers or min_workers <= 0):
            raise ConfigError(with_hint("RayExecutor: max_workers needs a positive min_workers",
                                        "pass min_workers=1 with max_workers, or num_workers for a fixed job"))
        if min_workers and num_workers:
            raise ConfigError(with_hint("RayExecutor got both min_workers and num_workers: a job is elastic "
                                        "or of fixed size", "pass min_workers (elastic) or num_workers"))
        if gpus_per_worker and not use_gpu:
            raise ConfigError(with_hint("RayExecutor: gpus_per_worker is set but use_gpu is False",
                                        "pass use_gpu=True with gpus_per_worker"))
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ConfigError(with_hint(f"RayExecutor: gpus_per_worker must be >= 1, got {gpus_per_worker}",
                                        "pass gpus_per_worker=1"))
        if cpus_per_worker < 0:
            raise ConfigError(with_hint(f"RayExecutor: cpus_per_worker must be >= 0, got {cpus_per_worker}",
                                        "pass cpus_per_worker=1"))
        gpus = (gpus_per_worker or 1) if use_gpu else 0
        self.settings = settings
        self._job: Any
        if min_workers is not None:
            if not override_discovery:
                raise ConfigError(with_hint("RayExecutor: override_discovery=False (a discovery of your own) "
                                            "is not supported", "leave override_discovery=True: the job "
                                            "follows Ray's nodes"))
            from accord.ray.elastic import ElasticJob

            self._job = ElasticJob(settings, min_workers=min_workers, max_workers=max_workers,
                                   reset_limit=reset_limit, cooldown_range=cooldown_range,
                                   elastic_timeout=elastic_timeout, cpus_per_worker=cpus_per_worker,
                                   use_gpu=use_gpu, gpus_per_worker=gpus)
        else:
            from accord.ray.static import StaticJob

            self._job = StaticJob(settings, num_workers=num_workers, num_hosts=num_hosts,
                                  num_workers_per_host=num_workers_per_host, cpus_per_worker=cpus_per_worker,
                                  use_gpu=use_gpu, gpus_per_worker=gpus,
                                  use_current_placement_group=use_current_placement_group)
        self.settings.elastic = min_workers is not None

    def start(self, executable_cls: Callable[..., Any] | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, str] | None = None) -> None:
        """Start the workers (an elastic job starts them at each :meth:`run`); build
        ``executable_cls(*executable_args, **executable_kwargs)`` in each, for :meth:`execute`;
        ``extra_env_vars`` are set in every worker."""
        self._job.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: Sequence[Callable[..., Any]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; their return values in rank order.

        Raises:
            WorkerFailedError: a worker raised (its traceback in the message) or its actor died;
                the other workers were stopped.
        """
        _no_callbacks(callbacks)
        return self._job.call(fn, list(args or ()), dict(kwargs or {}), False)

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[..., Any]] | None = None) -> list[Any]:
        """``fn(executable)`` on every worker (the object ``executable_cls`` built); results in rank order."""
        _no_callbacks(callbacks)
        return self._job.call(fn, None, None, True)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only; its result."""
        return self._job.call(fn, None, None, True, ranks=[0])[0]

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker, without waiting: one ``ObjectRef`` per rank."""
        return self._job.call_remote(fn, list(args or ()), dict(kwargs or {}))

    def shutdown(self) -> None:
        """End the workers and release their resources and the job's store."""
        self._job.shutdown()


def _no_callbacks(callbacks: Sequence[Callable[..., Any]] | None) -> None:
    if callbacks:
        raise ConfigError(with_hint("RayExecutor: callbacks are not supported",
                                    "return what rank 0 should report from the function, or report it "
                                    "with ray.train.report under Ray Train"))
