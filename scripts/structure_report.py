#!/usr/bin/env python3
"""The numbers that say whether src/accord reads as its concepts: one line per check, with its limit.

    python scripts/structure_report.py           # prints every figure; exit 1 if one is over its limit

Everything is computed from the source with ``ast`` (nothing is imported), so it runs without torch.
tests/unit/test_structure.py asserts the same limits, so a change that breaks one fails the tests.
"""
from __future__ import annotations

import ast
import functools
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "accord"
MAP = ROOT / "docs" / "architecture.md"

# The frameworks that put Horovod's API on the engine; their framework-neutral half lives once, below them.
FRAMEWORK_FRONTENDS = ("accord.torch", "accord.mxnet")
# Every package above the engine that reaches it through its declared surface (``accord.engine``).
ABOVE_ENGINE = ("accord.frontend", "accord.torch", "accord.mxnet", "accord.kvstore", "accord.data",
                "accord.distributed")
# Horovod names whose meaning does not depend on the framework: defined once, re-exported by each frontend.
NEUTRAL_NAMES = ("ProcessSet", "add_process_set", "remove_process_set", "init", "shutdown", "is_initialized",
                 "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous",
                 "mpi_threads_supported", "start_timeline", "stop_timeline")
# Modules that may read settings with ``config.get``: the settings modules and the programs' entry points.
SETTINGS_MODULE = re.compile(r"(^|\.)settings$")


@dataclass(frozen=True)
class Check:
    name: str
    value: int
    limit: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.value <= self.limit


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per process (several checks read each file)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.lru_cache(maxsize=None)
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module's tree (``ast.walk`` order), listed once per process."""
    return tuple(ast.walk(_tree(path)))


def _imports(path: Path, module: str) -> set[str]:
    """Dotted names imported anywhere in a module (``from a import b`` gives ``a.b`` and ``a``)."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def widest_folder(mods: dict[str, Path]) -> Check:
    counts = Counter(str(p.parent.relative_to(SRC)) for p in mods.values() if p.name != "__init__.py")
    folder, most = counts.most_common(1)[0]
    return Check("most .py files directly in one folder", most, 15, folder)


def shared_prefixes(mods: dict[str, Path]) -> Check:
    groups: Counter[tuple[str, str]] = Counter()
    for path in mods.values():
        stem = path.stem
        if "_" in stem.strip("_"):
            groups[(str(path.parent.relative_to(SRC)), stem.strip("_").split("_")[0])] += 1
    crowded = sorted(f"{folder}/{prefix}_* ({n})" for (folder, prefix), n in groups.items() if n >= 3)
    return Check("folders with 3 or more files sharing a word_ prefix", len(crowded), 0, ", ".join(crowded))


def engine_modules_used_above(mods: dict[str, Path]) -> Check:
    used = set()
    for module, path in mods.items():
        if module.startswith(ABOVE_ENGINE):
            used.update(n for n in _imports(path, module) if n.startswith("accord.engine.") and n in mods)
    return Check("distinct accord.engine.<module> imported by the frontends", len(used), 1, ", ".join(sorted(used)))


def _defines(mods: dict[str, Path], package: str) -> set[str]:
    """Top-level names a package's modules define themselves (def, class, or assignment)."""
    names = set()
    for module, path in mods.items():
        if module != package and not module.startswith(package + "."):
            continue
        for node in _tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def process_set_classes(mods: dict[str, Path]) -> Check:
    where = [m for m, p in mods.items() for n in _nodes(p)
             if isinstance(n, ast.ClassDef) and n.name == "ProcessSet"]
    return Check("ProcessSet class definitions", len(where), 1, ", ".join(where))


def neutral_names_twice(mods: dict[str, Path]) -> Check:
    defined = [_defines(mods, package) for package in FRAMEWORK_FRONTENDS]
    both = sorted(set(NEUTRAL_NAMES) & set.intersection(*defined))
    return Check("framework-neutral names defined in both frontends", len(both), 0, ", ".join(both))


def controller_mixins(mods: dict[str, Path]) -> Check:
    bases = [ast.unparse(b) for p in mods.values() for n in _nodes(p)
             if isinstance(n, ast.ClassDef) and n.name == "Controller" for b in n.bases]
    return Check("mixin bases of the controller", len(bases), 0, ", ".join(bases))


def cross_rank_rules(mods: dict[str, Path]) -> Check:
    """Functions that derive cross ranks from host names: they assign a ``cross_rank`` (or pass it as a
    keyword) computed from something, not copied from another object or read from the settings."""
    found = []
    for module, path in mods.items():
        for fn in _nodes(path):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                value = None
                if isinstance(node, ast.keyword) and node.arg == "cross_rank":
                    value = node.value
                elif isinstance(node, ast.Assign) and any(
                        (isinstance(t, ast.Name) and t.id == "cross_rank") or
                        (isinstance(t, ast.Attribute) and t.attr == "cross_rank") for t in node.targets):
                    value = node.value
                read = isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "get"
                if value is not None and not read and not isinstance(value, (ast.Attribute, ast.Name, ast.Constant)):
                    found.append(f"{module}.{fn.name}")
                    break
    found = sorted(set(found))
    return Check("functions deriving cross rank from host names", len(found), 1, ", ".join(found))


def config_readers(mods: dict[str, Path], entry_points: set[str]) -> Check:
    readers = []
    for module, path in mods.items():
        if module == "accord.config" or SETTINGS_MODULE.search(module) or module in entry_points:
            continue
        if "config.get" in path.read_text(encoding="utf-8"):
            readers.append(module)
    return Check("files calling config.get outside settings modules and entry points", len(readers), 3,
                 ", ".join(readers))


def entry_points() -> set[str]:
    """The console scripts of pyproject.toml and every ``__main__`` module and ``python -m`` program."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    scripts = set(re.findall(r'^\S+ = "([\w.]+):\w+"', text, flags=re.M))
    return scripts | {m for m in modules() if m.endswith(".__main__")}


def modules_missing_from_map(mods: dict[str, Path]) -> Check:
    text = MAP.read_text(encoding="utf-8") if MAP.exists() else ""
    named = set(re.findall(r"`(accord[\w.]*)`", text))
    missing = sorted(m for m in mods if m not in named)
    return Check("modules not named in the map (docs/architecture.md)", len(missing), 0,
                 ", ".join(missing[:12]) + (" ..." if len(missing) > 12 else ""))


def report() -> list[Check]:
    mods = modules()
    return [widest_folder(mods), shared_prefixes(mods), engine_modules_used_above(mods),
            process_set_classes(mods), neutral_names_twice(mods), controller_mixins(mods),
            cross_rank_rules(mods), config_readers(mods, entry_points()), modules_missing_from_map(mods)]


def main() -> int:
    checks = report()
    for c in checks:
        mark = "ok  " if c.ok else "OVER"
        print(f"{mark} {c.value:4d} (limit {c.limit:3d})  {c.name}" + (f": {c.detail}" if c.detail else ""))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
