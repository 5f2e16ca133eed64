"""The controller is composed, not mixed (accord/engine/cycle/controller.py): no base classes, and
each of its parts writes only its own attributes; the state they share is written by the
controller alone. Read from the source with ``ast`` (nothing runs)."""
from __future__ import annotations

import ast
from pathlib import Path

from accord.engine.cycle.caller_runs import CallerRuns
from accord.engine.cycle.controller import Controller
from accord.engine.cycle.in_flight import InFlight
from accord.engine.cycle.join_control import JoinControl
from accord.engine.cycle.negotiated import NegotiatedCycles
from accord.engine.cycle.plan import PlannedCycles, Planner
from accord.engine.cycle.state import CycleState

CYCLE = Path(__file__).resolve().parents[2] / "src" / "accord" / "engine" / "cycle"
MODULES = ["controller", "negotiated", "plan", "caller_runs", "join_control", "in_flight", "state"]
PARTS = [Controller, NegotiatedCycles, PlannedCycles, Planner, CallerRuns, JoinControl, InFlight, CycleState]
# Plain records a part keeps and fills in itself (attribute -> the one class that writes into it).
RECORDS = {"join_state": "JoinControl"}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    flat = []
    while found:
        t = found.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            found.extend(t.elts)
        elif isinstance(t, ast.Starred):
            found.append(t.value)
        else:
            flat.append(t)
    return flat


def _writes() -> list[tuple[str, str, str]]:
    """(writing class, path written through, attribute) for every attribute assignment made in
    a method of a class of the controller's modules; the path is ``self`` for the class's own
    attributes, ``state`` for the shared state, else the attribute of ``self`` written into."""
    out = []
    for module in MODULES:
        tree = ast.parse((CYCLE / f"{module}.py").read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                for t in _targets(node):
                    if not isinstance(t, ast.Attribute):
                        continue
                    base = t.value
                    if isinstance(base, ast.Name) and base.id == "self":
                        out.append((cls.name, "self", t.attr))
                    elif isinstance(base, ast.Name) and base.id == "state":
                        out.append((cls.name, "state", t.attr))
                    elif (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                          and base.value.id == "self"):
                        out.append((cls.name, "state" if base.attr == "_state" else base.attr, t.attr))
    return out


def test_the_controller_and_its_parts_have_no_base_classes():
    assert Controller.__bases__ == (object,)
    for part in PARTS:
        assert part.__bases__ == (object,), part


def test_each_attribute_is_written_by_one_class():
    writes = _writes()
    assert writes, "no attribute writes found: the parser no longer sees the classes"
    writers: dict[tuple[str, str], set[str]] = {}
    for cls, path, attr in writes:
        owner = cls if path == "self" else "CycleState" if path == "state" else f"{path} record"
        writers.setdefault((owner, attr), set()).add(cls)
        if path not in ("self", "state"):
            assert RECORDS.get(path) == cls, f"{cls} writes {path}.{attr}: another part's attribute"
    shared = {attr: classes for (owner, attr), classes in writers.items() if owner == "CycleState"}
    assert shared, "the controller writes none of the shared state: the parser missed it"
    assert all(classes == {"Controller"} for classes in shared.values()), shared
    assert all(len(classes) == 1 for classes in writers.values()), writers
