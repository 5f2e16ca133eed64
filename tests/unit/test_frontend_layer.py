"""The shared frontend layer and the engine's declared surface, counted from the source.

Three numbers may not grow back: ``ProcessSet`` is defined once (in accord.frontend); none of
the framework-neutral names (init, shutdown, the who-am-I queries, process sets, timeline) is
defined in accord.torch or accord.mxnet, which re-export accord.frontend's; and the frontends
import the engine only through ``accord.engine`` itself, never one of its modules.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import accord.engine
from accord.errors import InvalidArgumentError
from accord.frontend import lifecycle
from accord.frontend import process_sets as sets

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[2] / "src"
ACCORD = SRC / "accord"

# Framework-neutral: one definition in accord.frontend, re-exported by accord.torch and accord.mxnet.
NEUTRAL = {
    "ProcessSet", "add_process_set", "remove_process_set", "init", "shutdown", "topology", "size",
    "rank", "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous",
    "is_initialized", "start_timeline", "stop_timeline",
}
# Names both frameworks define, each on its own tensors or arrays (or privately, by chance).
FRAMEWORK_SPECIFIC = {
    "DistributedOptimizer", "SyncBatchNorm", "allgather", "allgather_object", "allreduce",
    "allreduce_", "alltoall", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters",
    "grouped_allgather", "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter",
    "reducescatter", "run", "_dense", "_ragged_problem",
}
# The packages above the engine (tests/unit/test_import_graph.py has the layers).
ABOVE_THE_ENGINE = ["frontend", "torch", "mxnet", "kvstore", "data", "hapi", "bench"]


def _trees(package: str) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for p in sorted((ACCORD / package).rglob("*.py"))]


def _defined(package: str) -> set[str]:
    """Names a package's modules define at module level (def / class)."""
    return {node.name for _, tree in _trees(package) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _is_engine_module(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[:2] != ["accord", "engine"] or len(parts) < 3:
        return False
    return (ACCORD / "engine" / f"{parts[2]}.py").exists() or (ACCORD / "engine" / parts[2]).is_dir()


def _engine_modules_in(tree: ast.AST) -> set[str]:
    """The accord.engine.<module> names a module's imports reach (any import form)."""
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {".".join(name.split(".")[:3]) for name in names if _is_engine_module(name)}
    return found


def _engine_modules_imported(package: str) -> dict[str, set[str]]:
    """accord.engine.<module> -> the files of ``package`` that import it."""
    found: dict[str, set[str]] = {}
    for path, tree in _trees(package):
        for module in _engine_modules_in(tree):
            found.setdefault(module, set()).add(str(path.relative_to(SRC)))
    return found


def test_the_process_set_class_is_defined_once_in_the_frontend_layer():
    where = [(str(p.relative_to(SRC)), node.lineno) for package in ("",) for p, tree in _trees(package)
             for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "ProcessSet"]
    assert len(where) == 1 and where[0][0] == "accord/frontend/process_sets.py", where


def test_no_framework_neutral_name_is_defined_by_a_framework():
    torch_names, mxnet_names = _defined("torch"), _defined("mxnet")
    assert sorted(NEUTRAL & torch_names & mxnet_names) == []  # accord.frontend defines them once
    assert sorted(NEUTRAL & (torch_names | mxnet_names)) == []
    frontend_names = _defined("frontend")
    assert NEUTRAL <= frontend_names, sorted(NEUTRAL - frontend_names)


def test_what_both_frameworks_define_is_framework_specific():
    both = _defined("torch") & _defined("mxnet")
    assert sorted(both - FRAMEWORK_SPECIFIC) == [], (
        "defined in accord.torch and accord.mxnet alike: put it in accord.frontend once, or add "
        "it to FRAMEWORK_SPECIFIC if it works on the framework's own tensors")


def test_frontends_import_no_module_of_the_engine():
    deeper = {package: found for package in ABOVE_THE_ENGINE if (found := _engine_modules_imported(package))}
    distinct = {module for found in deeper.values() for module in found}
    assert len(distinct) == 0, f"use `from accord import engine` (its __all__) instead: {deeper}"


def test_the_counter_sees_every_import_form():
    # Guards the counter above: the forms that reach a module of the engine, and one that does not.
    code = ("import accord.engine.request\nfrom accord.engine.sets import GLOBAL_ID\n"
            "from accord.engine import session\nfrom accord.engine import Op\nfrom accord import engine\n")
    seen = _engine_modules_in(ast.parse(code))
    assert seen == {"accord.engine.request", "accord.engine.sets", "accord.engine.session"}


def test_the_engines_surface_is_declared_and_resolves_to_its_modules():
    from accord.engine import compression, request, session
    from accord.engine import sets as engine_sets

    assert sorted(accord.engine.__all__) == sorted(accord.engine._HOMES)
    homes = {"session": session, "request": request, "compression": compression, "sets": engine_sets}
    for name, (home, attribute) in accord.engine._HOMES.items():
        assert getattr(accord.engine, name) is getattr(homes[home], attribute), name
    assert accord.engine.current_engine is session.engine
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        accord.engine.nothing_here  # noqa: B018


@pytest.mark.parametrize("module", ["accord.engine", "accord.engine.request", "accord.engine.naming"])
def test_importing_the_engine_package_or_a_module_stays_cheap(module):
    code = (f"import sys, {module}\n"
            "heavy = [m for m in ('torch', 'accord.engine.session', 'accord.engine.cycle') if m in sys.modules]\n"
            f"print(heavy if {module!r} == 'accord.engine' else [m for m in heavy if m != 'torch'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_accord_torch_re_exports_the_shared_objects():
    import accord.torch as hvd
    from accord.frontend import queries, timeline_control

    assert hvd.ProcessSet is sets.ProcessSet and hvd.global_process_set is sets.global_process_set
    assert hvd.add_process_set is sets.add_process_set and hvd.remove_process_set is sets.remove_process_set
    assert hvd.init is lifecycle.init and hvd.shutdown is lifecycle.shutdown
    for name in ("size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
                 "is_homogeneous", "is_initialized"):
        assert getattr(hvd, name) is getattr(queries, name), name
    assert hvd.start_timeline is timeline_control.start_timeline
    assert hvd.stop_timeline is timeline_control.stop_timeline


def test_process_sets_before_init_keep_horovods_messages():
    assert sets.ProcessSet([2, 0]).ranks == [0, 2]
    for bad in ([0, "1"], [True], 5, None):
        with pytest.raises(ValueError, match="^ProcessSet should be initialized with a list of process ranks"):
            sets.ProcessSet(bad)
    ps = sets.ProcessSet([0, 1])
    assert (ps.size(), ps.rank(), ps.included()) == (None, None, None)
    assert str(ps) == "ProcessSet(process_set_id=None, ranks=[0, 1], mpi_comm=None)"
    with pytest.raises(InvalidArgumentError, match="is not registered\nHINT:"):
        sets.set_id_of(ps)
    assert sets.set_id_of(sets.global_process_set) == 0
    assert sets.remove_process_set(ps) is False and sets.remove_process_set(sets.global_process_set) is False
    with pytest.raises(ValueError, match=r"^Horovod has not been initialized; use hvd.init\(\).$"):
        sets.add_process_set([0])


def test_a_frontends_hooks_are_added_once_and_run_around_shutdown(monkeypatch):
    ran = []
    monkeypatch.setattr(lifecycle, "_after_shutdown", [])
    lifecycle.add_hooks(after_shutdown=lambda: ran.append("first"))
    hook = lifecycle._after_shutdown[-1]
    lifecycle.add_hooks(after_shutdown=hook)
    assert lifecycle._after_shutdown.count(hook) == 1
    lifecycle.shutdown()  # not initialized: the engine part is a no-op, the hooks still run
    assert ran == ["first"]
