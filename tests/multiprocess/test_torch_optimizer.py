"""DistributedOptimizer and the broadcast helpers on real ranks.

The reference for every training check is plain single-process torch on the concatenation of
every rank's batch (computed inside each rank: the models are tiny), so "distributed training
equals big-batch training" is checked directly.
"""
import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)


def _model(seed=0, extra=False):
    import torch

    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(5, 8)
            self.fc2 = torch.nn.Linear(8, 3)
            self.side = torch.nn.Linear(5, 3)  # used only when asked (data-dependent graphs)

        def forward(self, x, use_side=False):
            out = self.fc2(torch.tanh(self.fc1(x)))
            return out + self.side(x) if use_side else out

    return Net().double()


def _batch(step, rank, rows=4):
    import torch

    rng = np.random.default_rng([step, rank])
    return (torch.from_numpy(rng.normal(size=(rows, 5))), torch.from_numpy(rng.normal(size=(rows, 3))))


def _params(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _same(a, b, tol):
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


def _train(rank, size, steps, passes=1, side_on=(), **opt_kw):
    """Distributed training with DistributedOptimizer; returns the final parameters."""
    import torch

    import accord.torch as hvd

    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **opt_kw)
    for step in range(steps):
        for micro in range(passes):
            x, y = _batch(step * passes + micro, rank)
            loss = torch.nn.functional.mse_loss(model(x, use_side=rank in side_on), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
    return _params(model)


def _reference(size, steps, passes=1, side_on=(), op_sum=False):
    """The same training in one process: per micro-step, the mean over ranks of each rank's loss."""
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        for micro in range(passes):
            losses = []
            for r in range(size):
                x, y = _batch(step * passes + micro, r)
                losses.append(torch.nn.functional.mse_loss(model(x, use_side=r in side_on), y))
            (sum(losses) if op_sum else sum(losses) / size).backward()
        opt.step()
        opt.zero_grad()
    return _params(model)


def _optimizer_checks(rank, size):
    import warnings

    import torch

    import accord.torch as hvd

    hvd.init()
    # equal to single-process training on the concatenated batch
    _same(_train(rank, size, 4), _reference(size, 4), 1e-10)
    # gradient accumulation over 2 backward passes per step
    _same(_train(rank, size, 3, passes=2), _reference(size, 3, passes=2), 1e-10)
    # a parameter only rank 0 uses: no hang, its gradient averages with zeros
    _same(_train(rank, size, 3, side_on=(0,)), _reference(size, 3, side_on=(0,)), 1e-10)
    # grouping (count and explicit lists), predivide factor, Sum: same numbers
    _same(_train(rank, size, 2, groups=2), _reference(size, 2), 1e-10)
    with pytest.warns(DeprecationWarning, match="num_groups"):
        trained = _train(rank, size, 2, num_groups=1)
    _same(trained, _reference(size, 2), 1e-10)
    _same(_train(rank, size, 2, gradient_predivide_factor=2.0), _reference(size, 2), 1e-10)
    _same(_train(rank, size, 2, op=hvd.Sum), _reference(size, 2, op_sum=True), 1e-10)
    m = _model()
    explicit = [[m.fc1.weight, m.fc2.bias], [m.side.weight]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), groups=explicit,
                                   named_parameters=m.named_parameters())
    x, y = _batch(0, rank)
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = [torch.nn.functional.mse_loss(ref(bx), by) for bx, by in (_batch(0, r) for r in range(size))]
    (sum(losses) / size).backward()
    ref_opt.step()
    _same(_params(m), _params(ref), 1e-10)
    # compression: fp16 and bf16 on the wire, float64 parameters (loose tolerance)
    _same(_train(rank, size, 2, compression=hvd.Compression.fp16), _reference(size, 2), 1e-2)
    _same(_train(rank, size, 2, compression=hvd.Compression.bf16), _reference(size, 2), 5e-2)

    # the wrapper is a subclass of the wrapped optimizer's class
    m = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    # guards: too many backward passes; zero_grad before step; step after synchronize warns
    x, y = _batch(0, rank)
    torch.nn.functional.mse_loss(m(x), y).backward()
    with pytest.raises(AssertionError, match="optimizer.zero_grad\\(\\) was called after loss.backward"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="Gradients were computed more than backward_passes_per_step"):
        torch.nn.functional.mse_loss(m(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert any("skip_synchronize" in str(w.message) for w in caught)
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2

    # argument errors, as Horovod raises them
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="must be unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=[("a", p) for p in m.parameters()])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=list(m.named_parameters())[:1])
    hvd.shutdown()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_distributed_optimizer_equals_big_batch(nprocs):
    assert run_ranks(_optimizer_checks, nprocs, init="accord", timeout=100) == [True] * nprocs


def _sparse_and_broadcast(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    # sparse gradients: allgather path and sparse_as_dense, against a dense reference
    def run(sparse, **kw):
        torch.manual_seed(3)
        emb = torch.nn.Embedding(10, 4, sparse=sparse).double()
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        if "dist" in kw:
            opt = hvd.DistributedOptimizer(opt, named_parameters=emb.named_parameters(), **kw["dist"])
            ids = [torch.tensor([rank, rank + 1, 7])]
        else:
            ids = [torch.tensor([r, r + 1, 7]) for r in range(size)]
        for _ in range(2):
            sum(emb(i).pow(2).sum() for i in ids).div(len(ids)).backward()
            opt.step()
            opt.zero_grad()
        return emb.weight.detach().numpy()

    want = run(False)
    np.testing.assert_allclose(run(True, dist={}), want, atol=1e-12)
    np.testing.assert_allclose(run(True, dist={"sparse_as_dense": True}), want, atol=1e-12)

    # broadcast_parameters: a dict (state_dict) or a list of (name, tensor); generators rejected
    model = _model(seed=10 + rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    _same(_params(model), _params(_model(seed=11)), 0)
    model = _model(seed=20 + rank)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    _same(_params(model), _params(_model(seed=20)), 0)
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters(model.named_parameters(), root_rank=0)

    # broadcast_optimizer_state: root has Adam state after a step; others are fresh
    model = _model(seed=30)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), weight_decay=0.1)
    if rank == 0:
        x, y = _batch(0, 0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    before = _params(model)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    if rank != 0:
        _same(_params(model), before, 0)  # initializing the state did not move the parameters
    assert opt.param_groups[0]["lr"] == 0.01
    state = [(k, v.numpy().tolist()) for pid, s in sorted(opt.state_dict()["state"].items())
             for k, v in sorted(s.items())]
    gathered = hvd.allgather_object(state)
    assert all(g == gathered[0] for g in gathered)
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)

    # objects: root's value everywhere (others may pass None), and allgather in rank order
    got = hvd.broadcast_object({"epoch": 3, "r": rank} if rank == 1 else None, root_rank=1)
    assert got == {"epoch": 3, "r": 1}
    assert hvd.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]
    assert hvd.broadcast_object([rank] * 3, root_rank=0, name="named") == [0, 0, 0]
    hvd.shutdown()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_sparse_gradients_and_broadcast_helpers(nprocs):
    assert run_ranks(_sparse_and_broadcast, nprocs, init="accord", timeout=100) == [True] * nprocs


def _adasum_optimizer(rank, size):
    import torch

    import accord.torch as hvd
    from accord.torch.adasum import combine_tree

    hvd.init()

    def model():
        torch.manual_seed(5)
        return torch.nn.Linear(3, 2).double()

    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(), op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    x, y = _batch(0, rank)
    if size & (size - 1):
        with pytest.raises(NotImplementedError, match="power of 2"):
            torch.nn.functional.mse_loss(m(x[:, :3]), y[:, :2]).backward()
        hvd.shutdown()
        return True
    torch.nn.functional.mse_loss(m(x[:, :3]), y[:, :2]).backward()
    with pytest.raises(AssertionError, match="Skipping synchronization is not supported"):
        with opt.skip_synchronize():
            pass
    opt.step()
    # expected: start + Adasum over ranks of each rank's SGD update (-lr * grad), per tensor
    start = model()
    deltas = []
    for r in range(size):
        ref = model()
        bx, by = _batch(0, r)
        torch.nn.functional.mse_loss(ref(bx[:, :3]), by[:, :2]).backward()
        deltas.append({k: -0.1 * p.grad.detach() for k, p in ref.named_parameters()})
    initial = dict(start.named_parameters())
    for name, p in m.named_parameters():
        combined = combine_tree([d[name].reshape(-1) for d in deltas]).reshape(p.shape)
        want = initial[name].detach() + combined
        np.testing.assert_allclose(p.detach().numpy(), want.numpy(), atol=1e-12)
    opt.zero_grad()
    hvd.shutdown()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_adasum_optimizer_combines_updates(nprocs):
    assert run_ranks(_adasum_optimizer, nprocs, init="accord", timeout=60) == [True] * nprocs


def _scheduler_on_the_wrapped_optimizer(rank, size):
    """An LR scheduler built on the optimizer a DistributedOptimizer wraps keeps driving the
    rates the wrapper uses after broadcast_optimizer_state (and load_state_dict) on every rank,
    as in Horovod: the loaded options go into the group dicts both optimizers share."""
    import torch

    import accord.torch as hvd

    hvd.init()
    model = _model(seed=rank)  # different starting states: the broadcast must load root's
    inner = torch.optim.SGD(model.parameters(), lr=1.0 + rank, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.1)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    x, y = _batch(0, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 1.0  # root's
    scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1), f"rank {rank}: {opt.param_groups[0]['lr']}"
    opt.load_state_dict(opt.state_dict())
    scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01), f"rank {rank}: {opt.param_groups[0]['lr']}"
    hvd.shutdown()
    return True


def test_a_scheduler_on_the_wrapped_optimizer_survives_loading_state():
    assert run_ranks(_scheduler_on_the_wrapped_optimizer, 2, init="accord", timeout=60) == [True, True]
