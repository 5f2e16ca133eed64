"""What the benchmark prints and writes: text tables, the JSON file, an optional plot.

Pure formatting over the result dictionaries of :mod:`accord.bench.collectives` and
:mod:`accord.bench.train` (no torch). matplotlib is imported only to draw, and only when
``--plot`` asks; :func:`check_plotting` lets the CLI refuse early when it is missing.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any

from accord.bench.stats import format_size
from accord.errors import ConfigError, with_hint

PLOT_HINT = "pip install matplotlib (or pip install 'accord[dev]'), or drop --plot"


def _num(x: float | None, width: int = 9, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return f"{'-':>{width}}"
    return f"{x:{width}.{digits}f}"


def format_environment(env: dict[str, Any] | None, load_before: list[float] | None = None) -> str:
    """One or two ``#`` lines: versions, world size, backend, threads, device, load."""
    if not env:
        return "# environment: unknown"
    versions = f"accord {env.get('accord')} · torch {env.get('torch')} · python {env.get('python')}"
    if env.get("numpy"):
        versions += f" · numpy {env['numpy']}"
    device = env.get("device", "?")
    if env.get("gpu"):
        device += f" ({env['gpu']}, CUDA {env.get('cuda')})"
    else:
        device += f" ({env.get('cpu')}, {env.get('cpu_count')} cores)"
    load = env.get("load_average")
    loads = ""
    if load_before:
        loads += f" · load before {' '.join(f'{x:.2f}' for x in load_before)}"
    if load:
        loads += f" · load after {' '.join(f'{x:.2f}' for x in load)}"
    return (f"# {versions}\n# world size {env.get('world_size')} · backend {env.get('backend')} · "
            f"threads/rank {env.get('threads_per_rank')} · device {device}{loads}")


def format_collectives(result: dict[str, Any]) -> str:
    """NCCL-tests-style tables, one per backend x op x dtype."""
    cfg = result.get("config", {})
    lines = [f"# accord-bench collectives · {cfg.get('iters')} timed iterations after "
             f"{cfg.get('warmup')} warm-up, each between barriers; time = slowest rank",
             format_environment(result.get("environment"), result.get("load_average_before"))]
    for s in result.get("series", []):
        has_raw = any(r.get("raw") for r in s["rows"])
        lines.append("")
        lines.append(f"# {s['op']} · {s['dtype']} · {s['backend']} ({s['api']}) · {s['world_size']} ranks"
                     + (" · vs raw torch.distributed, same ranks, interleaved" if has_raw else ""))
        head = (f"{'size':>9} {'count':>10}  {'time us median [min, max]':>31}  {'algbw GB/s':>10}  "
                f"{'busbw GB/s median [min, max]':>30}")
        if has_raw:
            head += f"  {'raw us':>9}  {'raw busbw':>9}  {'ratio':>6}"
        lines.append(head)
        for r in s["rows"]:
            t, b = r["time_us"], r["busbw_gbps"]
            line = (f"{format_size(r['size_bytes']):>9} {r['count']:>10}  "
                    f"{_num(t['median'], 9, 1)} [{_num(t['min'], 9, 1)}, {_num(t['max'], 9, 1)}]  "
                    f"{_num(r['algbw_gbps']['median'], 10, 4)}  "
                    f"{_num(b['median'], 10, 4)} [{_num(b['min'], 8, 4)}, {_num(b['max'], 8, 4)}]")
            if has_raw:
                raw = r.get("raw")
                line += (f"  {_num(raw['time_us']['median'] if raw else None, 9, 1)}  "
                         f"{_num(raw['busbw_gbps']['median'] if raw else None, 9, 4)}  "
                         f"{_num(r.get('ratio'), 6, 2)}")
            lines.append(line)
    if any(r.get("ratio") is not None for s in result.get("series", []) for r in s["rows"]):
        lines.append("")
        lines.append("# ratio = accord busbw / raw busbw at the same size (> 1: accord faster)")
    return "\n".join(lines)


def _mean_ci(summary: dict[str, Any]) -> str:
    ci = summary.get("ci95")
    return f"{summary['mean']:.2f} ± {ci:.2f}" if ci is not None else f"{summary['mean']:.2f} ± -"


