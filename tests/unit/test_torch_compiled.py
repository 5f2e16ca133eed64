"""accord.torch's torch.compile path without starting ranks: the custom ops' registration and
fake kernels, the dispatch between eager and compiled code, and what a traced graph holds."""
import inspect

import numpy as np
import pytest
import torch
from helpers.compile_settings import dynamic_output_shapes

import accord.torch as hvd
from accord.errors import CollectiveError
from accord.torch import compiled, compiled_ops, mpi_ops

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(torch.library, "custom_op"),
                                 reason="torch.library.custom_op needs torch >= 2.4")]

WRAPPED = ["allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
           "broadcast", "broadcast_", "alltoall", "reducescatter"]


@pytest.mark.parametrize("name", WRAPPED)
def test_compile_aware_functions_keep_horovods_signatures(name):
    assert getattr(hvd, name) is getattr(compiled, name)
    assert inspect.signature(getattr(compiled, name)) == inspect.signature(getattr(mpi_ops, name))
    assert getattr(compiled, name).__doc__


def test_ops_are_registered_in_the_accord_namespace():
    want = {"allreduce": ["tensor", "name", "op", "prescale_factor", "postscale_factor",
                          "process_set_id"],
            "grouped_allreduce": ["tensors", "name", "op", "prescale_factor", "postscale_factor",
                                  "process_set_id"],
            "allgather": ["tensor", "name", "process_set_id", "total_rows"],
            "allgather_grad": ["grad", "rows", "process_set_id"],
            "broadcast": ["tensor", "root_rank", "name", "process_set_id"],
            "reducescatter": ["tensor", "name", "op", "prescale_factor", "postscale_factor",
                              "process_set_id"],
            "alltoall": ["tensor", "splits", "name", "process_set_id", "total_rows"]}
    for op_name, args in want.items():
        schema = getattr(torch.ops.accord, op_name).default._schema
        assert [a.name for a in schema.arguments] == args, op_name
        assert not any(a.alias_info for a in schema.arguments), f"{op_name} must not mutate"


def test_eager_calls_take_the_horovod_path():
    # Not compiling: the call reaches mpi_ops and fails as it does there before init.
    assert not compiled._compiling()
    with pytest.raises(CollectiveError, match="not been initialized"):
        hvd.allreduce(torch.ones(2))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(shape_env=ShapeEnv())


def test_fake_kernels_give_shapes_without_communicating():
    with _fake_mode() as mode:
        x = mode.from_tensor(torch.empty(4, 3))
        y = mode.from_tensor(torch.empty(2, 5, dtype=torch.float64))
        out = torch.ops.accord.allreduce(x, "", 1, 1.0, 1.0, 0)
        assert out.shape == (4, 3) and out.dtype == torch.float32 and out.is_contiguous()
        outs = torch.ops.accord.grouped_allreduce([x, y], "g", 0, 1.0, 1.0, 0)
        assert [(o.shape, o.dtype) for o in outs] == [((4, 3), torch.float32),
                                                       ((2, 5), torch.float64)]
        assert torch.ops.accord.broadcast(x, 1, "", 0).shape == (4, 3)
        known = torch.ops.accord.allgather(x, "", 0, 12)
        assert known.shape == (12, 3)
        ragged = torch.ops.accord.allgather(x, "", 0, -1)
        rows = ragged.shape[0]
        assert isinstance(rows, torch.SymInt) and ragged.shape[1] == 3  # data-dependent rows
        assert torch.ops.accord.allgather_grad(known, 4, 0).shape == (4, 3)


def test_scatter_rows_gives_lower_ranks_the_extra_rows():
    for rows in range(0, 12):
        for size in (1, 2, 3, 4):
            want = [len(part) for part in np.array_split(np.arange(rows), size)]
            assert [compiled_ops.scatter_rows(rows, r, size) for r in range(size)] == want


def test_fullgraph_trace_holds_accord_ops():
    """Dynamo turns the Horovod calls into accord ops in one graph; running it needs init."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(x):
        total = hvd.allreduce(x * 2, name="a", op=hvd.Sum)
        return total + hvd.broadcast(x, root_rank=0).sum() + hvd.allgather(x).sum()

    torch._dynamo.reset()
    try:
        with pytest.raises(CollectiveError, match="not been initialized"), dynamic_output_shapes():
            torch.compile(step, fullgraph=True, backend=backend)(torch.ones(3))
        assert len(graphs) == 1
        targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
        assert [t for t in targets if t.startswith("accord.")] == [
            "accord.allreduce.default", "accord.broadcast.default", "accord.allgather.default"]
    finally:
        torch._dynamo.reset()


def test_allreduce_gradients_checks_before_communicating():
    compiled.allreduce_gradients([])  # nothing to reduce: no-op, even before init
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    compiled.allreduce_gradients([frozen])
    assert frozen.grad is None
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3).to_sparse()
    pattern = r"(?s)sparse gradient \(parameter 0 .*shape \[3\]\).*HINT"
    with pytest.raises(ValueError, match=pattern):
        compiled.allreduce_gradients([p])


def test_deprecated_average_traces_without_a_warning():
    """Dynamo cannot trace warnings.warn: compiled code maps average= to Sum/Average silently."""
    ops_seen = []

    def backend(gm, example_inputs):
        ops_seen.extend(n.args[2] for n in gm.graph.nodes
                        if n.op == "call_function" and str(n.target) == "accord.allreduce.default")
        return gm.forward

    def step(x):
        return hvd.allreduce(x, average=False) + hvd.allreduce(x, average=True)

    torch._dynamo.reset()
    try:
        with pytest.raises(CollectiveError, match="not been initialized"):
            torch.compile(step, fullgraph=True, backend=backend)(torch.ones(3))
        assert ops_seen == [int(hvd.Sum), int(hvd.Average)]
    finally:
        torch._dynamo.reset()
