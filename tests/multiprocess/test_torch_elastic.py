"""hvd.elastic on real ranks: restore the last commit after a failure, and carry on without a
rank that died (the job re-forms from the survivors through the launcher's store)."""
import os

import numpy as np
import pytest
from helpers.ranks import _start_accord_store, run_ranks

pytestmark = pytest.mark.timeout(120)


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 1).double()


def _batch(step, rank):
    import torch

    rng = np.random.default_rng([step, rank])
    return torch.from_numpy(rng.normal(size=(3, 4))), torch.from_numpy(rng.normal(size=(3, 1)))


def _elastic_training(rank, size, steps, fail):
    """Train ``steps`` steps under hvd.elastic.run; ``fail(state, rank)`` may raise or die."""
    import torch

    import accord.torch as hvd

    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
    resets = []  # outside the state: sync() overwrites uncommitted attributes with rank 0's
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    # after a reset the new engine holds nothing from before it (the engine's own count)
    from accord.engine import session

    inflight = []
    state.register_reset_callbacks([lambda: inflight.append(session.engine().inflight_names())])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            fail(state, rank, resets)
            x, y = _batch(state.step, hvd.rank())
            torch.nn.functional.mse_loss(state.model(x), y).backward()
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.sizes.append(hvd.size())
            state.step += 1
            state.commit()
        return state.step

    done = train(state)
    out = {"done": done, "resets": resets, "sizes": state.sizes, "size": hvd.size(),
           "weights": state.model.weight.detach().numpy().tolist(),
           "inflight": inflight + [session.engine().inflight_names()]}
    hvd.shutdown()
    return out


def _transient(state, rank, resets):
    from accord.errors import CollectiveError

    if state.step == 2 and not resets:
        state.sizes.append("uncommitted")  # must vanish: restore goes back to the last commit
        raise CollectiveError("injected failure on every rank")


def _reference(steps, sizes):
    """Single-process training with each step's batch being the concatenation over its ranks."""
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        n = sizes[step]
        losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in (_batch(step, r) for r in range(n))]
        (sum(losses) / n).backward()
        opt.step()
        opt.zero_grad()
    return model.weight.detach().numpy()


@pytest.fixture
def quiet_inductor(monkeypatch, tmp_path):
    """torch's first optimizer in this process sets TORCHINDUCTOR_CACHE_DIR; keep it scoped."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))


def test_transient_failure_restores_last_commit(quiet_inductor):
    results = run_ranks(_elastic_training, 2, 5, _transient, init="accord", timeout=90)
    for out in results:
        assert out["done"] == 5 and out["resets"] == [2] and out["size"] == 2
        assert out["inflight"] == [[], []]  # at the reset and at the end
        assert out["sizes"] == [2] * 5
        np.testing.assert_allclose(out["weights"], _reference(5, [2] * 5), atol=1e-12)


def _dies_at_step_2(state, rank, resets):
    if rank == 2 and state.step == 2:
        os._exit(17)  # a lost rank: no goodbye, no shutdown


def _elastic_with_death(rank, size):
    import torch.distributed as dist

    # The death harness gives every rank a torch process group; accord builds its own.
    dist.destroy_process_group()
    return _elastic_training(rank, size, 5, _dies_at_step_2)


def test_lost_rank_job_reforms_from_survivors(quiet_inductor):
    from helpers.dying_ranks import run_ranks_with_deaths

    server, env = _start_accord_store()
    env.update({"ACCORD_COLLECTIVE_TIMEOUT": "10", "ACCORD_ELASTIC_TIMEOUT": "30"})
    try:
        results = run_ranks_with_deaths(_elastic_with_death, 3, {2}, env=env, timeout=90)
    finally:
        server.close()
    sizes = [3, 3, 2, 2, 2]
    for out in results.values():
        assert out["done"] == 5 and out["resets"] == [2] and out["size"] == 2
        assert out["inflight"] == [[], []]  # at the reset and at the end
        assert out["sizes"] == sizes
        np.testing.assert_allclose(out["weights"], _reference(5, sizes), atol=1e-12)
