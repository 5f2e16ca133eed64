"""accord.torch under torch.compile on 2 real ranks: collectives in a fullgraph-compiled function
equal eager mode and numpy, backward through compiled collectives follows Horovod's rules, and a
compiled model trains to the same weights as eager (DistributedOptimizer hooks, and the fused
``allreduce_gradients`` path) and as one process on the full batch.

Compiling is slow on 2 cores, so one set of ranks runs every aot_eager check (a module fixture)
and returns numpy arrays; the tests below compare them with expectations computed here. Inputs
are regenerated from (seed, rank), so every rank's data is known to the parent.
"""
import shutil
import sys

import numpy as np
import pytest
from helpers.ranks import run_ranks

SIZE = 2
SPLITS = {0: [1, 3], 1: [2, 2]}  # alltoall rows rank r sends to rank 0 and rank 1
LR, MOMENTUM, STEPS = 0.1, 0.9, 3


def _compile_unsupported() -> str | None:
    try:
        import torch
        import torch._dynamo
    except Exception as exc:  # pragma: no cover - depends on the environment
        return f"torch.compile unavailable: {exc}"
    if not hasattr(torch.library, "custom_op"):  # pragma: no cover
        return f"torch {torch.__version__} has no torch.library.custom_op (needs >= 2.4)"
    if not torch._dynamo.is_dynamo_supported():  # pragma: no cover
        return f"torch.compile does not support Python {sys.version.split()[0]} in this torch"
    return None


UNSUPPORTED = _compile_unsupported()
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(UNSUPPORTED is not None, reason=str(UNSUPPORTED))]


def _data(seed, rank, shape):
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-4, 5, size=shape).astype("float32")


def _scatter_rows(rows, rank, size):
    return rows // size + (1 if rank < rows % size else 0)


# --- what every rank runs -----------------------------------------------------------------------

def _inputs(rank):
    import torch

    return {"x": torch.from_numpy(_data(1, rank, (4, 3))),
            "r": torch.from_numpy(_data(2, rank, (rank + 1, 3))),  # ragged for allgather
            "y": torch.from_numpy(_data(3, rank, (5, 3))),
            "w": torch.from_numpy(_data(4, rank, (4, 3))),
            "wr": torch.from_numpy(_data(5, rank, (_scatter_rows(5, rank, SIZE), 3)))}


def _opchecks(rank):
    """torch.library.opcheck on every op: schema, autograd registration, fake vs real kernel,
    AOT dispatch with dynamic shapes (each case runs the real collective several times)."""
    import torch

    from accord.torch import compiled_ops as ops

    def leaf(*shape):
        return torch.randn(*shape, requires_grad=True)

    cases = {
        "allreduce": (ops.allreduce, (leaf(4, 3), "", 1, 0.5, 2.0, 0)),
        "grouped_allreduce": (ops.grouped_allreduce,
                              ([leaf(4, 3), leaf(2, 5)], "", 0, 1.0, 1.0, 0)),
        "allgather": (ops.allgather, (leaf(rank + 1, 3), "", 0, -1)),
        # internal (allgather's backward), not differentiable itself
        "allgather_grad": (ops.allgather_grad, (torch.randn(3, 3), rank + 1, 0)),
        "broadcast": (ops.broadcast, (leaf(4, 3), 0, "", 0)),
        "reducescatter": (ops.reducescatter, (leaf(5, 3), "", 1, 1.0, 1.0, 0)),
        "alltoall": (ops.alltoall, (leaf(4, 3), torch.tensor(SPLITS[rank]), "", 0, -1)),
    }
    failures = {}
    for name, (op, args) in cases.items():
        report = torch.library.opcheck(op, args)
        failures.update({f"{name}.{k}": v for k, v in report.items() if v != "SUCCESS"})
    return failures


