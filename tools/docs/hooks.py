"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

- ``<!-- include: PATH -->`` on a line of its own is replaced by that repository file (SECURITY.md
  is one file for GitHub readers and one page of the site), its links rebased to the page;
  ``<!-- include: PATH headings+1 -->`` also moves its headings one level down (its ``#`` title
  becomes a section of the page).
- ``<!-- help: accordrun -->`` (or ``accord-bench``, ``accord-bench train``, ...) is replaced by
  the program's ``--help`` text, asked of its argparse parser in this process: the page is what
  the installed code says, never a copy that drifts.
- A link to a file of the repository outside ``docs/`` (``../src/accord/x.py``) is checked to exist
  (a warning, which ``--strict`` turns into a failed build, when it does not) and becomes the path
  in code, since the site does not serve the source tree.
- ``plots/*.png``: drawn at build time from benchmarks/results/*.json by the same code as
  ``accord-bench --plot`` (``accord.bench.report.plot``), without running anything.
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import posixpath
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")

log = logging.getLogger("mkdocs.plugins.accord")

# Repository files that are also pages of the site: a link to one goes to its page.
PAGES_OF_FILES = {"SECURITY.md": "security.md", "benchmarks/RESULTS.md": "performance.md"}
# The plots of the performance page: (page path, result JSON under benchmarks/results).
PLOTS = {
    "plots/allreduce_engine.png": "bench_collectives_allreduce_engine.json",
    "plots/allreduce_comm.png": "bench_collectives_allreduce_comm.json",
    "plots/train_resnet50.png": "bench_train_resnet50_ddp.json",
    "plots/train_mlp.png": "bench_train_mlp_ddp.json",
}

_INCLUDE = re.compile(r"^<!-- include: (\S+)( headings\+1)? -->$", re.M)
_HELP = re.compile(r"^<!-- help: ([\w -]+?) -->$", re.M)
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def on_config(config):
    if SRC not in sys.path:  # the --help pages and plots come from this tree's accord
        sys.path.insert(0, SRC)
    return config


def _parser(program: str) -> argparse.ArgumentParser:
    """The argparse parser behind ``program`` (``accordrun``, ``accord-bench`` or one of its
    subcommands, ``accord-mxnet-launch``)."""
    words = program.split()
    if words[0] == "accordrun":
        from accord.run.cli import build_parser
    elif words[0] == "accord-bench":
        from accord.bench.cli import build_parser
    elif words[0] == "accord-mxnet-launch":
        from accord.run.mxnet_launch import build_parser
    else:
        raise ValueError(f"no parser known for {program!r}")
    parser = build_parser()
    for word in words[1:]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def help_text(program: str) -> str:
    """``program --help`` as the terminal shows it at 100 columns."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return _parser(program).format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _rebase_links(text: str, source: str, page: str, docs_dir: str) -> str:
    """Rewrite the relative links of ``text``, written in repository file ``source``, for the
    page ``page`` (both relative to the repository's root)."""

    def fix(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"[a-z][\w+.-]*:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        full = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if full in PAGES_OF_FILES:
            full = posixpath.join(docs_dir, PAGES_OF_FILES[full])
        if not os.path.exists(os.path.join(ROOT, full)):
            log.warning("%s: a link to %r (from %s), which is no file of the repository", page, target, source)
            return m.group(0)
        if full.startswith(docs_dir + "/"):
            new = posixpath.relpath(full, posixpath.dirname(page)) + (f"#{anchor}" if anchor else "")
            return f"[{label}]({new})"
        # a source file, a script, a test: the site does not serve them; name the path instead
        return label if full in label or posixpath.basename(full) in label else f"{label} (`{full}`)"

    return _outside_fences(text, lambda part: _LINK.sub(fix, part))  # links in code are code


def _outside_fences(text: str, change) -> str:
    """``text`` with ``change`` applied to every part outside fenced code blocks."""
    out, last = [], 0
    for fence in _FENCE.finditer(text):
        out.append(change(text[last:fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(change(text[last:]))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = os.path.relpath(config["docs_dir"], ROOT).replace(os.sep, "/")
    page_path = posixpath.join(docs_dir, page.file.src_uri)

    def include(m: re.Match) -> str:
        source = m.group(1)
        try:
            with open(os.path.join(ROOT, source), encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            log.warning("%s: cannot include %s: %s", page_path, source, exc)
            return m.group(0)
        if m.group(2):
            text = _outside_fences(text, lambda part: re.sub(r"^#", "##", part, flags=re.M))
        return _rebase_links(text, source, page_path, docs_dir)

    def help_block(m: re.Match) -> str:
        return f"```text\n$ {m.group(1)} --help\n{help_text(m.group(1)).rstrip()}\n```"

    markdown = _INCLUDE.sub(include, markdown)
    markdown = _HELP.sub(help_block, markdown)
    return _rebase_links(markdown, page_path, page_path, docs_dir)


def _plot_png(result_json: str) -> bytes | None:
    from accord.bench import report

    with open(os.path.join(ROOT, "benchmarks", "results", result_json), encoding="utf-8") as fh:
        result = json.load(fh)
    buf = io.BytesIO()
    report.plot(result, buf)
    return buf.getvalue()


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, result_json in PLOTS.items():
        try:
            content = _plot_png(result_json)
        except Exception as exc:  # noqa: BLE001 - a missing plot is a warning: --strict fails on it
            log.warning("plot %s from %s: %s: %s", uri, result_json, type(exc).__name__, exc)
            continue
        files.append(File.generated(config, uri, content=content))
    return files
