"""Typed, validated options of ``accord-bench collectives`` and ``accord-bench train``.

The CLI turns argparse's namespace into one of these frozen dataclasses once; the workers
receive it pickled. Every check that can fail fast happens here, in the parent, before any
rank starts: a bad value raises :class:`~accord.errors.ConfigError` whose message ends with a
HINT, and the CLI exits with status 2. Torch-free.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from accord.bench import stats
from accord.bench.placement import Placement
from accord.errors import ConfigError, with_hint

# Engine spellings; stats.bus_factor accepts them as aliases.
COLLECTIVE_OPS = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall")
_OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
               "all_to_all": "alltoall"}
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
               "int8": 1, "uint8": 1}
MODELS = ("lenet", "mlp", "resnet18", "resnet50")  # accord.models' registry (a test keeps them equal)
AMP_LEVELS = ("O0", "O1", "O2")
BASELINES = ("ddp", "horovod-style", "none")
ACCORD_APIS = ("hvd", "ddp")  # how the accord run averages gradients (see accord.bench.strategies)
COMPRESSIONS = ("none", "fp16", "bf16")
# The tensors each built-in backend moves (known here without importing torch).
_BUILTIN_DEVICES = {"gloo": "cpu", "shm": "cpu", "mpi": "cpu", "nccl": "cuda", "host": "cuda"}


@dataclass(frozen=True)
class CollectivesOptions:
    """What ``accord-bench collectives`` measures (sizes in bytes, NCCL-tests' meaning)."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    backends: tuple[str, ...]
    api: str  # "engine" (hvd.* path: negotiation, fusion) or "comm" (the backend directly)
    compare_raw: bool
    iters: int
    warmup: int
    device: str  # "cpu" or "cuda"
    threads: int
    check: bool
    progress: bool


@dataclass(frozen=True)
class TrainOptions:
    """What ``accord-bench train`` measures."""

    model: str
    batch_size: int  # per rank
    amp_level: str
    amp_dtype: str  # "auto", "bf16" or "fp16"
    compiler_opt: bool
    channels_last: bool  # NHWC images and weights (what cuDNN's fast half-precision convolutions want)
    steps: int
    warmup: int
    repeats: int  # the whole single/accord/baseline sequence, accord and baseline alternating
    log_interval: int
    data: str  # "synthetic" or "digits"
    image_size: int | None
    baseline: str
    accord_api: str  # "hvd": hvd.DistributedOptimizer; "ddp": DDP on a group of the accord backend
    compression: str
    device: str  # "auto", "cpu" or "cuda"
    threads: int
    lr: float
    seed: int
    progress: bool


def _fail(message: str, hint: str) -> ConfigError:
    return ConfigError(with_hint(message, hint))


def _split(text: str) -> list[str]:
    return [part.strip() for part in str(text).split(",") if part.strip()]


def _positive(name: str, value: int, minimum: int = 1) -> int:
    if value < minimum:
        raise _fail(f"{name} must be >= {minimum}, got {value}", f"pass {name} {max(minimum, 1)} or more")
    return value


def _parse_names(text: str, names: list[str], aliases: dict[str, str], known, flag: str,
                 what: str, example: str) -> tuple[str, ...]:
    """Canonical, de-duplicated ``names`` (from ``text``) that must all be in ``known``."""
    out: list[str] = []
    for name in names:
        canonical = aliases.get(name.lower(), name.lower())
        if canonical not in known:
            raise _fail(f"unknown {what} {name!r} in {flag} {text!r}",
                        f"use a comma-separated list of {', '.join(known)}"
                        + (" (or 'all')" if flag == "--ops" else ""))
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise _fail(f"{flag} {text!r} names no {what}", f"pass e.g. {flag} {example}")
    return tuple(out)


def parse_ops(text: str) -> tuple[str, ...]:
    """"allreduce,all_gather" -> ("allreduce", "allgather"); "all" -> every op."""
    names = list(COLLECTIVE_OPS) if text.strip() == "all" else _split(text)
    return _parse_names(text, names, _OP_ALIASES, COLLECTIVE_OPS, "--ops", "collective",
                        "allreduce,allgather")


def parse_dtypes(text: str) -> tuple[str, ...]:
    """"float32,bf16" -> ("float32", "bfloat16")."""
    short = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "half": "float16",
             "bf16": "bfloat16", "float": "float32", "double": "float64"}
    return _parse_names(text, _split(text), short, DTYPE_SIZES, "--dtype", "dtype", "float32")


def parse_sizes(sizes: str | None, min_bytes: str, max_bytes: str, factor: int) -> tuple[int, ...]:
    """Explicit ``--sizes 4,1K,1MB``, else the sweep ``--min-bytes .. --max-bytes`` by ``factor``."""
    try:
        if sizes:
            values = [stats.parse_size(s) for s in _split(sizes)]
            if not values or min(values) < 1:
                raise ValueError(f"sizes must be >= 1 byte, got {values}")
            return tuple(sorted(set(values)))
        return tuple(stats.size_sweep(stats.parse_size(min_bytes), stats.parse_size(max_bytes), factor))
    except ValueError as exc:
        text = str(exc).split("\nHINT:")[0]
        raise _fail(f"bad message sizes: {text}",
                    "write sizes with units B, K, M or G, e.g. --min-bytes 4 --max-bytes 64MB "
                    "or --sizes 4,1K,1MB; the sweep needs min <= max and --step-factor >= 2") from None