def _forward_checks(rank):
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    import accord.torch as hvd

    splits = SPLITS[rank]
    solo = [hvd.add_process_set([r]) for r in range(SIZE)][rank]  # a set of one: this rank

    def collectives(x, r, y):
        s = hvd.allreduce(x, name="sum", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        avg = hvd.allreduce(x * 2)  # unnamed: numbered when it runs, the same on every rank
        gathered = hvd.allgather(r, name="gather")
        bcast = hvd.broadcast(x, root_rank=1, name="bcast")
        a2a, received = hvd.alltoall(x, splits=splits, name="a2a")
        even = hvd.alltoall(y[:4])
        rs = hvd.reducescatter(y, name="rs", op=hvd.Sum)
        gx, gy = hvd.grouped_allreduce([x, y], name="grp", op=hvd.Max)
        inplace = hvd.allreduce_(x.clone(), name="inplace", op=hvd.Min)
        bf16 = hvd.allreduce(x / 4, name="bf16", op=hvd.Sum, compression=hvd.Compression.bf16)
        adasum = hvd.allreduce(x, name="adasum", op=hvd.Adasum)
        alone = hvd.allreduce(x, name="solo", op=hvd.Sum, process_set=solo)
        bcast_ = hvd.broadcast_(x.clone(), root_rank=0, name="bcast_")
        mx, my = hvd.grouped_allreduce_([x.clone(), y.clone()], name="grp_", op=hvd.Min)
        return (s, avg, gathered * 1, bcast, a2a, received, even, rs, gx, gy, inplace, bf16,
                adasum, alone, bcast_, mx, my)

    d = _inputs(rank)
    args = (d["x"], d["r"], d["y"])
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(collectives, fullgraph=True, backend=counter)(*args)
    eager = collectives(*args)
    for c, e in zip(compiled, eager):
        assert c.dtype == e.dtype and c.shape == e.shape, (c, e)
    assert counter.frame_count == 1  # one graph: no break, no recompile
    return {"compiled": [c.numpy() for c in compiled], "eager": [e.numpy() for e in eager]}


def _backward_checks(rank):
    import torch

    import accord.torch as hvd

    splits = SPLITS[rank]

    def loss(x1, r, x3, x4, y, x6, y6, w, wr):
        total = (hvd.allreduce(x1, op=hvd.Sum) * w).sum()
        g = hvd.allgather(r)
        total = total + (g * g).sum() * (rank + 1)
        total = total + (hvd.broadcast(x3, root_rank=1) * w).sum()
        a2a, _ = hvd.alltoall(x4, splits=splits)
        total = total + (a2a * a2a).sum() * (rank + 1)
        total = total + (hvd.reducescatter(y, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25) * wr).sum()
        gx, gy = hvd.grouped_allreduce([x6, y6])
        return total + (gx * w).sum() + gy.sum()

    d = _inputs(rank)
    base = [d["x"], d["r"], d["x"], d["x"], d["y"], d["x"], d["y"]]
    grads = {}
    for mode, fn in [("eager", loss),
                     ("compiled", torch.compile(loss, fullgraph=True, backend="aot_eager"))]:
        leaves = [t.clone().requires_grad_() for t in base]
        fn(*leaves, d["w"], d["wr"]).backward()
        grads[mode] = [t.grad.numpy() for t in leaves]
    return grads


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _train_checks(rank):
    import torch

    import accord.torch as hvd

    xs = [torch.from_numpy(_data(10 + s, rank, (8, 4))) / 4 for s in range(STEPS)]
    ys = [torch.from_numpy(_data(20 + s, rank, (8, 1))) / 4 for s in range(STEPS)]
    out = {"initial": [p.detach().numpy().copy() for p in _mlp().parameters()]}

    def weights(model):
        return [p.detach().numpy().copy() for p in model.parameters()]

    # Horovod's way, eager and with a compiled model: hooks fire after the compiled backward.
    for mode in ("eager", "compiled_hooks"):
        model = _mlp()
        net = torch.compile(model, backend="aot_eager") if mode != "eager" else model
        sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        opt = hvd.DistributedOptimizer(sgd, named_parameters=net.named_parameters())
        for x, y in zip(xs, ys):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            # every parameter's allreduce was started by its hook during backward
            assert sum(h is not None for h in opt._handles.values()) == 4
            opt.step()
        out[mode] = weights(model)
        opt.remove_hooks()

    # The fused path: plain optimizer, gradients reduced in one grouped call inside compiled code.
    model = _mlp()
    net = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    # (torch's optimizers break the graph around step() on purpose, so step() stays outside)
    @torch.compile(fullgraph=True, backend="aot_eager")
    def reduce_gradients():
        hvd.allreduce_gradients(model.parameters())

    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        reduce_gradients()
        opt.step()
    out["compiled_fused"] = weights(model)

    # ... and the same helper called eagerly (in place), with a predivide factor (same result)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        hvd.allreduce_gradients(model.parameters(), gradient_predivide_factor=2.0)
        opt.step()
    out["eager_fused"] = weights(model)
    return out


def _inductor_checks(rank):
    import torch

    import accord.torch as hvd

    def f(x):
        z = hvd.allreduce(torch.sin(x) * 2, name="inductor", op=hvd.Sum)
        return torch.relu(z) + 1

    x = torch.from_numpy(_data(30, rank, (16,)))
    got = torch.compile(f, fullgraph=True)(x)  # inductor: C++ code generated and built
    np.testing.assert_array_equal(got.numpy(), f(x).numpy())
    return got.numpy()


def _all_checks(rank, size, with_inductor):
    import torch
    from helpers.compile_settings import dynamic_output_shapes

    import accord.torch as hvd

    torch.manual_seed(0)
    hvd.init()
    try:
        with dynamic_output_shapes():
            return {"opcheck": _opchecks(rank), "forward": _forward_checks(rank),
                    "backward": _backward_checks(rank), "train": _train_checks(rank),
                    "inductor": _inductor_checks(rank) if with_inductor else None}
    finally:
        hvd.shutdown()


HAVE_CXX = shutil.which("g++") is not None or shutil.which("c++") is not None


@pytest.fixture(scope="module")
def inductor_dir(tmp_path_factory):
    # A private inductor cache: the inductor check really generates and builds its kernel.
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture(scope="module")
def results(inductor_dir):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_dir), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    return run_ranks(_all_checks, SIZE, HAVE_CXX, init="accord", timeout=150, env=env)


