"""Inside a package, its sub-packages are layers too: imports point down their order, and the pure
negotiation imports neither threads nor communicators. Parsed with ``ast``, nothing imported."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_import_graph import _graph

SRC = Path(__file__).resolve().parents[2] / "src" / "accord"

# Bottom first; a module belongs to the longest prefix listed; the package's own top modules last.
ORDER: dict[str, list[list[str]]] = {
    "accord.run": [
        ["accord.run.settings"],
        ["accord.run.spec"],  # pure: what a launch is
        ["accord.run.processes"],  # starting and watching processes
        ["accord.run.elastic"],
        ["accord.run.config"],  # the launch configuration (elastic's among its parts)
        ["accord.run.functions"],  # accord.spawn and accord.run
        ["accord.run"],  # cli, launcher, job_start, mxnet_launch, check_build
    ],
    "accord.engine": [
        ["accord.engine.compression", "accord.engine.naming", "accord.engine.request", "accord.engine.sets",
         "accord.engine.settings"],
        ["accord.engine.negotiation"],  # pure
        ["accord.engine.cycle"],  # the threaded cycle
        ["accord.engine"],  # engine, startup, session and the declared surface
    ],
}


def _level(package: str, module: str) -> int:
    best, level = "", -1
    for index, group in enumerate(ORDER[package]):
        for prefix in group:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, level = prefix, index
    assert level >= 0, f"{module} is in no level of {package}: add it to ORDER"
    return level


@pytest.mark.parametrize("package", sorted(ORDER))
def test_imports_inside_a_package_point_down_its_sub_packages(package):
    graph = _graph()
    inside = [m for m in graph if m == package or m.startswith(package + ".")]
    wrong = []
    for module in inside:
        for target in graph[module]:
            if target != package and target.startswith(package + ".") and \
                    _level(package, target) > _level(package, module):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that point up inside " + package + ":\n" + "\n".join(sorted(wrong))


def test_the_negotiation_imports_no_threads_and_no_communicators():
    found = []
    for path in sorted((SRC / "engine" / "negotiation").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name == "threading" or (name.startswith("accord.comm") and name != "accord.comm.ops") \
                        or name.startswith("accord.engine.cycle"):
                    found.append(f"{path.name}: {name}")
    assert not found, found
