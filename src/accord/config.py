"""The one module that reads (and writes) environment variables.

Every variable accord understands is declared once in ``VARIABLES`` with its type, default and a
one-line doc. Horovod's and MXNet's names are accepted as aliases where they mean the same thing;
accord's own name wins when both are set. Other modules never touch ``os.environ``: they call
:func:`get`, :func:`snapshot` (a copy, for detecting foreign launchers or building a child's
environment) or :func:`set_variables`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from accord.errors import ConfigError, with_hint

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def parse_bool(text: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parse_level(text: str) -> int:
    """Parse a verbosity level 0, 1, 2, ... (ps-lite's PS_VERBOSE); true/false, yes/no, on/off
    count as 1/0 so that older boolean settings keep working."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    try:
        return int(parse_bool(value))
    except ValueError:
        raise ValueError(f"not a level (0, 1, 2) or a boolean: {text!r}") from None


def finite_float(text: str) -> float:
    """Parse a finite number; NaN and infinity are refused (a NaN timeout never expires, an
    infinite one overflows the clocks it is added to)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r} (NaN and infinity are not accepted)")
    return value


def int_variable(environ: Mapping[str, str], name: str) -> int | None:
    """``environ[name]`` as an integer, None when it is unset or blank (for the variables other
    programs set: launchers', schedulers').

    Raises:
        ConfigError: it is set to something that is not an integer.
    """
    text = environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(with_hint(f"{name}={text!r} is not an integer", f"fix or unset {name}")) from None


# How long a stalled name waits before the job stops (ACCORD_STALL_SHUTDOWN_TIME_SECONDS): the
# 30 minutes after which torch's own process groups time out.
STALL_SHUTDOWN_DEFAULT_S = 1800.0

# Horovod's level names (HOROVOD_LOG_LEVEL) as Python logging levels; Python has no trace.
# ACCORD_TIMELINE/HOROVOD_TIMELINE=DYNAMIC (as in Horovod): the timeline is enabled, but no file
# is written until hvd.start_timeline(path).
DYNAMIC_TIMELINE = "DYNAMIC"
LOG_LEVELS = {"trace": 5, "debug": 10, "info": 20, "warning": 30, "error": 40, "fatal": 50}


def parse_log_level(text: str) -> str:
    """Parse trace, debug, info, warning, error or fatal (any case); the lower-case name
    (``LOG_LEVELS`` maps it to a logging level)."""
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise ValueError(f"not a log level ({', '.join(LOG_LEVELS)}): {text!r}")
    return value


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, parser, default, doc and accepted aliases."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    aliases: tuple[str, ...] = ()


def _v(name: str, parse: Callable[[str], Any], default: Any, doc: str, *aliases: str) -> Variable:
    return Variable(name, parse, default, doc, tuple(aliases))


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in [
        # --- the worker contract written by accordrun / accord.spawn ---
        _v("ACCORD_RANK", int, None, "Global rank of this worker.", "HOROVOD_RANK"),
        _v("ACCORD_SIZE", int, None, "Number of workers in the job.", "HOROVOD_SIZE"),
        _v("ACCORD_LOCAL_RANK", int, None, "Rank among the workers on this host.", "HOROVOD_LOCAL_RANK"),
        _v("ACCORD_LOCAL_SIZE", int, None, "Number of workers on this host.", "HOROVOD_LOCAL_SIZE"),
        _v("ACCORD_CROSS_RANK", int, None, "Index of this host among hosts with this local rank.", "HOROVOD_CROSS_RANK"),
        _v("ACCORD_CROSS_SIZE", int, None, "Number of hosts with a worker of this local rank.", "HOROVOD_CROSS_SIZE"),
        _v("ACCORD_HOSTNAME", str, None, "Host name the launcher assigned this worker to.", "HOROVOD_HOSTNAME"),
        _v("ACCORD_STORE_ADDR", str, None, "Address of the job's rendezvous store."),
        _v("ACCORD_STORE_PORT", int, None, "Port of the job's rendezvous store."),
        _v("ACCORD_JOB_SECRET", str, None, "Per-job secret (hex) that authenticates control messages."),
        _v("ACCORD_SECRET_FILE", str, None, "Path of a 0600 file holding the per-job secret (hex)."),
        _v("ACCORD_JOB_ID", str, None, "Identifier of the job, for logs and error files."),
        _v("ACCORD_ERROR_FILE", str, None, "Where a failing worker writes its traceback for the launcher."),
        _v("ACCORD_JOB_SECRET_FILE", str, None, "One agent per node (accordrun --nnodes): the file holding the job's secret (hex, mode 0600) that every node's agent shares; --secret-file wins."),
        _v("ACCORD_RESTART_COUNT", int, 0, "Whole-job restarts so far (accordrun --max-restarts, torchrun's TORCHELASTIC_RESTART_COUNT): 0 in the first attempt; Model.fit(save_dir=...) resumes from its last epoch checkpoint above 0.", "TORCHELASTIC_RESTART_COUNT"),
        # --- communication and engine tuning ---
        _v("ACCORD_CPU_BACKEND", str.strip, "auto", "Backend for CPU tensors: auto (shm when every rank is on one host, else gloo), gloo, shm, mpi, or a registered name.", "HOROVOD_CPU_OPERATIONS"),
        _v("ACCORD_GPU_BACKEND", str.strip, "auto", "Backend for CUDA tensors: auto (nccl, or host when NCCL cannot carry the job: ranks sharing a GPU, or torch without NCCL), nccl (an error at init in those cases), host (through host memory over the CPU backend), or a registered name."),
        _v("ACCORD_FUSION_THRESHOLD", int, 64 * 1024 * 1024, "Bytes per fusion buffer; 0 turns fusion off.", "HOROVOD_FUSION_THRESHOLD"),
        _v("ACCORD_CYCLE_TIME", finite_float, None, "Most milliseconds the engine gathers requests into one cycle after the first arrives (default by CPU backend: 30 on gloo/mpi, where a cycle normally starts earlier, once requests stop coming, see ACCORD_CYCLE_QUIET_TIME; 1000 on shm). A caller waiting on a handle always starts the cycle; on gloo/mpi so does a full fusion buffer.", "HOROVOD_CYCLE_TIME"),
        _v("ACCORD_CYCLE_QUIET_TIME", finite_float, None, "Milliseconds without a new request after which a gathering cycle starts (default by CPU backend: 0.5 on gloo/mpi, so a burst of submissions is one cycle; the cycle time on shm)."),
        _v("ACCORD_GIL_SWITCH_INTERVAL", finite_float, 1.0, "Milliseconds: Python's thread switch interval (sys.setswitchinterval) while accord's engine runs; restored at shutdown. The engine's threads need the GIL between the steps of a cycle, and at Python's 5 ms default a training thread busy in Python (submitting gradients) holds each such step back up to 5 ms. 0 leaves Python's setting alone."),
        _v("ACCORD_TIMELINE", str, None, "Write a chrome://tracing timeline to this path (rank 0); DYNAMIC (as in Horovod) writes none until hvd.start_timeline(path).", "HOROVOD_TIMELINE"),
        _v("ACCORD_TIMELINE_MARK_CYCLES", parse_bool, False, "Mark engine cycles in the timeline.", "HOROVOD_TIMELINE_MARK_CYCLES"),
        _v("ACCORD_STALL_CHECK_DISABLE", parse_bool, False, "Turn the stall inspector off.", "HOROVOD_STALL_CHECK_DISABLE"),
        _v("ACCORD_STALL_CHECK_TIME_SECONDS", finite_float, 60.0, "Warn when ranks wait this long on a name others lack.", "HOROVOD_STALL_CHECK_TIME_SECONDS"),
        _v("ACCORD_STALL_SHUTDOWN_TIME_SECONDS", finite_float, STALL_SHUTDOWN_DEFAULT_S, "Seconds a name may wait for ranks that never submit it before the job stops with a StallError on every rank, naming the missing ranks (0: never, Horovod's default). Default 1800: torch's process groups give up after 30 minutes too (default_pg_timeout), so a rank that took another path stops the job instead of holding every GPU forever, while a rank busy alone for minutes (a checkpoint, an evaluation on rank 0) is still waited for.", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
        _v("ACCORD_HIERARCHICAL_ALLREDUCE", parse_bool, None, "Allreduce within each host, then across hosts (CPU tensors; needs the same number of ranks on every host). 1 forces it, 0 turns it off; unset, a job on several hosts with several ranks on each (on the default gloo/shm backends) times both paths on its first allreduces of at least ACCORD_HIERARCHICAL_MIN_BYTES and keeps the faster.", "HOROVOD_HIERARCHICAL_ALLREDUCE"),
        _v("ACCORD_HIERARCHICAL_MIN_BYTES", int, 1024 * 1024, "Smallest allreduce (bytes) that takes the hierarchical path when it was chosen automatically (smaller ones are latency-bound and run flat)."),
        _v("ACCORD_COLLECTIVE_TIMEOUT", finite_float, 60.0, "Seconds a collective may wait for a peer before the rank is declared lost.", "HOROVOD_GLOO_TIMEOUT_SECONDS"),
        _v("ACCORD_START_TIMEOUT", finite_float, 30.0, "Seconds for every rank to reach the rendezvous.", "HOROVOD_START_TIMEOUT"),
        _v("ACCORD_ELASTIC", parse_bool, False, "This worker belongs to an elastic job (accordrun sets it with --min-np or --host-discovery-script, as horovodrun sets HOROVOD_ELASTIC=1): a DistributedOptimizer built while the job has one worker still hooks its gradients, since the job may grow.", "HOROVOD_ELASTIC"),
        _v("ACCORD_ELASTIC_ID", int, None, "Stable id of an elastic worker (accordrun with --host-discovery-script): its first rank; workers added later get the next ids."),
        _v("ACCORD_ELASTIC_JOIN", parse_bool, False, "This worker was added to a running elastic job: init() first waits until the running workers admit it."),
        _v("ACCORD_ELASTIC_MIN_NP", int, None, "Elastic jobs: the fewest workers the job re-forms with (accordrun's --min-np)."),
        _v("ACCORD_ELASTIC_TIMEOUT", finite_float, 60.0, "Seconds elastic ranks wait for live peers to regroup after a failure.", "HOROVOD_ELASTIC_TIMEOUT"),
        _v("ACCORD_LOG_LEVEL", parse_log_level, "warning", "Level of accord's log messages in workers: trace, debug, info, warning, error, fatal.", "HOROVOD_LOG_LEVEL"),
        _v("ACCORD_CACHE_CAPACITY", int, 1024, "Names whose agreed signature the engine remembers, so that steady-state negotiation is one small allreduce (0 counts as 1).", "HOROVOD_CACHE_CAPACITY"),
        _v("ACCORD_INTERFACE", str, None, "Network interface to bind and advertise.", "DMLC_INTERFACE", "HOROVOD_GLOO_IFACE"),
        _v("ACCORD_VERBOSE", parse_level, 0, "Verbosity of the launcher and parameter servers: 0 quiet, 1 node registration and connections, 2 also every server message.", "PS_VERBOSE"),
        _v("ACCORD_MAX_OBJECT_BYTES", int, 1 << 31, "Largest pickled object broadcast_object / allgather_object accept from a rank; a larger announced length is refused before anything is allocated."),
        _v("ACCORD_SHM_CHUNK_BYTES", int, 1 << 20, "Slot size of the shm backend: each op moves data through shared memory in pieces of this many bytes."),
        # --- kvstore and parameter servers (MXNet's launch.py / ps-lite names accepted) ---
        _v("ACCORD_KVSTORE_BIGARRAY_BOUND", int, 1000000, "Arrays with at least this many elements are split across all servers.", "MXNET_KVSTORE_BIGARRAY_BOUND"),
        _v("ACCORD_KVSTORE_CHUNK_ELEMENTS", int, 1 << 20, "Largest piece of a key sent to a parameter server in one message, in elements."),
        _v("ACCORD_KVSTORE_IPC", parse_bool, True, "Parameter servers also listen on a Unix socket that workers on their host use instead of TCP."),
        _v("ACCORD_KVSTORE_IPC_DIR", str, None, "Directory in which a parameter server makes its private Unix-socket directory (accordrun: the job's directory, removed with the job even when a server is killed; default: the system's temporary directory)."),
        _v("ACCORD_KVSTORE_PAYLOAD_MAC", parse_bool, True, "Authenticate kvstore array bytes, not only headers (0: trusted networks only, ~15-25% less CPU)."),
        _v("ACCORD_KVSTORE_TIMEOUT", finite_float, 300.0, "Seconds a worker waits for a parameter server's answer before failing."),
        _v("ACCORD_NODE_HOST", str, None, "Address a parameter server advertises to workers (default: loopback, or the route to the store).", "DMLC_NODE_HOST"),
        _v("ACCORD_NUM_SERVERS", int, 0, "Parameter servers in the job (0: dist_sync runs on the engine, without servers).", "DMLC_NUM_SERVER"),
        _v("ACCORD_NUM_WORKERS", int, None, "Workers in a parameter-server job (default ACCORD_SIZE).", "DMLC_NUM_WORKER"),
        _v("ACCORD_PS_ROOT_PORT", int, None, "Port of the store where parameter servers register (default ACCORD_STORE_PORT).", "DMLC_PS_ROOT_PORT"),
        _v("ACCORD_PS_ROOT_URI", str, None, "Address of the store where parameter servers register (default ACCORD_STORE_ADDR).", "DMLC_PS_ROOT_URI"),
        _v("ACCORD_ROLE", str, "worker", "Role of this process in a parameter-server job: worker, server or scheduler.", "DMLC_ROLE"),
        _v("ACCORD_SERVER_INDEX", int, None, "Index of this parameter server, 0..servers-1 (set by accordrun --num-servers; default: order of registration)."),
    ]
}


def _raw(name: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The (variable actually set, its text) for ``name`` or its first set alias."""
    var = VARIABLES[name]
    for candidate in (var.name, *var.aliases):
        text = environ.get(candidate)
        if text is not None and text != "":
            return candidate, text
    return None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Return the typed value of a declared variable (or its default).

    Raises:
        KeyError: ``name`` is not declared in ``VARIABLES``.
        ConfigError: the variable is set to text its parser rejects.
    """
    if name not in VARIABLES:
        raise KeyError(f"{name} is not an accord variable; known: {', '.join(sorted(VARIABLES))}")
    found = _raw(name, os.environ if environ is None else environ)
    if found is None:
        return VARIABLES[name].default
    set_name, text = found
    try:
        return VARIABLES[name].parse(text)
    except ValueError as exc:
        raise ConfigError(
            with_hint(
                f"{set_name}={text!r} could not be read as {VARIABLES[name].parse.__name__}: {exc}",
                f"set {set_name} to a valid value ({VARIABLES[name].doc}) or unset it "
                f"to use the default {VARIABLES[name].default!r}",
            )
        ) from None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a declared variable (or one of its aliases) is set to a non-empty value.

    Raises:
        KeyError: ``name`` is not declared in ``VARIABLES``.
    """
    if name not in VARIABLES:
        raise KeyError(f"{name} is not an accord variable; known: {', '.join(sorted(VARIABLES))}")
    return _raw(name, os.environ if environ is None else environ) is not None


def snapshot() -> dict[str, str]:
    """A copy of the whole process environment (for detection and child processes)."""
    return dict(os.environ)


def set_variables(values: Mapping[str, str | None]) -> None:
    """Set (or, with ``None``, remove) variables in this process's environment.

    A declared variable's aliases go with it: removing ACCORD_LOCAL_SIZE also removes a
    HOROVOD_LOCAL_SIZE that a launcher set (else :func:`get` would fall back to its stale
    value), and setting it also updates aliases already present, which scripts may read.
    """
    for key, value in values.items():
        var = VARIABLES.get(key)
        names = [key] + [a for a in (var.aliases if var else ()) if a in os.environ]
        for name in names:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def describe() -> str:
    """A table of every variable, its aliases, default and doc (for ``accordrun --help-env``)."""
    rows = []
    for var in VARIABLES.values():
        alias = f" (also {', '.join(var.aliases)})" if var.aliases else ""
        rows.append(f"{var.name}{alias}\n    default {var.default!r}: {var.doc}")
    return "\n".join(rows)