# --- expectations, computed here with numpy ------------------------------------------------------

def _expected_forward(rank):
    xs = [_data(1, r, (4, 3)) for r in range(SIZE)]
    rs = [_data(2, r, (r + 1, 3)) for r in range(SIZE)]
    ys = [_data(3, r, (5, 3)) for r in range(SIZE)]
    a2a = np.concatenate([xs[i][sum(SPLITS[i][:rank]):sum(SPLITS[i][:rank + 1])]
                          for i in range(SIZE)])
    even = np.concatenate([ys[i][:4][2 * rank:2 * rank + 2] for i in range(SIZE)])
    start = sum(_scatter_rows(5, j, SIZE) for j in range(rank))
    rs_rows = _scatter_rows(5, rank, SIZE)
    return [sum(xs) * 1.5, np.mean([2 * x for x in xs], 0), np.concatenate(rs), xs[1], a2a,
            np.array([SPLITS[i][rank] for i in range(SIZE)], dtype=np.int32), even,
            sum(ys)[start:start + rs_rows], np.max(xs, 0), np.max(ys, 0), np.min(xs, 0),
            sum(xs) / 4, _adasum(xs[0], xs[1]), xs[rank], xs[0], np.min(xs, 0), np.min(ys, 0)]


def _adasum(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot = np.sum(a * b)
    return (1 - dot / (2 * np.sum(a * a))) * a + (1 - dot / (2 * np.sum(b * b))) * b


def test_custom_ops_pass_opcheck(results):
    assert [res["opcheck"] for res in results] == [{}] * SIZE


def test_compiled_collectives_equal_eager_and_numpy(results):
    for rank, res in enumerate(results):
        want = _expected_forward(rank)
        got, eager = res["forward"]["compiled"], res["forward"]["eager"]
        assert len(got) == len(want)
        for i, (g, e, w) in enumerate(zip(got, eager, want)):
            np.testing.assert_array_equal(g, e, err_msg=f"rank {rank} output {i}: compiled/eager")
            np.testing.assert_allclose(g, w, rtol=1e-2 if i == 11 else 1e-5,
                                       err_msg=f"rank {rank} output {i}")


def _expected_grads(rank):
    xs = [_data(1, r, (4, 3)) for r in range(SIZE)]
    rs = [_data(2, r, (r + 1, 3)) for r in range(SIZE)]
    ws = [_data(4, r, (4, 3)) for r in range(SIZE)]
    wrs = [_data(5, r, (_scatter_rows(5, r, SIZE), 3)) for r in range(SIZE)]
    mean_factor = np.mean([r + 1 for r in range(SIZE)])
    # alltoall back: the rows rank sent to rank j come back scaled by 2 * (j + 1)
    dest = np.concatenate([np.full(n, j) for j, n in enumerate(SPLITS[rank])])
    return [sum(ws),                                     # allreduce Sum: allreduce Sum of grads
            2 * mean_factor * rs[rank],                  # allgather: average, own rows
            np.mean(ws, 0) * (rank == 1),                # broadcast: average, zero off root
            2 * (dest[:, None] + 1) * xs[rank],          # alltoall
            0.5 * SIZE * np.concatenate(wrs),            # reducescatter Sum: size * pre * post * allgather
            np.mean(ws, 0), np.ones((5, 3))]             # grouped Average


def test_backward_through_compiled_collectives_follows_horovod_rules(results):
    for rank, res in enumerate(results):
        grads = res["backward"]
        want = _expected_grads(rank)
        for i, (c, e, w) in enumerate(zip(grads["compiled"], grads["eager"], want)):
            np.testing.assert_allclose(c, e, rtol=1e-6,
                                       err_msg=f"rank {rank} grad {i}: compiled/eager")
            np.testing.assert_allclose(c, w, rtol=1e-6, err_msg=f"rank {rank} grad {i}")


def _numpy_training(initial):
    """SGD with momentum on the full batch of every rank, in one process (torch's update rule)."""
    w1, b1, w2, b2 = [p.astype(np.float64) for p in initial]
    bufs = None
    for s in range(STEPS):
        x = np.concatenate([_data(10 + s, r, (8, 4)) / 4 for r in range(SIZE)])
        y = np.concatenate([_data(20 + s, r, (8, 1)) / 4 for r in range(SIZE)])
        h = np.tanh(x @ w1.T + b1)
        d_out = 2 * (h @ w2.T + b2 - y) / len(x)
        d_pre = (d_out @ w2) * (1 - h * h)
        grads = [d_pre.T @ x, d_pre.sum(0), d_out.T @ h, d_out.sum(0)]
        bufs = grads if bufs is None else [MOMENTUM * b + g for b, g in zip(bufs, grads)]
        w1, b1, w2, b2 = [p - LR * b for p, b in zip((w1, b1, w2, b2), bufs)]
    return [w1, b1, w2, b2]


def test_compiled_model_trains_like_eager_and_full_batch(results):
    want = _numpy_training(results[0]["train"]["initial"])
    for rank, res in enumerate(results):
        train = res["train"]
        for mode in ("eager", "compiled_hooks", "compiled_fused", "eager_fused"):
            for i, (got, ref, w) in enumerate(zip(train[mode], train["eager"], want)):
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6,
                                           err_msg=f"rank {rank} {mode} param {i} vs eager")
                np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5,
                                           err_msg=f"rank {rank} {mode} param {i} vs numpy")


def test_inductor_compiles_allreduce(results, inductor_dir):
    if not HAVE_CXX:
        pytest.skip("inductor needs a C++ compiler (g++) on the CPU")
    assert list(inductor_dir.rglob("*.so")), "inductor built no C++ kernel"
    total = sum(np.sin(_data(30, r, (16,)).astype(np.float64)) * 2 for r in range(SIZE))
    for res in results:
        np.testing.assert_allclose(res["inductor"], np.maximum(total, 0) + 1, rtol=1e-5, atol=1e-5)
