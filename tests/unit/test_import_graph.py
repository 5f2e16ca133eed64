"""The import graph of src/accord: no circles, imports point down the layers of the design, and an
import from another package reaches only a module that package declares public.

Every module is parsed with ``ast`` (nothing is imported). An edge ``a -> b`` is any
``import``/``from ... import`` of ``b`` anywhere in ``a``: at module level, inside functions
(lazy imports are still dependencies) and in ``try`` blocks; only imports under
``if TYPE_CHECKING:`` are not edges (they never run). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The layers, bottom first (the table of docs/architecture.md; scripts/module_map.py orders the module map
# by them). A module belongs to the longest prefix listed.
# Packages on one line sit side by side: they may not import each other either.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["accord.config", "accord.errors", "accord.group_teardown", "accord.host_lists", "accord.logs",
              "accord.models",
              "accord.mpi_init", "accord.network_interfaces", "accord.owned_files", "accord.placement",
              "accord.registry",
              "accord.settings", "accord.version", "accord.worker_contract"]),
    ("store", ["accord.store"]),
    ("launcher", ["accord.run"]),  # no torch
    ("comm | runtime", ["accord.comm", "accord.runtime"]),
    ("engine", ["accord.engine"]),
    ("frontend", ["accord.frontend"]),  # the framework-neutral half of every frontend
    ("frontends", ["accord.torch", "accord.kvstore", "accord.data", "accord.mxnet", "accord.distributed"]),
    ("high-level", ["accord.hapi"]),
    ("integrations", ["accord.lightning", "accord.ray"]),  # other frameworks' ways of training and of starting jobs
    ("tools", ["accord.bench"]),
    # The package itself: ``accord.__version__`` and the lazy ``accord.spawn`` / ``accord.Model``
    # (nothing inside accord imports it; the version lives in accord.version).
    ("facade", ["accord"]),
]
# Within the base layer modules may use each other (logs reads config, models use the registry);
# the cycle check still applies to them.
SIDE_BY_SIDE_ALLOWED = {"base"}
# Packages of one layer that build on another of the same layer, by design (package -> package):
# MXNet's KVStore plug-in is accord's KVStore behind MXNet's interface.
BUILDS_ON = {("accord.mxnet", "accord.kvstore"),
             # importing accord.torch makes the torch.distributed backend's name known (registration only)
             ("accord.torch", "accord.distributed")}

# Known cycles (none left); a new one fails the test.
KNOWN_CYCLES: set[frozenset[str]] = set()
# Imports that point up or sideways, left for later work; remove each entry when it is gone.
KNOWN_UPWARD: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=1)
def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__); the tree is walked once per session
    (callers must not change the result)."""
    found = {}
    for path in sorted((SRC / "accord").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement may bind (candidates, most specific first)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def _resolve(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _edges(module: str, path: Path, is_package: bool, modules: dict[str, tuple[Path, bool]]) -> set[str]:
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for name in _imported_names(node, module, is_package):
                if name.split(".")[0] == "accord" and (target := _resolve(name, modules)):
                    targets.add(target)
        elif isinstance(node, ast.ImportFrom):
            names = _imported_names(node, module, is_package)
            base = names[-1]
            if base.split(".")[0] == "accord":
                for name in names[:-1]:
                    target = name if name in modules else _resolve(base, modules)
                    if target:
                        targets.add(target)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    targets.discard(module)
    return targets


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (parsed once per session; callers must not change it)."""
    modules = _modules()
    return {m: _edges(m, path, is_pkg, modules) for m, (path, is_pkg) in modules.items()}


def _layer_of(module: str) -> tuple[int, str, str]:
    """(layer index, layer name, the listed package the module belongs to)."""
    best: tuple[int, str, str] | None = None
    for index, (layer, packages) in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and \
                    (best is None or len(package) > len(best[2])):
                best = (index, layer, package)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)"
    return best


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _show(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    inside = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return "{" + ", ".join(sorted(component)) + "}: " + "; ".join(inside)


def test_the_graph_sees_the_imports_it_must():
    # Guards the parser: a module-level, a function-level and a package-level import.
    graph = _graph()
    assert "accord.config" in graph["accord.logs"]
    assert "accord.run.functions.spawn" in graph["accord"]  # inside __getattr__
    assert "accord.comm" in graph["accord.bench.options"]  # `from accord.comm import ...` in a function
    assert "accord.store.wire" in graph["accord.runtime.rendezvous"]  # `from accord.store import wire`


def test_no_import_cycles():
    graph = _graph()
    found = set(_cycles(graph))
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(_show(c, graph) for c in new)
    gone = KNOWN_CYCLES - found
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {sorted(map(sorted, gone))}"


def test_imports_point_down_the_layers():
    graph = _graph()
    wrong = set()
    for module, targets in graph.items():
        low, layer, package = _layer_of(module)
        for target in targets:
            t_low, t_layer, t_package = _layer_of(target)
            upward = t_low > low
            sideways = (t_low == low and t_package != package and layer not in SIDE_BY_SIDE_ALLOWED
                        and (package, t_package) not in BUILDS_ON)
            if upward or sideways:
                wrong.add((module, target))
    new = sorted(wrong - KNOWN_UPWARD)
    assert not new, "imports that do not point down (module -> target [layers]):\n" + "\n".join(
        f"{a} -> {b} [{_layer_of(a)[1]} -> {_layer_of(b)[1]}]" for a, b in new)
    gone = KNOWN_UPWARD - wrong
    assert not gone, f"these imports are gone: remove them from KNOWN_UPWARD: {sorted(gone)}"


def test_every_module_has_a_layer():
    for module in _graph():
        _layer_of(module)


# What may be used from outside a package: each top-level package (``accord.<name>/__init__.py``)
# declares ``PUBLIC_MODULES``, a literal tuple of its modules that other accord packages may import
# (names relative to the package: ``"functions.spawn"``). Importing the package itself is always
# allowed; tests may import anything, so only src/accord's imports are checked.


def _top_package(module: str) -> str | None:
    """``accord.<name>`` when that is a package holding ``module``; None for base modules and the facade."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    top = ".".join(parts[:2])
    return top if _modules()[top][1] else None


def _top_packages() -> list[str]:
    return sorted({top for m in _modules() if (top := _top_package(m))})


def _declared_public(package: str) -> tuple[str, ...]:
    """The full names of the modules ``package`` lists in its ``PUBLIC_MODULES`` (read with ``ast``)."""
    path = _modules()[package][0]
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "PUBLIC_MODULES":
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), \
                f"{path}: PUBLIC_MODULES must be a literal tuple of module names"
            return tuple(f"{package}.{name}" for name in value)
    raise AssertionError(f"{path} declares no PUBLIC_MODULES: list the modules other packages may import "
                         "(an empty tuple when they use the package itself)")


def _imports_from_outside() -> dict[str, dict[str, set[str]]]:
    """package -> {module of it imported from another package -> the importers}."""
    found: dict[str, dict[str, set[str]]] = {}
    for module, targets in _graph().items():
        for target in targets:
            package = _top_package(target)
            if package and target != package and _top_package(module) != package:
                found.setdefault(package, {}).setdefault(target, set()).add(module)
    return found


def test_every_package_declares_existing_public_modules():
    modules = _modules()
    for package in _top_packages():
        for name in _declared_public(package):
            assert name in modules, f"{package}.PUBLIC_MODULES names {name}, which is no module"


def test_imports_across_packages_reach_only_public_modules():
    wrong = sorted(f"{importer} -> {target}" for package, used in _imports_from_outside().items()
                   for target, importers in used.items() if target not in _declared_public(package)
                   for importer in importers)
    assert not wrong, ("imports of modules their package does not declare public (use the package's own "
                       "names, or add the module to its PUBLIC_MODULES):\n" + "\n".join(wrong))


def test_every_public_module_is_used_from_outside():
    """A list that only grows says nothing: a module no other package imports is the package's own."""
    used = _imports_from_outside()
    unused = sorted(name for package in _top_packages() for name in _declared_public(package)
                    if name not in used.get(package, {}))
    assert not unused, f"no other package imports these: remove them from PUBLIC_MODULES: {unused}"
