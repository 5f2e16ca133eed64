"""``accord-mxnet-launch``: MXNet's ``tools/launch.py`` command line, run by accordrun.

    accord-mxnet-launch -n 2 -s 1 --launcher local python train.py --kv-store dist_sync
    accord-mxnet-launch -n 4 -s 2 -H hosts --launcher ssh python train.py --kv-store dist_sync

MXNet's launcher is not in its wheel and does not run on Python >= 3.9; this one takes its
flags and starts the same processes through ``accordrun --ps mxnet`` (scheduler, servers and
workers with ``DMLC_*`` roles; output prefixes, fail-fast, cleanup). ``-n`` workers, ``-s``
servers (default: as many as workers), ``-H`` a file with one host per line (``host`` or
``host:slots``; workers go to the hosts round-robin, as MXNet's ssh launcher places them),
``--launcher local|ssh`` (default: ssh with ``-H``, else local; ``local`` ignores ``-H``),
``--env NAME:VALUE`` (repeatable, for every process), ``--sync-dst-dir`` (passed on to accordrun's).
The scheduler runs on the launch host; with several hosts the servers are spread over them,
round robin (as MXNet's ssh launcher places them).

Exit codes are accordrun's; bad flags exit 2 with a HINT.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn, Sequence

from accord import config
from accord.errors import ConfigError, with_hint
from accord.run.spec.assignment import check_count
from accord.run.spec.flag_values import whole_number
from accord.run.spec.hosts import check_name, is_plain_count, read_hostfile_text, split_host_item

LAUNCHERS = ("local", "ssh")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNSUPPORTED_LAUNCHERS = ("mpi", "sge", "yarn")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"accord-mxnet-launch: error: {message}\n"
                         "HINT: run `accord-mxnet-launch --help`; put the flags before the command, "
                         "e.g. accord-mxnet-launch -n 2 python train.py --kv-store dist_sync\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """MXNet 1.9.1's launch.py flags (those that apply on one or more ssh hosts)."""
    p = _Parser(prog="accord-mxnet-launch", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("-n", "--num-workers", required=True, type=whole_number, help="number of workers")
    p.add_argument("-s", "--num-servers", type=whole_number, help="number of servers (default: -n)")
    p.add_argument("-H", "--hostfile", help="file with the hosts, one per line")
    p.add_argument("--launcher", choices=LAUNCHERS + UNSUPPORTED_LAUNCHERS,
                   help="local (every process here) or ssh (workers on the -H hosts)")
    p.add_argument("--sync-dst-dir", help="copy the working directory to this folder on every host")
    p.add_argument("--env", action="append", default=[], metavar="NAME:VALUE",
                   help="an environment variable for every process (repeatable)")
    p.add_argument("--env-server", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--env-worker", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def read_hostfile(path: str) -> list[tuple[str, int | None]]:
    """``(host, slots or None)`` per non-empty, non-comment line of an MXNet hostfile.

    Raises:
        ValueError: the file cannot be read or a slot count is not a positive number.
    """
    try:
        lines = read_hostfile_text(path, "-H/--hostfile").splitlines()
    except ConfigError as exc:  # unreadable, not a regular file, too large, not UTF-8
        raise ValueError(str(exc)) from None
    hosts = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        # read as accordrun's -H reads an item: [v6] or [v6]:N too, counts in plain digits
        where = f"-H/--hostfile {path}:{number}"
        try:
            host, slots = split_host_item(text, where)
            check_name(host, where)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if slots is not None and (not is_plain_count(slots) or int(slots) < 1):
            raise ValueError(with_hint(f"-H/--hostfile {path!r}: {text!r} is not 'host' or 'host:slots'",
                                       "write one host per line, e.g. node1, node1:4 or [fe80::1]:4 "
                                       "(slots: a positive count in plain digits)"))
        hosts.append((host, int(slots) if slots is not None else None))
    if not hosts:
        raise ValueError(with_hint(f"-H/--hostfile {path!r} lists no host",
                                   "write one host per line, e.g. node1"))
    return hosts


def round_robin(hosts: Sequence[tuple[str, int | None]], workers: int) -> list[tuple[str, int]]:
    """How many workers each host gets, dealt one at a time over the hosts in order (hosts with a
    slot count take no more than it while others have room); hosts left empty are dropped."""
    counts, pos, n = [0] * len(hosts), 0, len(hosts)
    for _ in range(workers):
        order = [(pos + k) % n for k in range(n)]
        room = [j for j in order if hosts[j][1] is None or counts[j] < hosts[j][1]]
        j = room[0] if room else pos % n  # every host full: oversubscribe in turn
        counts[j] += 1
        pos = j + 1
    return [(host, n) for (host, _), n in zip(hosts, counts) if n]


def accordrun_argv(ns: argparse.Namespace, has_sync_flag: bool) -> list[str]:
    """The accordrun command line for parsed launch.py flags.

    Raises:
        ValueError: flags accord cannot honour (with what to do instead).
    """
    if ns.num_workers < 1:
        raise ValueError(with_hint(f"-n/--num-workers must be >= 1, got {ns.num_workers}", "pass -n 2 or more"))
    check_count(ns.num_workers, "-n/--num-workers")  # before round_robin deals them one by one
    if ns.num_servers is not None and ns.num_servers < 1:
        raise ValueError(with_hint(f"-s/--num-servers must be >= 1 for MXNet's dist types, got {ns.num_servers}",
                                   "pass -s 1 or more, or leave it out for one server per worker"))
    launcher = ns.launcher or ("ssh" if ns.hostfile else "local")
    if launcher in UNSUPPORTED_LAUNCHERS:
        raise ValueError(with_hint(f"--launcher {launcher} is not supported by accord",
                                   "use --launcher local or --launcher ssh -H hosts"))
    if ns.env_server or ns.env_worker:
        raise ValueError(with_hint("--env-server/--env-worker are not supported",
                                   "use --env NAME:VALUE, which every process gets"))
    if launcher == "ssh" and not ns.hostfile:
        raise ValueError(with_hint("--launcher ssh needs -H/--hostfile",
                                   "pass -H hosts (one host per line), or --launcher local"))
    servers = ns.num_servers if ns.num_servers is not None else ns.num_workers
    argv = ["--ps", "mxnet", "-np", str(ns.num_workers), "--num-servers", str(servers)]
    if launcher == "ssh":
        placed = round_robin(read_hostfile(ns.hostfile), ns.num_workers)
        argv += ["-H", ",".join(f"{host}:{n}" for host, n in placed)]
    if ns.sync_dst_dir:
        if not has_sync_flag:
            raise ValueError(with_hint("--sync-dst-dir is not available in this accordrun yet",
                                       "copy the working directory to the hosts first (e.g. rsync), "
                                       "then run without --sync-dst-dir"))
        argv += ["--sync-dst-dir", ns.sync_dst_dir]
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError(with_hint("no command to run",
                                   "append it, e.g. python train.py --kv-store dist_sync"))
    return argv + command


def env_pairs(values: Sequence[str]) -> dict[str, str]:
    """``NAME:VALUE`` (or ``NAME=VALUE``) strings as a dict.

    Raises:
        ValueError: an entry without a name.
    """
    out = {}
    for item in values:
        seps = [i for i in (item.find(":"), item.find("=")) if i >= 0]
        sep = item[min(seps)] if seps else ":"
        name, found, value = item.partition(sep)
        if not found or not _ENV_NAME.match(name.strip()):
            raise ValueError(with_hint(f"--env {item!r} is not NAME:VALUE with NAME a variable name "
                                       "(letters, digits, _)", "pass e.g. --env PS_VERBOSE:1"))
        out[name.strip()] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Parse launch.py's flags and run the job with accordrun; return its exit code."""
    from accord.run import cli

    ns = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    accordrun = cli.build_parser()
    has_sync = any("--sync-dst-dir" in action.option_strings for action in accordrun._actions)
    try:
        run_argv = accordrun_argv(ns, has_sync)
        extra_env = env_pairs(ns.env)
    except ValueError as exc:
        sys.stderr.write(f"accord-mxnet-launch: error: {exc}\n")
        return 2
    if extra_env:
        config.set_variables(extra_env)  # the launcher's environment reaches every process
    return cli.main(run_argv)


if __name__ == "__main__":
    sys.exit(main())
