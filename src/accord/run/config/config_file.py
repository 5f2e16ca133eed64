"""horovodrun's ``--config-file``: a YAML file of settings, read into accordrun's flags.

The file has horovodrun's sections (``params``, ``autotune``, ``timeline``, ``stall_check``,
``library_options``, ``logging``, ``controller``); each key fills the flag of the same meaning
unless that flag was given on the command line, which wins (as in horovodrun, whose command-line
flags are not overwritten by the file). Keys accordrun does not know are named in a warning and
ignored, as horovodrun ignores them. Reading YAML needs PyYAML (``pip install pyyaml``).
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from accord.errors import ConfigError, with_hint
from accord.run.spec import autotune_values

# (section, key) -> (namespace dest, how the value is read)
_KEYS: dict[tuple[str, str], tuple[str, Callable[[Any], Any]]] = {
    ("params", "fusion_threshold_mb"): ("fusion_threshold_mb", float),
    ("params", "cycle_time_ms"): ("cycle_time_ms", float),
    ("params", "cache_capacity"): ("cache_capacity", int),
    ("params", "hierarchical_allgather"): ("hvd_hierarchical_allgather", bool),
    ("autotune", "enabled"): ("hvd_autotune", bool),
    ("autotune", "log_file"): ("hvd_autotune_log_file", str),
    ("autotune", "warmup_samples"): ("hvd_autotune_warmup_samples", int),
    ("autotune", "steps_per_sample"): ("hvd_autotune_steps_per_sample", int),
    ("autotune", "bayes_opt_max_samples"): ("hvd_autotune_bayes_opt_max_samples", int),
    ("autotune", "gaussian_process_noise"): ("hvd_autotune_gaussian_process_noise", float),
    ("timeline", "filename"): ("timeline_filename", str),
    ("timeline", "mark_cycles"): ("timeline_mark_cycles", bool),
    ("stall_check", "warning_time_seconds"): ("stall_check_warning_time_seconds", float),
    ("stall_check", "shutdown_time_seconds"): ("stall_check_shutdown_time_seconds", float),
    ("library_options", "mpi_threads_disable"): ("hvd_mpi_threads_disable", bool),
    ("library_options", "num_nccl_streams"): ("hvd_num_nccl_streams", int),
    ("library_options", "thread_affinity"): ("hvd_thread_affinity", int),
    ("library_options", "gloo_timeout_seconds"): ("gloo_timeout_seconds", float),
    ("logging", "level"): ("log_level", str),
    ("logging", "with_timestamp"): ("hvd_log_with_timestamp", bool),
}
# keys whose false value is a flag of its own
_TWO_FLAGS = {("params", "hierarchical_allreduce"): ("hierarchical_allreduce", "no_hierarchical_allreduce"),
              ("stall_check", "enabled"): (None, "no_stall_check")}


def _load(path: str) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise ConfigError(with_hint("--config-file needs PyYAML, which is not installed",
                                    "pip install pyyaml")) from None
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(with_hint(f"--config-file {path!r} cannot be read: {exc.strerror}",
                                    "pass the path of horovodrun's YAML config file")) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(with_hint(f"--config-file {path!r} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                                    "pass horovodrun's YAML config file")) from None
    except yaml.YAMLError as exc:
        raise ConfigError(with_hint(f"--config-file {path!r} is not valid YAML: {exc}",
                                    "fix the file (horovodrun's format: sections such as params, timeline)")) from None
    if document is None:
        return {}
    if not isinstance(document, dict) or not all(isinstance(v, dict) or k == "controller"
                                                 for k, v in document.items()):
        raise ConfigError(with_hint(f"--config-file {path!r} must map sections to settings, got {document!r}",
                                    "write e.g. 'params:' then '  fusion_threshold_mb: 32'"))
    return document


def _unset(ns: argparse.Namespace, dest: str | None) -> bool:
    return dest is None or getattr(ns, dest, None) in (None, False)


def _quietly_changed(value: Any, kind: Callable[[Any], Any]) -> bool:
    """True for the values int() and float() would read without an error but wrongly: true as
    1, 1.5 as 1."""
    if kind not in (int, float):
        return False
    return isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer())


def _read(value: Any, kind: Callable[[Any], Any], where: str) -> Any:
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(with_hint(f"--config-file: {where} must be true or false, got {value!r}",
                                    f"write {where.split('.')[-1]}: true"))
    if _quietly_changed(value, kind):
        noun = "whole number" if kind is int else "number"
        raise ConfigError(with_hint(f"--config-file: {where} must be a {noun}, got {value!r}",
                                    f"write {where.split('.')[-1]} with a {noun}"))
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(with_hint(f"--config-file: {where} must be a {kind.__name__}, got {value!r}",
                                    f"write {where.split('.')[-1]} with a {kind.__name__} value")) from None


def apply(ns: argparse.Namespace) -> list[str]:
    """Fill ``ns`` from ``ns.hvd_config_file`` (when given); return warnings (unknown keys).

    Raises:
        ConfigError: the file is missing or not YAML, a value has the wrong type (or, for the
            autotune counts and noise, is out of range), or it names the MPI controller
            (accordrun does not start mpirun).
    """
    path = getattr(ns, "hvd_config_file", None)
    if path is None:  # an empty path is refused by _load, as a missing file
        return []
    unknown = []
    for section, settings in _load(path).items():
        if section == "controller":
            if str(settings).lower() == "mpi":
                ns.hvd_use_mpi = True  # refused with --mpi's HINT
            elif str(settings).lower() != "gloo":
                raise ConfigError(with_hint(f"--config-file: controller {settings!r} is not one of gloo, mpi",
                                            "write controller: gloo (or leave it out)"))
            continue
        for key, value in settings.items():
            where = f"{section}.{key}"
            if (section, key) in _TWO_FLAGS:
                on, off = _TWO_FLAGS[(section, key)]
                flag = _read(value, bool, where)
                dest = on if flag else off
                if _unset(ns, on) and _unset(ns, off) and dest is not None:
                    setattr(ns, dest, True)
            elif (section, key) in _KEYS:
                dest, kind = _KEYS[(section, key)]
                if _unset(ns, dest) and value is not None:
                    setattr(ns, dest, _read(value, kind, where))
                    autotune_values.check_value(dest, getattr(ns, dest), f"--config-file: {where}")
            else:
                unknown.append(where)
    if not unknown:
        return []
    what = "is not a horovodrun setting" if len(unknown) == 1 else "are not horovodrun settings"
    return [f"--config-file {path}: {', '.join(unknown)} {what} accordrun knows: ignored"]