def format_train(result: dict[str, Any]) -> str:
    """The per-run table, then efficiency and speedup sentences."""
    cfg = result.get("config", {})
    runs = result.get("runs", [])
    memory = "peak CUDA MB" if runs and runs[0].get("memory_kind") == "cuda_max_allocated" else "peak RSS MB"
    shape = f"{cfg.get('image_size')}x{cfg.get('image_size')} " if cfg.get("image_size") else ""
    n = cfg.get("repeats") or 1
    repeats = f", {n} repeats (accord and baseline alternating, steps pooled)" if n > 1 else ""
    lines = [
        f"# accord-bench train · {cfg.get('model')} · {shape}{cfg.get('data')} data · batch "
        f"{cfg.get('batch_size')}/rank · amp {cfg.get('amp_level')}"
        f"{' + compiler-opt' if cfg.get('compiler_opt') else ''} · compression {cfg.get('compression')} · "
        f"{'accord via DDP on the accord backend · ' if cfg.get('accord_api') == 'ddp' else ''}"
        f"{cfg.get('steps')} steps after {cfg.get('warmup')} warm-up{repeats}",
        format_environment(result.get("environment"), result.get("load_average_before")),
        "",
        f"{'run':<14} {'ranks':>5}  {'samples/s':>9}  {'per step: mean ± 1.96σ':>22}  {'per device':>10}  "
        f"{'step ms median':>14}  {memory:>12}  {'efficiency':>10}  {'vs baseline':>11}",
    ]
    for r in runs:
        speed = r.get("speedup_vs_baseline")
        lines.append(
            f"{r['name']:<14} {r['world_size']:>5}  {r['throughput']:>9.2f}  {_mean_ci(r['samples_per_s']):>22}  "
            f"{r['samples_per_s_per_device']:>10.2f}  {r['step_ms']['median']:>14.1f}  "
            f"{r.get('peak_memory_mb', 0.0):>12.0f}  {_num(r.get('efficiency'), 10, 2)}  "
            f"{(f'{speed:.2f}x' if speed is not None else '-'):>11}")
    lines.append("")
    for r in runs:
        if r.get("compile_warmup_s") is not None:
            lines.append(f"# {r['name']}: compile warm-up {r['compile_warmup_s']:.2f} s (first step "
                         f"{r['first_step_s']:.2f} s), excluded from steady state")
    by_name = {r["name"]: r for r in runs}
    acc = by_name.get("accord")
    if acc is not None and acc.get("efficiency") is not None:
        text = f"# scaling efficiency on {acc['world_size']} ranks: accord {acc['efficiency']:.2f}"
        base = by_name.get(cfg.get("baseline"))
        if base is not None and base.get("efficiency") is not None:
            text += f", {base['name']} {base['efficiency']:.2f}"
        lines.append(text + " (samples/s(N) / (N x samples/s(1)), same invocation)")
    lines.append("# samples/s = samples of the timed steps / their total time; per step = "
                 "each step's samples/s, mean ± 1.96σ")
    if acc is not None and acc.get("speedup_vs_baseline") is not None:
        lines.append(f"# accord vs {cfg.get('baseline')}: {acc['speedup_vs_baseline']:.2f}x samples/s "
                     "(same invocation, same ranks)")
    return "\n".join(lines).rstrip()


def progress_bar(total: int, label: str, enabled: bool) -> Any:
    """A tqdm bar on stderr when ``enabled``, stderr is a terminal and tqdm is installed; else None."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit="step", leave=False, file=sys.stderr)


def write_json(result: dict[str, Any], path: str) -> None:
    """Write ``result`` as indented JSON."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2, sort_keys=False)
        fh.write("\n")


def check_plotting() -> None:
    """Raise ConfigError (with how to install it) when matplotlib is not importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ConfigError(with_hint(f"--plot needs matplotlib, which could not be imported: {exc}",
                                    PLOT_HINT)) from None


def _pyplot() -> Any:
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict[str, Any], path: str) -> None:
    """Draw the result: bandwidth vs size (collectives) or samples/s vs world size (train)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        if result["kind"] == "collectives":
            _plot_collectives(ax, result)
        else:
            _plot_train(ax, result)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _plot_collectives(ax: Any, result: dict[str, Any]) -> None:
    for s in result["series"]:
        sizes = [r["size_bytes"] for r in s["rows"]]
        label = f"{s['op']} {s['dtype']} {s['backend']} ({s['api']})"
        ax.plot(sizes, [r["busbw_gbps"]["median"] for r in s["rows"]], marker="o", label=label)
        if any(r.get("raw") for r in s["rows"]):
            raw = [r["raw"]["busbw_gbps"]["median"] if r.get("raw") else float("nan") for r in s["rows"]]
            ax.plot(sizes, raw, marker="x", linestyle="--", label=f"{s['op']} {s['dtype']} raw torch.distributed")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, median)")
    ax.set_title("accord-bench collectives")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def _plot_train(ax: Any, result: dict[str, Any]) -> None:
    runs = {r["name"]: r for r in result["runs"]}
    single = runs.get("single")
    for r in result["runs"]:
        if r["name"] == "single":
            continue
        xs, ys = [r["world_size"]], [r["throughput"]]
        if single is not None:
            xs.insert(0, 1)
            ys.insert(0, single["throughput"])
        ax.plot(xs, ys, marker="o", label=r["name"])
    if single is not None:
        top = max(r["world_size"] for r in result["runs"])
        ax.plot([1, top], [single["throughput"], top * single["throughput"]],
                linestyle=":", color="gray", label="linear scaling")
    ax.set_xticks(sorted({1, *(r["world_size"] for r in result["runs"])}))
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title(f"accord-bench train: {result['config'].get('model')}")
    ax.grid(True, alpha=0.3)
    ax.legend()
