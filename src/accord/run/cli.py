"""``accordrun`` / ``python -m accord.run``: parse the command line and run the job.

Exit codes: the failing worker's status (128 + n for signal n), 0 when every worker succeeded,
2 for bad command-line input (nothing was started), 1 when the launcher itself could not start
the job, 128 + n when the launcher received signal n (Ctrl-C: 130).
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from accord import config
from accord.errors import ConfigError, LaunchError
from accord.run.agent.cluster_vars import agent_mode, agent_spec
from accord.run.config import config_file as horovod_config
from accord.run.config import horovod_flags, timeline_path
from accord.run.config.launch_config import DEFAULT_GRACE, LOG_LEVELS, config_from_args
from accord.run.elastic import config as elastic_config
from accord.run.processes.ssh import STRICT_POLICIES
from accord.run.spec import tuning
from accord.run.spec.flag_values import whole_number
from accord.run.spec.hosts import parse_rank_list
from accord.version import __version__

EXAMPLES = """\
examples:
  accordrun -np 4 python train.py                       4 workers on this host
  accordrun -np 8 -H node1:4,node2:4 python train.py    two hosts over ssh
  accordrun --hostfile hosts.txt python train.py        hosts from a file ('node1 slots=4')
  accordrun --ips 10.0.0.1,10.0.0.2 --nproc-per-node 2 python train.py
  accordrun -np 4 --num-servers 2 python train.py       4 workers + 2 parameter servers (kvstore)
  accordrun -np 2 --ps mxnet python train.py --kv-store dist_sync
                                                        MXNet's own scheduler, 2 servers, 2 workers
  accordrun -np 2 --min-np 2 --max-np 6 --host-discovery-script ./discover.sh python train.py
                                                        elastic: grows/shrinks with the script's hosts
  accordrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint node0:29400 \\
            --secret-file /etc/accord/secret python train.py
                                                        one agent per node (run on each node)
  accordrun --check-build                               which frameworks and backends work here
