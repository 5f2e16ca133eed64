"""``accord-bench`` (also ``python -m accord.bench``): collectives and training benchmarks.

    accord-bench collectives --ops allreduce --max-bytes 64MB --compare raw
    accord-bench train --model resnet50 --image-size 64 --batch-size 16 --baseline ddp
    accordrun -np 2 accord-bench collectives ...      # or torchrun / mpirun: detected

Without an outside launcher the benchmark starts ``--nproc-per-node`` workers itself. Exit
status: 0 done, 1 a rank failed, 2 unusable arguments (the message ends with a HINT).
Torch-free: only the workers import torch.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Sequence

from accord.bench import launch, options, report
from accord.bench.environment import load_average
from accord.bench.placement import Placement, default_threads, placement
from accord.config import finite_float
from accord.errors import AccordError, ConfigError, WorkerFailedError, with_hint


class _Parser(argparse.ArgumentParser):
    """argparse, with our error shape: what failed, then a HINT; exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\nHINT: run `{self.prog} --help` to see the "
                         "accepted options and values\n")
        sys.exit(2)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="workers to start when no launcher started us (default 2)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: cores // ranks on this host)")
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    p.add_argument("--plot", metavar="PATH", help="draw a PNG (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (one is drawn when stderr is a terminal and tqdm is installed)")


def build_parser() -> argparse.ArgumentParser:
    """The ``accord-bench`` argument parser (subcommands ``collectives`` and ``train``)."""
    parser = _Parser(prog="accord-bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="{collectives,train}")

    c = sub.add_parser("collectives", help="latency and bus bandwidth over a size sweep",
                       description="Latency, algbw and busbw (NCCL-tests formulas) per message size.")
    c.add_argument("--ops", default="allreduce",
                   help=f"comma-separated, or 'all': {', '.join(options.COLLECTIVE_OPS)} (default allreduce)")
    c.add_argument("--min-bytes", default="4", help="smallest size of the sweep (default 4)")
    c.add_argument("--max-bytes", default="256MB", help="largest size of the sweep (default 256MB)")
    c.add_argument("--step-factor", type=int, default=2, help="size multiplier between steps (default 2)")
    c.add_argument("--sizes", default=None, help="explicit sizes instead of a sweep, e.g. 4,1K,1MB")
    c.add_argument("--dtype", default="float32", help=f"comma-separated: {', '.join(options.DTYPE_SIZES)}")
    c.add_argument("--backends", default="auto",
                   help="comma-separated backend names, or auto (the configured one, mpi under "
                        "mpirun, shm when registered)")
    c.add_argument("--api", choices=("engine", "comm"), default="engine",
                   help="engine: as hvd.allreduce (negotiation, fusion); comm: the backend directly")
    c.add_argument("--compare", choices=("none", "raw"), default="none",
                   help="raw: also time raw torch.distributed on the same ranks, interleaved")
    c.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    c.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    c.add_argument("--no-check", action="store_true", help="skip checking each result once")
    _common(c)

    t = sub.add_parser("train", help="training samples/s, scaling efficiency, speedup over a baseline",
                       description="1-process, accord and baseline runs of one model, in one invocation.")
    t.add_argument("--model", choices=options.MODELS, default="resnet50")
    t.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    t.add_argument("--amp-level", choices=options.AMP_LEVELS, default="O0",
                   help="O0 fp32, O1 autocast, O2 half model + fp32 master weights")
    t.add_argument("--amp-dtype", choices=("auto", "bf16", "fp16"), default="auto",
                   help="half type for O1/O2 (auto: bf16 on CPU, fp16 + GradScaler on CUDA)")
    t.add_argument("--compiler-opt", action="store_true", help="wrap the model with torch.compile")
    t.add_argument("--channels-last", action="store_true",
                   help="images and weights in NHWC memory format (faster convolutions on GPUs)")
    t.add_argument("--steps", type=int, default=50, help="timed steps per run (default 50)")
    t.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    t.add_argument("--repeats", type=int, default=1,
                   help="run the sequence this many times, accord and baseline alternating (default 1)")
    t.add_argument("--log-interval", type=int, default=10, help="print every N steps (default 10)")
    t.add_argument("--data", choices=("synthetic", "digits"), default="synthetic")
    t.add_argument("--image-size", type=int, default=None,
                   help="image side for resnet/lenet (default 224 resnet, 28 lenet; digits: 32, 8)")
    t.add_argument("--baseline", choices=options.BASELINES, default="ddp")
    t.add_argument("--accord-api", choices=options.ACCORD_APIS, default="hvd",
                   help="accord's run: hvd (hvd.DistributedOptimizer, the default) or ddp (DDP on a "
                        "process group of the accord torch.distributed backend)")
    t.add_argument("--compression", choices=options.COMPRESSIONS, default="none",
                   help="accord's gradient compression (the baseline never compresses)")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    t.add_argument("--lr", type=finite_float, default=0.01)
    t.add_argument("--seed", type=int, default=0)
    _common(t)
    return parser


def _make_options(args: argparse.Namespace, where: Placement) -> Any:
    if args.command == "collectives":
        opts: Any = options.collectives_options(args, where)
    else:
        opts = options.train_options(args)
    if where.size < 1:
        raise ConfigError(with_hint(f"--nproc-per-node must be >= 1, got {where.size}",
                                    "pass --nproc-per-node 2 (or more)"))
    options.check_json_path(args.json)
    options.check_json_path(args.plot)
    if args.plot:
        report.check_plotting()
    if args.device == "cuda":
        import torch  # only to ask; the workers need it anyway

        if not torch.cuda.is_available():
            raise ConfigError(with_hint(
                f"--device cuda was asked for, but torch {torch.__version__} sees no CUDA device",
                "drop --device cuda, or run on a machine with a GPU and a CUDA build of torch"))
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``accord-bench``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    requested = args.nproc_per_node
    where = placement(2 if requested is None else requested)
    speak = where.rank == 0
    if args.threads is None:
        args.threads = default_threads(where.local_size)
    try:
        opts = _make_options(args, where)
    except ConfigError as exc:
        if speak:
            print(f"accord-bench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if where.external and requested is not None and requested != where.local_size and speak:
        print(f"accord-bench: note: started by {where.source} with {where.local_size} ranks on this "
              f"host; --nproc-per-node {requested} is ignored", file=sys.stderr)
    load_before = load_average()
    worker = launch.collectives_worker if args.command == "collectives" else launch.train_worker
    try:
        result = launch.run_workers(worker, opts, where, args.threads)
    except (WorkerFailedError, AccordError) as exc:
        print(f"accord-bench {args.command}: failed: {exc}", file=sys.stderr)
        return 1
    if result is None:  # not rank 0
        return 0
    result["command"] = "accord-bench " + shlex.join(argv)
    result["launcher"] = where.source
    result["load_average_before"] = load_before
    print(report.format_collectives(result) if args.command == "collectives" else report.format_train(result))
    if args.json:
        report.write_json(result, args.json)
        print(f"# wrote {args.json}")
    if args.plot:
        report.plot(result, args.plot)
        print(f"# wrote {args.plot}")
    sys.stdout.flush()
    return 0