def _mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def resolve_backends(text: str, device: str, where: Placement) -> tuple[str, ...]:
    """``auto``: the configured backend, plus mpi under an MPI launcher, plus shm if registered."""
    from accord.comm import backend_name_for, known_backends
    from accord.comm.settings import CommSettings

    known = known_backends()
    if device == "cuda":
        default = [backend_name_for("cuda")]  # auto: nccl (host staging is asked for by name)
    else:
        configured = CommSettings.from_config().cpu_backend
        default = ["gloo"] if configured == "auto" else [configured]  # shm is added below
        if where.is_mpi and _mpi_available():
            default.append("mpi")
        if "shm" in known:
            default.append("shm")
    names = default if text.strip() == "auto" else _split(text)
    out: list[str] = []
    for name in names:
        if name not in known:
            raise _fail(f"unknown backend {name!r} in --backends {text!r}; registered: {', '.join(known)}",
                        "pick registered backends, or 'auto' (gloo, mpi under mpirun, shm when registered)")
        if name == "mpi" and not (where.is_mpi and _mpi_available()):
            raise _fail("the mpi backend needs the ranks to be started by mpirun with mpi4py installed "
                        f"(launcher detected: {where.source}; mpi4py importable: {_mpi_available()})",
                        "run `mpirun -np 2 python -m accord.bench collectives --backends mpi`, "
                        "or drop mpi from --backends")
        if _BUILTIN_DEVICES.get(name, device) != device:
            raise _fail(f"backend {name!r} does not handle {device} tensors",
                        "use nccl or host with --device cuda, and gloo/mpi/shm with --device cpu")
        if name not in out:
            out.append(name)
    return tuple(out)


def check_json_path(path: str | None) -> None:
    """Refuse an output path whose folder does not exist, before hours of measuring."""
    if path:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise _fail(f"cannot write {path!r}: folder {folder!r} does not exist",
                        f"create it first (mkdir -p {folder}) or choose another path")


def collectives_options(args: Any, where: Placement) -> CollectivesOptions:
    """Validate the ``collectives`` arguments.

    Raises:
        ConfigError: a value is unusable (the message ends with a HINT).
    """
    device = args.device
    return CollectivesOptions(
        ops=parse_ops(args.ops),
        sizes=parse_sizes(args.sizes, args.min_bytes, args.max_bytes, _positive("--step-factor", args.step_factor, 2)),
        dtypes=parse_dtypes(args.dtype),
        backends=resolve_backends(args.backends, device, where),
        api=args.api,
        compare_raw=args.compare == "raw",
        iters=_positive("--iters", args.iters),
        warmup=_positive("--warmup", args.warmup, 0),
        device=device,
        threads=_positive("--threads", args.threads),
        check=not args.no_check,
        progress=not args.no_progress,
    )


def train_options(args: Any) -> TrainOptions:
    """Validate the ``train`` arguments.

    Raises:
        ConfigError: a value is unusable (the message ends with a HINT).
    """
    if args.compiler_opt and args.warmup < 1:
        raise _fail("--compiler-opt needs at least one warm-up step (the first step compiles the "
                    f"model and must not be timed), got --warmup {args.warmup}",
                    "pass --warmup 1 or more (the compile time is reported separately)")
    if args.image_size is not None and args.image_size < 8:
        raise _fail(f"--image-size must be >= 8, got {args.image_size}", "pass e.g. --image-size 64")
    if args.model in ("mlp",) and args.image_size is not None:
        raise _fail("--image-size does not apply to the mlp (its input is a 1024-vector, or 64 "
                    "pixels with --data digits)", "drop --image-size")
    if getattr(args, "channels_last", False) and args.model == "mlp":
        raise _fail("--channels-last applies to image models (resnet18, resnet50, lenet), not the mlp",
                    "drop --channels-last")
    if not args.lr > 0:
        raise _fail(f"--lr must be > 0, got {args.lr}", "pass e.g. --lr 0.01")
    accord_api = getattr(args, "accord_api", "hvd")
    if accord_api == "ddp" and args.compression != "none":
        raise _fail(f"--compression {args.compression} applies to --accord-api hvd (DDP sends its buckets as "
                    "they are)", "drop --compression, or use --accord-api hvd")
    if accord_api == "ddp" and args.amp_level == "O2":
        raise _fail("--amp-level O2 needs --accord-api hvd (its master weights step outside DDP)",
                    "use --accord-api hvd, or --amp-level O0/O1")
    return TrainOptions(
        model=args.model, batch_size=_positive("--batch-size", args.batch_size),
        amp_level=args.amp_level, amp_dtype=args.amp_dtype, compiler_opt=args.compiler_opt,
        channels_last=bool(getattr(args, "channels_last", False)),
        steps=_positive("--steps", args.steps), warmup=_positive("--warmup", args.warmup, 0),
        repeats=_positive("--repeats", args.repeats),
        log_interval=_positive("--log-interval", args.log_interval), data=args.data,
        image_size=args.image_size, baseline=args.baseline, accord_api=accord_api, compression=args.compression,
        device=args.device, threads=_positive("--threads", args.threads),
        lr=args.lr, seed=args.seed, progress=not args.no_progress,
    )