"""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors end with a HINT and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(
            f"accordrun: error: {message}\n"
            f"HINT: run `accordrun --help` for the flags; put accordrun's flags before the command, "
            f"e.g. accordrun -np 2 python train.py --your-flag\n"
        )
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The accordrun argument parser."""
    p = _Parser(
        prog="accordrun",
        description="Launch a distributed accord / Horovod / torch.distributed job.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("-v", "--version", action="version", version=f"accordrun (accord) {__version__}")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print which frameworks and backends are usable here, then exit")
    p.add_argument("--help-env", action="store_true", help="list every environment variable accord reads")

    g = p.add_argument_group("workers and hosts")
    g.add_argument("-np", "--num-proc", type=whole_number,
                   help="number of workers (default: all slots); elastic jobs: the fewest they start with")
    g.add_argument("-H", "--hosts", help="hosts and slots, e.g. node1:4,node2:4 (default localhost:NP)")
    g.add_argument("-hostfile", "--hostfile", help="file with 'host slots=N', 'host:N' or 'host' lines")
    g.add_argument("--ips", help="comma-separated host addresses (use with --nproc-per-node)")
    g.add_argument("--nproc-per-node", type=whole_number, help="workers per host for --ips (alone: on this host)")
    g.add_argument("--gpus", "--devices", dest="devices",
                   help="devices for each host's workers, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES per worker)")

    g = p.add_argument_group(
        "one agent per node (torchrun's flags; Kubernetes' PET_* and SLURM's variables fill in what is not given)")
    g.add_argument("--nnodes", metavar="N|MIN:MAX", help="nodes in the job, each running this command once")
    g.add_argument("--node-rank", type=int, metavar="R", help="this node's rank, 0..N-1 (default: join order)")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="where the agents meet: node rank 0's host and a port it serves (default port 29400)")
    g.add_argument("--secret-file", metavar="PATH",
                   help="the job's shared secret (hex, mode 0600), the same file on every node "
                        "(also ACCORD_JOB_SECRET_FILE, or the hex in ACCORD_JOB_SECRET)")
    g.add_argument("--no-job-secret", action="store_true",
                   help="run the agents unauthenticated (a trusted network only)")
    g.add_argument("--max-restarts", type=int, metavar="N",
                   help="restart every node's workers up to N times after a failure (default 0)")

    elastic_config.add_arguments(p.add_argument_group("elastic (hvd.elastic.run; Horovod's horovodrun flags)"))

    g = p.add_argument_group("parameter servers (accord.kvstore, MXNet's launch.py -s)")
    g.add_argument("--num-servers", metavar="N",
                   help="also start N parameter servers (default 0; -np counts workers); "
                        "workers and servers get DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER, "
                        "DMLC_PS_ROOT_URI/PORT; not in elastic jobs, whose workers come and go)")
    g.add_argument("--ps", choices=("accord", "mxnet"), default="accord",
                   help="whose parameter servers: accord's (default) or MXNet's own ps-lite "
                        "scheduler and servers, which run the same command with DMLC_ROLE="
                        "scheduler/server (MXNet's tools/launch.py; --num-servers defaults to -np)")
    g.add_argument("--server-hosts", metavar="HOSTS",
                   help="hosts of the parameter servers, round robin, e.g. node1,node2 (default: "
                        "spread over the worker hosts when there are several, else this host)")

    g = p.add_argument_group("rendezvous and processes")
    g.add_argument("--start-timeout", type=config.finite_float,
                   help="seconds for every rank to check in at the rendezvous (enforced when given)")
    g.add_argument("--grace-period", type=config.finite_float,
                   help=f"seconds between SIGTERM and SIGKILL when stopping workers (default {DEFAULT_GRACE:g})")
    g.add_argument("--store-port", type=whole_number, help="port of accord's rendezvous store (default: free port)")
    g.add_argument("--master-addr", help="MASTER_ADDR for env:// scripts (default: rank 0's host)")
    g.add_argument("--master-port", type=whole_number, help="MASTER_PORT for env:// scripts (default: free port)")
    g.add_argument("--network-interface", help="interface to bind and advertise (also DMLC_INTERFACE)")
    g.add_argument("--sync-dst-dir", metavar="DIR",
                   help="copy the working directory to DIR on every host with rsync over ssh "
                        "before starting, and run the workers there (MXNet's launch.py flag)")
    g.add_argument("--no-exit-release", action="store_true",
                   help="run a `python script.py` command exactly as given; by default the script's "
                        "globals are released after its atexit handlers, before the interpreter's "
                        "teardown (a DDP model still holding its process group aborts there)")

    g = p.add_argument_group("ssh")
    g.add_argument("-p", "--ssh-port", type=whole_number, help="ssh port of the remote hosts")
    g.add_argument("-i", "--ssh-identity-file", help="ssh private key")
    g.add_argument("--ssh-strict-host-key-checking", choices=STRICT_POLICIES, default="accept-new",
                   help="ssh StrictHostKeyChecking policy (default accept-new)")

    g = p.add_argument_group("output")
    g.add_argument("--output-filename", metavar="DIR",
                   help="also write DIR/rank.N/{stdout,stderr} (N zero-padded: rank.03 of 16)")
    g.add_argument("--no-prefix", action="store_true", help="print worker lines without [rank]<stream>:")
    g.add_argument("--prefix-timestamp", "-prefix-timestamp", "--prefix-output-with-timestamp",
                   action="store_true", help="start every worker line with a timestamp")
    g.add_argument("--ranks-filter", help="show only these ranks on the console, e.g. 0,1 (files keep all)")
    g.add_argument("--log-level", help=f"accord's log level in workers: {', '.join(LOG_LEVELS)}")
    g.add_argument("--verbose", action="store_true",
                   help="say what the launcher does (also PS_VERBOSE=1; PS_VERBOSE=2 also logs "
                        "every parameter-server message)")

    tuning.add_arguments(p.add_argument_group("tuning (passed to the workers' engine)"))
    horovod_flags.add_arguments(p.add_argument_group(
        "horovodrun's other flags",
        "  --gloo, --disable-cache: nothing to do; --tcp: NCCL_IB_DISABLE=1 in the workers;\n"
        "  --autotune*, --num-nccl-streams, --thread-affinity, --mpi-threads-disable,\n"
        "  --hierarchical-allgather, --log-with(out)-timestamp: accepted and ignored (said once);\n"
        "  --config-file FILE: horovodrun's YAML settings (command-line flags win);\n"
        "  --mpi, --jsrun, --mpi-args, --binding-args: refused with a HINT"))

    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _run_agent(ns: argparse.Namespace) -> int:
    """One node's agent (:mod:`accord.run.agent`): validate, then run it."""
    environ = config.snapshot()
    try:
        spec = agent_spec(ns, environ)
        ranks_filter = ns.ranks_filter
        ns.ranks_filter = None  # global ranks: checked against the world below
        ns.nproc_per_node = spec.nproc  # this node's workers: what config_from_args validates
        cfg = config_from_args(ns, environ)
        chosen = parse_rank_list(ranks_filter, "--ranks-filter") if ranks_filter is not None else None
    except (ConfigError, LaunchError) as exc:
        sys.stderr.write(f"accordrun: error: {exc}\n")
        return 2
    from accord.run.agent.node_agent import run_agent

    return run_agent(spec, cfg, chosen)


def main(argv: Sequence[str] | None = None) -> int:
    """Run accordrun with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if ns.check_build:
        from accord.run.check_build import build_report  # imports torch: only here

        print(build_report())
        return 0
    if ns.help_env:
        print(config.describe())
        return 0
    if agent_mode(ns, config.snapshot()):
        return _run_agent(ns)
    if ns.max_restarts is not None or ns.secret_file is not None or ns.no_job_secret:
        sys.stderr.write("accordrun: error: --max-restarts, --secret-file and --no-job-secret are for one agent "
                         "per node\nHINT: add --nnodes N --rdzv-endpoint HOST:PORT (on every node), or drop them\n")
        return 2
    try:
        for warning in horovod_config.apply(ns) + horovod_flags.check(ns):
            sys.stderr.write(f"accordrun: warning: {warning}\n")
        config.set_variables(horovod_flags.worker_variables(ns))  # the workers inherit them
        cfg = config_from_args(ns, config.snapshot())
        for warning in timeline_path.check(cfg):  # needs the slots: rank 0's host
            sys.stderr.write(f"accordrun: warning: {warning}\n")
    except (ConfigError, LaunchError) as exc:
        sys.stderr.write(f"accordrun: error: {exc}\n")
        return 2
    from accord.run.launcher import launch

    try:
        return launch(cfg)
    except ConfigError as exc:  # found once the job began, before any worker started
        sys.stderr.write(f"accordrun: error: {exc}\n")
        return 2
    except LaunchError as exc:
        sys.stderr.write(f"accordrun: error: {exc}\n")
        return 1
