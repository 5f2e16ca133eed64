"""horovodrun's flags that have no accordrun counterpart of their own, so that a horovodrun
command line runs under accordrun with only the program's name changed.

Three kinds (horovodrun 0.28.1's parser is the reference):

- satisfied as they are: ``--gloo`` (accord's CPU path is Gloo, or shared memory on one host),
  ``--tcp`` (Gloo and the store use TCP only; for NCCL it sets ``NCCL_IB_DISABLE=1`` in the
  workers, as horovodrun does: :func:`worker_variables`), ``--disable-cache`` (accordrun caches no checks),
  ``--stall-check`` (on by default), and the hidden ``--no-*`` forms of horovodrun's defaults;
- about features accord does not have (autotuning, NCCL stream count, thread affinity, MPI's
  threading level, hierarchical allgather, timestamps in Horovod's own log lines): accepted, and
  the launcher says once that they are ignored, since they change speed or logs, not results
  (an autotune value no autotuner could use is refused all the same: :mod:`accord.run.spec.autotune_values`);
- ``--mpi``, ``--jsrun``, ``--mpi-args``, ``--binding-args`` (accordrun does not start mpirun or
  jsrun): refused with exit 2 and a HINT.

``--config-file`` (horovodrun's YAML settings) is read by :mod:`accord.run.config.config_file`.
"""
from __future__ import annotations

import argparse

from accord.errors import ConfigError, with_hint
from accord.run.spec import autotune_values

# dest -> (the flag as shown, takes a value)
_IGNORED: dict[str, tuple[str, bool]] = {
    "autotune": ("--autotune", False),
    "autotune_log_file": ("--autotune-log-file", True),
    "autotune_warmup_samples": ("--autotune-warmup-samples", True),
    "autotune_steps_per_sample": ("--autotune-steps-per-sample", True),
    "autotune_bayes_opt_max_samples": ("--autotune-bayes-opt-max-samples", True),
    "autotune_gaussian_process_noise": ("--autotune-gaussian-process-noise", True),
    "hierarchical_allgather": ("--hierarchical-allgather", False),
    "no_hierarchical_allgather": ("--no-hierarchical-allgather", False),
    "num_nccl_streams": ("--num-nccl-streams", True),
    "thread_affinity": ("--thread-affinity", True),
    "mpi_threads_disable": ("--mpi-threads-disable", False),
    "log_with_timestamp": ("--log-with-timestamp", False),
    "log_without_timestamp": ("--log-without-timestamp", False),
    "log_hide_timestamp": ("--log-hide-timestamp", False),
    "no_log_hide_timestamp": ("--no-log-hide-timestamp", False),
}
# What these ask for is what accord does anyway (the --no-* ones restate horovodrun's defaults).
_SATISFIED = {"gloo": "--gloo", "tcp": "--tcp", "disable_cache": "--disable-cache",
              "stall_check": "--stall-check", "no_autotune": "--no-autotune",
              "no_timeline_mark_cycles": "--no-timeline-mark-cycles",
              "no_mpi_threads_disable": "--no-mpi-threads-disable"}
_REFUSED: dict[str, tuple[str, bool, str]] = {
    "use_mpi": ("--mpi", False, "accordrun does not start mpirun; accord's workers start under "
                                "mpirun themselves: mpirun -np N python train.py (docs/launcher.md, "
                                "'Without accordrun'); ACCORD_CPU_BACKEND=mpi for MPI collectives"),
    "use_jsrun": ("--jsrun", False, "start the workers with jsrun itself, as with mpirun "
                                    "(docs/launcher.md, 'Without accordrun')"),
    "mpi_args": ("--mpi-args", True, "accordrun does not start mpirun: run mpirun with those "
                                     "arguments yourself (docs/launcher.md, 'Without accordrun')"),
    "binding_args": ("--binding-args", True, "accordrun does not start mpirun: pass the binding "
                                             "to mpirun yourself, or set OMP_NUM_THREADS"),
}


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The flags, under their horovodrun names (hidden from --help but for a group line)."""
    group.add_argument("--config-file", dest="hvd_config_file", metavar="FILE", help=argparse.SUPPRESS)
    for dest, flag in _SATISFIED.items():
        group.add_argument(flag, dest=f"hvd_{dest}", action="store_true", help=argparse.SUPPRESS)
    for table in (_IGNORED, _REFUSED):
        for dest, (flag, *rest) in table.items():
            takes_value = rest[0]
            if takes_value:
                group.add_argument(flag, dest=f"hvd_{dest}", metavar="VALUE", help=argparse.SUPPRESS)
            else:
                group.add_argument(flag, dest=f"hvd_{dest}", action="store_true", help=argparse.SUPPRESS)


def _given(ns: argparse.Namespace, dest: str) -> bool:
    value = getattr(ns, f"hvd_{dest}", None)
    return value is not None and value is not False


def check(ns: argparse.Namespace) -> list[str]:
    """Warnings for the ignored flags given (one line each).

    Raises:
        ConfigError: a refused flag was given (what to do instead in the HINT), or an
            ``--autotune-*`` value no autotuner could use (:mod:`accord.run.spec.autotune_values`).
    """
    for dest, (flag, _, hint) in _REFUSED.items():
        if _given(ns, dest):
            raise ConfigError(with_hint(f"horovodrun's {flag} is not supported by accordrun", hint))
    autotune_values.check_flags(ns)
    ignored = [flag for dest, (flag, _) in _IGNORED.items() if _given(ns, dest)]
    if not ignored:
        return []
    return [f"horovodrun's {', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect "
            "with accord (no autotuner, NCCL stream count, thread affinity, hierarchical allgather "
            "or Horovod log timestamps): ignored"]


def worker_variables(ns: argparse.Namespace) -> dict[str, str]:
    """Variables the workers need for the horovodrun flags given: ``--tcp`` keeps NCCL off
    InfiniBand (``NCCL_IB_DISABLE=1``), as horovodrun sets it."""
    return {"NCCL_IB_DISABLE": "1"} if _given(ns, "tcp") else {}
