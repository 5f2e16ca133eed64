"""The "add a collective" checklist of docs/architecture.md, as a test: every engine op is dispatched by
the executor, is a method every concrete communicator implements, and is reachable from the frontends
that have a name for it."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import accord.comm
from accord.comm.backend import Communicator
from accord.engine.request import Op

SRC = Path(__file__).resolve().parents[2] / "src" / "accord"

# The communicator method that runs each op.
METHOD = {Op.ALLREDUCE: "allreduce", Op.ALLGATHER: "allgather", Op.BROADCAST: "broadcast",
          Op.ALLTOALL: "alltoall", Op.REDUCESCATTER: "reduce_scatter", Op.REDUCE: "reduce",
          Op.GATHER: "gather", Op.SCATTER: "scatter", Op.BARRIER: "barrier"}
# Horovod's name of each op in accord.torch and accord.mxnet; ops Horovod has no name for are served by
# the torch.distributed backend's reduce/gather/scatter.
HOROVOD_NAME = {Op.ALLREDUCE: "allreduce", Op.ALLGATHER: "allgather", Op.BROADCAST: "broadcast",
                Op.ALLTOALL: "alltoall", Op.REDUCESCATTER: "reducescatter", Op.BARRIER: "barrier"}
WITHOUT_HOROVOD_NAME = {Op.REDUCE, Op.GATHER, Op.SCATTER}


def _comm_classes() -> list[type]:
    for info in pkgutil.walk_packages(accord.comm.__path__, "accord.comm."):
        if info.name.endswith(".mpi"):
            pytest.importorskip("mpi4py")
        importlib.import_module(info.name)
    found, todo = [], [Communicator]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("accord.comm"):
                found.append(sub)
    return found


def test_every_op_has_a_method_and_a_horovod_name_or_is_listed_without_one():
    assert set(METHOD) == set(Op)
    assert set(HOROVOD_NAME) | WITHOUT_HOROVOD_NAME == set(Op) and not set(HOROVOD_NAME) & WITHOUT_HOROVOD_NAME


def test_the_executor_dispatches_every_op():
    tree = ast.parse((SRC / "engine" / "cycle" / "execute.py").read_text(encoding="utf-8"))
    named = {node.attr for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Op"}
    missing = sorted(op.name for op in Op if op.name not in named)
    assert not missing, f"engine/cycle/execute.py never dispatches {missing}"


def test_every_op_is_an_abstract_method_of_the_communicator():
    abstract = Communicator.__abstractmethods__
    assert {METHOD[op] for op in Op} <= abstract, sorted({METHOD[op] for op in Op} - abstract)


def test_every_concrete_communicator_implements_every_op():
    classes = _comm_classes()
    names = {c.__name__ for c in classes}
    assert {"BaseCommunicator", "TorchCommunicator", "ShmCommunicator", "HierarchicalCommunicator",
            "HostStagedCommunicator"} <= names, names
    for cls in classes:
        if inspect.isabstract(cls):
            assert cls.__name__ == "BaseCommunicator", f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)}"
            continue
        for op in Op:
            assert callable(getattr(cls, METHOD[op], None)), f"{cls.__name__} lacks {METHOD[op]}"


@pytest.mark.parametrize("frontend", ["accord.torch", "accord.mxnet"])
def test_both_frontends_export_every_op_horovod_names(frontend):
    tree = ast.parse((SRC / frontend.split(".")[1] / "__init__.py").read_text(encoding="utf-8"))
    exported = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    missing = sorted(name for name in HOROVOD_NAME.values() if name not in exported)
    if frontend == "accord.mxnet":
        missing = [m for m in missing if m != "barrier"]  # Horovod's MXNet API has no barrier
    assert not missing, f"{frontend} does not export {missing}"
