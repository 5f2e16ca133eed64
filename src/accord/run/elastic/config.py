"""The elastic flags of accordrun, validated: ``--min-np``, ``--max-np``,
``--host-discovery-script``, ``--slots-per-host``, ``--discovery-interval``,
``--elastic-timeout``, ``--reset-limit``, ``--blacklist-cooldown-range`` (Horovod's horovodrun
flags, same meanings, ``--min-num-proc``/``--max-num-proc`` too; ``--discovery-interval`` is
ours, Horovod polls every second).

With a discovery script the hosts come from the script (``-H``/``--hostfile``/``--ips`` are
refused, as in horovodrun): it is run once here, and a script that fails on this first run is a
command-line error (exit 2), as Horovod fails at once on a first failure. ``--min-np`` with hosts
that name two or more hosts is horovodrun's elastic job on fixed hosts: the same driver, the
hosts never change but a failing host is blacklisted (:class:`ElasticConfig` without a script).
Either way the job starts on every slot of those hosts, up to ``--max-np``; ``-np`` is the
fewest it needs (horovodrun: "the number of processes required before training can start").
Fixed hosts with fewer slots than ``-np`` can never start (exit 2); a script may print more
hosts later, so with fewer slots at first, or no host at all (then ``-np`` must be given, as
horovodrun always requires it), the driver waits for them, as horovodrun does
(:attr:`ElasticConfig.start_np`).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Sequence

from accord import config
from accord.errors import ConfigError, with_hint
from accord.run.elastic.discovery import DiscoveryError, run_discovery
from accord.run.spec.flag_values import whole_number
from accord.run.spec.hosts import HostSlots
from accord.run.spec.tuning import check_number

DEFAULT_DISCOVERY_INTERVAL = 2.0
DEFAULT_ELASTIC_TIMEOUT = 600.0  # Horovod's default
# horovodrun's bounds of --blacklist-cooldown-range (horovod/runner/elastic/discovery.py)
COOLDOWN_LOWEST_MIN = 1.0
COOLDOWN_HIGHEST_MAX = 3600.0


@dataclass(frozen=True)
class ElasticConfig:
    """How an elastic job grows, shrinks and gives up (``discovery_script`` None: fixed hosts,
    ``-H`` with ``--min-np``; then only blacklisting changes which hosts are used)."""

    discovery_script: str | None
    slots_per_host: int | None = None
    discovery_interval: float = DEFAULT_DISCOVERY_INTERVAL
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT
    elastic_timeout_given: bool = False  # then the workers wait as long when they regroup
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None
    max_np: int | None = None
    # -np: the fewest usable slots to start on. A discovery script that prints fewer at first is
    # polled until it prints that many, up to --elastic-timeout (horovodrun's
    # wait_for_available_slots(num_proc)); None: start on whatever the first hosts have.
    start_np: int | None = None

    @property
    def script_timeout(self) -> float:
        """How long one run of the script may take before it counts as hung."""
        return max(2.0, 5 * self.discovery_interval)


def add_arguments(g: argparse._ArgumentGroup) -> None:
    """The elastic flags (the group "elastic" of accordrun's parser)."""
    g.add_argument("--min-np", "--min-num-proc", dest="min_np", type=whole_number,
                   help="keep the job running while at least this many workers are alive: a worker "
                        "that fails is left out and the others re-form without it (default with "
                        "--host-discovery-script: -np). With -H naming two or more hosts, or a "
                        "discovery script, the job starts on every slot up to --max-np and -np is "
                        "the fewest workers it needs; a failing worker's host is blacklisted")
    g.add_argument("--max-np", "--max-num-proc", dest="max_np", type=whole_number,
                   help="the most workers the job may have (at least -np; default: no limit)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="elastic job: SCRIPT (run through the shell) prints the usable hosts, one "
                        "'host:slots' or 'host' line each; run every --discovery-interval, the job "
                        "grows onto new hosts and leaves hosts that disappear")
    g.add_argument("--slots-per-host", type=whole_number, help="slots of a host the script prints without ':slots'")
    g.add_argument("--discovery-interval", type=config.finite_float, metavar="SECONDS",
                   help=f"seconds between runs of the discovery script (default {DEFAULT_DISCOVERY_INTERVAL:g})")
    g.add_argument("--elastic-timeout", type=config.finite_float, metavar="SECONDS",
                   help=f"seconds the job may wait for hosts before it fails: at the start, for -np "
                        f"slots (with --host-discovery-script), and while below --min-np; "
                        f"also how long workers wait for each other when they re-form "
                        f"(default {DEFAULT_ELASTIC_TIMEOUT:g})")
    g.add_argument("--reset-limit", type=whole_number, help="fail the job after this many re-formations "
                   "(hosts added, removed or failed; changes before the workers re-formed count "
                   "once; default: no limit)")
    g.add_argument("--blacklist-cooldown-range", type=config.finite_float, nargs=2, metavar=("MIN", "MAX"),
                   help="a failing host is blacklisted, then may be used again: its n-th failure keeps "
                        "it out MIN*2^n seconds plus a random 0..MIN, within MIN..MAX (Horovod's "
                        "backoff; 1 <= MIN <= MAX <= 3600, as in horovodrun; default: for good)")


def elastic_from_args(ns: argparse.Namespace, hosts: Sequence[HostSlots] | None = None) -> ElasticConfig | None:
    """The validated elastic settings: with --host-discovery-script, or with --min-np and
    ``hosts`` (from -H/--hostfile/--ips) naming two or more hosts; else None.

    Raises:
        ConfigError: a discovery flag without the script, hosts given as well, a bad number.
    """
    script = ns.host_discovery_script
    if script is None:
        fixed = ns.min_np is not None and hosts is not None and len({h.hostname for h in hosts}) >= 2
        discovery_only = (("--slots-per-host", ns.slots_per_host), ("--discovery-interval", ns.discovery_interval))
        # only the elastic driver uses these (on one host --min-np just leaves failed workers out)
        limits = (("--elastic-timeout", ns.elastic_timeout), ("--reset-limit", ns.reset_limit),
                  ("--blacklist-cooldown-range", ns.blacklist_cooldown_range))
        extra = [flag for flag, value in discovery_only + (() if fixed else limits) if value is not None]
        if extra:
            verb = "needs" if len(extra) == 1 else "need"
            raise ConfigError(with_hint(
                f"{', '.join(extra)} {verb} --host-discovery-script" + ("" if fixed else
                                                                 " (or --min-np with -H naming two or more hosts)"),
                "pass --host-discovery-script SCRIPT, or drop those flags"))
        if not fixed:
            return None
        return ElasticConfig(discovery_script=None, elastic_timeout=ns.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT,
                             elastic_timeout_given=ns.elastic_timeout is not None, max_np=ns.max_np,
                             **_limits(ns))
    if not script.strip():
        raise ConfigError(with_hint("--host-discovery-script is empty", "pass the script's path"))
    given = [flag for flag, value in (("-H/--hosts", ns.hosts), ("--hostfile", ns.hostfile),
                                      ("--ips", ns.ips)) if value is not None]
    if given:
        raise ConfigError(with_hint(f"--host-discovery-script and {' and '.join(given)} both name hosts",
                                    "with a discovery script the hosts come from the script: drop "
                                    f"{' and '.join(given)}"))
    if ns.slots_per_host is not None and ns.slots_per_host < 1:
        raise ConfigError(with_hint(f"--slots-per-host must be at least 1, got {ns.slots_per_host}",
                                    "pass --slots-per-host N with N >= 1"))
    check_number(ns.discovery_interval, "--discovery-interval", ">0")
    return ElasticConfig(
        discovery_script=script,
        slots_per_host=ns.slots_per_host,
        discovery_interval=ns.discovery_interval or DEFAULT_DISCOVERY_INTERVAL,
        elastic_timeout=ns.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT,
        elastic_timeout_given=ns.elastic_timeout is not None,
        max_np=ns.max_np,
        **_limits(ns),
    )


def _limits(ns: argparse.Namespace) -> dict[str, Any]:
    """--elastic-timeout checked; --reset-limit and --blacklist-cooldown-range validated."""
    check_number(ns.elastic_timeout, "--elastic-timeout", ">0")
    if ns.reset_limit is not None and ns.reset_limit < 0:
        raise ConfigError(with_hint(f"--reset-limit must be >= 0, got {ns.reset_limit}",
                                    "pass --reset-limit N, or leave it out for no limit"))
    cooldown = None
    if ns.blacklist_cooldown_range is not None:
        cooldown = check_cooldown_range(*ns.blacklist_cooldown_range)
    return {"reset_limit": ns.reset_limit, "cooldown_range": cooldown}


def check_cooldown_range(low: float, high: float) -> tuple[float, float]:
    """``--blacklist-cooldown-range MIN MAX`` within horovodrun's bounds: MIN at least
    :data:`COOLDOWN_LOWEST_MIN` seconds, MAX at most :data:`COOLDOWN_HIGHEST_MAX`, and (ours;
    horovodrun then keeps every host out MIN seconds) MIN <= MAX.

    Raises:
        ConfigError: naming the flag and the values given, with a HINT.
    """
    check_number(low, "--blacklist-cooldown-range MIN", None)
    check_number(high, "--blacklist-cooldown-range MAX", None)
    given = f"--blacklist-cooldown-range {low:g} {high:g}"
    fix = (f"pass MIN MAX with {COOLDOWN_LOWEST_MIN:g} <= MIN <= MAX <= {COOLDOWN_HIGHEST_MAX:g} "
           "seconds, e.g. 10 300, or leave the flag out to keep failing hosts out for good")
    if low < COOLDOWN_LOWEST_MIN:
        raise ConfigError(with_hint(f"{given}: MIN must be at least {COOLDOWN_LOWEST_MIN:g} second "
                                    "(as in horovodrun)", fix))
    if high > COOLDOWN_HIGHEST_MAX:
        raise ConfigError(with_hint(f"{given}: MAX must be at most {COOLDOWN_HIGHEST_MAX:g} seconds "
                                    "(one hour, as in horovodrun)", fix))
    if high < low:
        raise ConfigError(with_hint(f"{given}: MAX is below MIN", fix))
    return float(low), float(high)


def first_hosts(elastic: ElasticConfig, num_proc: int | None, cwd: str | None = None) -> list[HostSlots]:
    """Run the script once for the hosts to start on (``num_proc``: -np as given, or None).
    It may print no host yet (an autoscaling cluster without a node so far): given -np, the
    job then waits for -np slots, as horovodrun does, and the list returned is empty.

    Raises:
        ConfigError: the script fails, hangs or prints garbage, or prints no host while -np is
            not given (the job would not know how many workers to wait for).
    """
    assert elastic.discovery_script is not None
    try:
        hosts = run_discovery(elastic.discovery_script, elastic.slots_per_host,
                              elastic.script_timeout, cwd=cwd or os.getcwd())
    except DiscoveryError as exc:
        raise ConfigError(f"{exc} (on its first run, before anything was started)") from None
    if not hosts and num_proc is None:
        # -np defaults to the first hosts' slots; with none, horovodrun's rule (-np is required)
        raise ConfigError(with_hint(
            f"host discovery script {elastic.discovery_script!r} printed no host on its first run, "
            "and -np is not given: there is no number of workers to wait for",
            "pass -np N, the fewest workers the job needs to start (horovodrun requires it): the job "
            "then waits up to --elastic-timeout for the script to print N slots"))
    return hosts


def check_counts(num_proc: int, min_np: int | None, max_np: int | None, slots: int | None = None) -> None:
    """--min-np <= -np <= --max-np, and -np within ``slots``, the slots of fixed hosts (-H with
    --min-np: they never gain any; with a discovery script the driver waits for slots instead).

    Raises:
        ConfigError: with the numbers seen.
    """
    if min_np is not None and not 1 <= min_np <= num_proc:
        raise ConfigError(with_hint(f"--min-np must be between 1 and -np ({num_proc}), got {min_np}",
                                    f"pass --min-np 1..{num_proc}"))
    if max_np is not None and max_np < max(num_proc, min_np or 0):
        raise ConfigError(with_hint(f"--max-np {max_np} is below -np {num_proc}"
                                    + (f" or --min-np {min_np}" if min_np else ""),
                                    "pass --max-np of at least the number of workers started"))
    if slots is not None and num_proc > slots:
        raise ConfigError(with_hint(
            f"-np {num_proc} is more than the {slots} slots the hosts have",
            f"pass -np {slots} or less, or name hosts with more slots"))
