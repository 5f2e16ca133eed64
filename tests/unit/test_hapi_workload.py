"""fit(work_load_list=...) in one process: the step plan of weighted shares (rows per rank and
step, the global batch, each rank's share), the errors, and the rank-0 epoch line that reports
global values once ranks with uneven steps have all finished."""
import io
import random

import numpy as np
import pytest
import torch
from torch import nn

from accord.hapi import Model
from accord.hapi.callbacks import ProgBarLogger
from accord.hapi.workload import StepPlan, batch_rows, weighted_plan

pytestmark = pytest.mark.timeout(60)


def _shares(n, weights):
    """MXNet's split rule, written out: round(w * n / sum) rows each, the last takes the rest."""
    counts = [round(w * n / sum(weights)) for w in weights]
    counts[-1] += n - sum(counts)
    return counts


def _chunks(count, batch, drop_last):
    sizes = [batch] * (count // batch)
    if count % batch and not drop_last:
        sizes.append(count % batch)
    return sizes


def test_plan_of_42_samples_weighted_1_3_in_batches_of_4():
    plan = weighted_plan(42, [1, 3], 4)
    assert _shares(42, [1, 3]) == [10, 32]
    assert plan.rows == ((4, 4, 2), (4,) * 8)
    assert plan.steps == (3, 8) and plan.min_steps == 3 and plan.max_steps == 8
    assert plan.uneven and plan.root == 1
    assert [plan.global_rows(k) for k in range(8)] == [8, 8, 6, 4, 4, 4, 4, 4]
    assert plan.share(0, 2) == pytest.approx(2 / 6) and plan.share(1, 2) == pytest.approx(4 / 6)
    assert plan.share(1, 7) == 1.0
    assert weighted_plan(42, [3, 1], 4).root == 0


def test_drop_last_can_leave_a_rank_without_steps():
    plan = weighted_plan(42, [1, 3], 16, drop_last=True)
    assert plan.rows == ((), (16, 16)) and plan.min_steps == 0 and plan.root == 1
    assert batch_rows(10, 4, False) == (4, 4, 2) and batch_rows(10, 4, True) == (4, 4)
    assert batch_rows(0, 4, False) == ()


def test_even_plan_is_not_uneven():
    plan = weighted_plan(10, [1, 1], 4)
    assert plan.rows == ((4, 1), (4, 1)) and not plan.uneven and plan.root == 0
    assert StepPlan(()).max_steps == 0


@pytest.mark.parametrize("trial", range(30))
def test_plan_covers_the_data_and_shares_sum_to_one(trial):
    rng = random.Random(trial)
    ranks = rng.randint(1, 5)
    weights = [rng.choice([1, 2, 3, 0.5, 1.5]) for _ in range(ranks)]
    n, batch, drop_last = rng.randint(ranks * 2, 200), rng.randint(1, 17), rng.random() < 0.3
    plan = weighted_plan(n, weights, batch, drop_last)
    counts = _shares(n, weights)
    assert [list(r) for r in plan.rows] == [_chunks(c, batch, drop_last) for c in counts]
    if not drop_last:
        assert sum(plan.global_rows(k) for k in range(plan.max_steps)) == n
    for k in range(plan.max_steps):
        active = [r for r in range(ranks) if k < plan.steps[r]]
        assert sum(plan.share(r, k) for r in active) == pytest.approx(1.0, abs=1e-12)
    assert plan.steps[plan.root] == max(len(_chunks(c, batch, drop_last)) for c in counts)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _prepared():
    model = Model(_net())
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss())
    return model


def _data(n=42):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, size=n)


def test_one_rank_with_a_single_weight_trains_exactly_as_without():
    x, y = _data()
    a, b = _prepared(), _prepared()
    ha = a.fit((x, y), batch_size=8, epochs=2, verbose=0)
    hb = b.fit((x, y), batch_size=8, epochs=2, verbose=0, work_load_list=[1])
    for k, v in a.network.state_dict().items():
        assert torch.equal(v, b.network.state_dict()[k]), k
    assert ha["loss"] == hb["loss"] and hb["samples"] == [42, 42]


def test_work_load_list_errors_say_what_and_hint():
    x, y = _data()
    with pytest.raises(ValueError, match=r"(?s)2 weights.*HINT:"):
        _prepared().fit((x, y), batch_size=4, verbose=0, work_load_list=[1, 3])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x)), batch_size=4)
    with pytest.raises(ValueError, match=r"(?s)cannot weight a DataLoader.*HINT:"):
        _prepared().fit(loader, batch_size=4, verbose=0, work_load_list=[1])
    with pytest.raises(ValueError, match="HINT:"):
        _prepared().fit((x, y), batch_size=4, verbose=0, work_load_list=[0])


class _Rank0:
    rank = 0


def test_epoch_end_prints_the_global_values_that_came_after_the_loop():
    out = io.StringIO()
    logger = ProgBarLogger(log_freq=2, verbose=2, stream=out)
    logger.set_model(_Rank0())
    logger.set_params({"epochs": 1, "steps": 8, "metrics": ["loss"]})
    logger.on_epoch_begin(0)
    for step in range(3):  # rank 0 had 3 of the epoch's 8 steps; values only at common steps
        logger.on_train_batch_end(step, {"step": step + 1, **({"loss": 0.5} if step == 1 else {})})
    logger.on_epoch_end(0, {"step": 8, "loss": 0.25, "samples": 42, "epoch_time": 1.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "Epoch 1/1"
    assert lines[1].startswith("step 2/8 - loss: 0.5000 - ")
    assert lines[2].startswith("step 8/8 - loss: 0.2500 - ") and lines[2].endswith("/step")
    assert len(lines) == 3
    # equal shares: the last step already printed the epoch's values; nothing more
    out.truncate(0), out.seek(0)
    logger.on_epoch_begin(0)
    logger.on_train_batch_end(7, {"step": 8, "loss": 0.25})
    logger.on_epoch_end(0, {"step": 8, "loss": 0.25, "samples": 42})
    assert len(out.getvalue().splitlines()) == 2
