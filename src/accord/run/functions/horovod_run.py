"""``accord.run(fn, ...)``: Horovod's ``horovod.run`` (run a Python function as a job and get every
rank's return value), on this host.

Same signature and meaning as horovod.run (Horovod 0.28): ``func(*args, **kwargs)`` runs on
``num_proc`` workers and the list of return values comes back in rank order; ``np``, ``min_np``
and ``max_np`` are the deprecated spellings; ``hosts`` and ``hostfile`` together, or
``use_gloo`` and ``use_mpi`` together, raise ValueError. The workers are :func:`accord.spawn`'s:
a function they cannot import (a notebook's, a lambda) is sent by value with cloudpickle, as
horovod.run sends every function. Worker lines reach the console prefixed ``[rank]<stdout>:``
as horovod.run forwards them; ``output_filename`` also writes ``rank.N/stdout`` and ``stderr``
as accordrun's flag does.

Only this host: ``hosts``/``hostfile`` may name it (``localhost:4``) and bound the workers to
its slots. Another host, elastic settings (``min_num_proc``, ``max_num_proc``, ``reset_limit``,
``cooldown_range``) and the MPI controller are refused with a ConfigError and a HINT to start a
script with accordrun instead: sending a pickled function to other hosts and its results back
would need pickle over the network, which accord does not accept. The ssh settings, the start
timeout, ``disable_cache``, ``network_interface``, ``slots`` and ``verbose`` concern remote or
elastic starts and change nothing here.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any, Callable, Mapping, Sequence

from accord.errors import ConfigError, with_hint
from accord.run.spec.hosts import HostSlots, is_local, parse_hostfile, parse_hosts

_SCRIPT_HINT = "write the function's work as a script and start it with accordrun -np N -H host:slots,..."


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int = 1,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[int, int] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    start_timeout: int | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: bool | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` workers of this host; return their results
    in rank order.

    The signature is horovod.run's (Horovod 0.28). What concerns other hosts, elastic jobs or
    MPI is refused with a ConfigError and a HINT to start a script with accordrun; the ssh,
    cache, timeout and interface settings concern remote starts and change nothing here.

    Args:
        func: the function each worker runs (one it cannot import, a lambda or a notebook's,
            is sent by value with cloudpickle).
        args: its positional arguments.
        kwargs: its keyword arguments.
        num_proc: how many workers (ranks), at least 1.
        min_num_proc: elastic: refused (ConfigError).
        max_num_proc: elastic: refused as well.
        slots: accepted; ``hosts``/``hostfile`` give this host's slots.
        reset_limit: elastic, refused.
        cooldown_range: elastic, refused too.
        hosts: ``"localhost:4"``-style list; it may name this host only, and bounds the
            workers to its slots.
        hostfile: a hostfile with the same meaning (not together with ``hosts``).
        start_timeout: accepted; no effect on this host.
        ssh_port: accepted; nothing is started over ssh.
        ssh_identity_file: accepted, unused (no ssh).
        disable_cache: accepted; no effect.
        output_filename: also write each worker's output to ``<output_filename>/rank.N/stdout``
            and ``stderr``, as accordrun's flag does.
        verbose: accepted; no effect.
        use_gloo: accepted (accord picks its own transport); not with ``use_mpi``.
        use_mpi: True is refused (accord starts its own workers).
        mpi_args: refused when given (no mpirun here).
        network_interface: accepted; no effect on one host.
        executable: must be this Python (``sys.executable``) when given; another is refused.
        np: deprecated spelling of ``num_proc`` (DeprecationWarning).
        min_np: deprecated spelling of ``min_num_proc``.
        max_np: deprecated spelling of ``max_num_proc``.

    Returns:
        Each worker's return value, in rank order.

    Raises:
        ValueError: both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``.
        ConfigError (a ValueError): another host, more workers than the hosts' slots, elastic or
            MPI settings, another ``executable``, or ``num_proc`` < 1.
        WorkerFailedError: a worker raised or died (the others are stopped).
    """
    if np is not None:
        if num_proc == 1:  # as Horovod: the old name counts only when num_proc was left alone
            num_proc = np
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=_caller_level())
    if min_np is not None:
        min_num_proc = min_num_proc if min_num_proc is not None else min_np
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=_caller_level())
    if max_np is not None:
        max_num_proc = max_num_proc if max_num_proc is not None else max_np
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=_caller_level())
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    _refuse_unsupported(min_num_proc, max_num_proc, reset_limit, cooldown_range, use_mpi, mpi_args,
                        executable)
    if num_proc < 1:
        raise ConfigError(with_hint(f"accord.run needs num_proc >= 1, got {num_proc}", "pass num_proc=2"))
    _check_hosts(_host_list(hosts, hostfile), num_proc)
    options: dict[str, Any] = {"prefix_output": True}  # horovod.run's [rank]<stdout>: lines
    if output_filename is not None:
        options["output_filename"] = output_filename
    from accord.run.functions.spawn import spawn

    target = functools.partial(func, **kwargs) if kwargs else func
    results = spawn(target, args=tuple(args), nprocs=num_proc, **options)
    assert isinstance(results, list)
    return results


def _refuse_unsupported(min_num_proc: int | None, max_num_proc: int | None, reset_limit: int | None,
                        cooldown_range: Any, use_mpi: bool | None, mpi_args: str | None,
                        executable: str | None) -> None:
    elastic = {name: value for name, value in (("min_num_proc", min_num_proc), ("max_num_proc", max_num_proc),
                                                 ("reset_limit", reset_limit), ("cooldown_range", cooldown_range))
               if value is not None}
    if elastic:
        raise ConfigError(with_hint(f"accord.run does not run elastic jobs (got {elastic})",
                                    "start an elastic job with accordrun --min-np N --host-discovery-script ..."))
    if use_mpi or mpi_args is not None:
        raise ConfigError(with_hint(f"accord.run starts its own workers; use_mpi={use_mpi!r}, "
                                    f"mpi_args={mpi_args!r} ask for mpirun's",
                                    "start a script under mpirun instead (accord workers start under it)"))
    if executable is not None and os.path.realpath(executable) != os.path.realpath(sys.executable):
        raise ConfigError(with_hint(f"accord.run runs its workers with this Python ({sys.executable}), "
                                    f"not executable={executable!r}",
                                    "call accord.run from the Python the workers should use, or leave executable out"))


def _host_list(hosts: str | None, hostfile: str | None) -> list[HostSlots] | None:
    if hosts is not None:
        return parse_hosts(hosts)
    if hostfile is not None:
        return parse_hostfile(hostfile)
    return None


def _check_hosts(listed: list[HostSlots] | None, num_proc: int) -> None:
    if listed is None:  # Horovod's default: localhost with num_proc slots
        return
    remote = [h.hostname for h in listed if not is_local(h.hostname)]
    if remote:
        raise ConfigError(with_hint(f"accord.run runs functions on this host only; hosts {remote} are others",
                                    _SCRIPT_HINT))
    slots = sum(h.slots for h in listed)
    if num_proc > slots:
        raise ConfigError(with_hint(f"accord.run: num_proc={num_proc} is more than the {slots} slots of "
                                    f"{[f'{h.hostname}:{h.slots}' for h in listed]}",
                                    f"pass num_proc={slots} or list more slots"))


def _caller_level() -> int:
    """The ``stacklevel`` that makes a warning of :func:`run` name its caller's line: one more
    when the call came through the callable package (``accord.run(...)``, its ``__call__``)."""
    import sys

    through_package = sys._getframe(2).f_globals.get("__name__") == "accord.run"
    return 3 if through_package else 2
