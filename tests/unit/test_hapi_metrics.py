"""Accuracy and Mean against numpy, and the exact cross-rank combination of their states."""
import numpy as np
import pytest
import torch

from accord.hapi.metrics import Accuracy, Mean, Meters, Metric

pytestmark = pytest.mark.timeout(30)


def _topk_correct(logits: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    best = np.argsort(-logits, axis=1)[:, :k]
    return (best == labels[:, None]).any(axis=1)


def _feed(metric: Metric, logits: np.ndarray, labels: np.ndarray) -> None:
    metric.update(*(lambda a: a if isinstance(a, tuple) else (a,))(
        metric.compute(torch.from_numpy(logits), torch.from_numpy(labels))))


def test_accuracy_topk_matches_numpy_over_several_batches():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(53, 5))
    labels = rng.integers(0, 5, size=53)
    m = Accuracy(topk=(1, 2))
    for lo in range(0, 53, 10):  # uneven last batch
        _feed(m, logits[lo:lo + 10], labels[lo:lo + 10])
    top1, top2 = m.accumulate()
    assert top1 == pytest.approx(_topk_correct(logits, labels, 1).mean(), abs=1e-12)
    assert top2 == pytest.approx(_topk_correct(logits, labels, 2).mean(), abs=1e-12)
    assert m.name() == ["acc_top1", "acc_top2"]
    m.reset()
    assert m.accumulate() == [0.0, 0.0]


def test_accuracy_single_k_is_named_acc_and_accepts_column_labels():
    m = Accuracy()
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    _feed(m, logits, np.array([[1], [1], [1]]))
    assert m.name() == ["acc"]
    assert m.accumulate() == pytest.approx(2 / 3)


def test_summed_states_give_the_global_accuracy_not_the_mean_of_rank_accuracies():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(11, 4))
    labels = rng.integers(0, 4, size=11)
    labels[:3] = logits[:3].argmax(1)  # rank 0's 3 samples all correct, so its accuracy is 1.0
    shards = [(0, 3), (3, 11)]  # uneven: 3 and 8 samples
    metrics = []
    for lo, hi in shards:
        m = Accuracy(topk=(1, 3))
        _feed(m, logits[lo:hi], labels[lo:hi])
        metrics.append(m)
    total = metrics[0].state() + metrics[1].state()  # what the allreduce of states computes
    top1, top3 = metrics[0].result(total)
    assert top1 == pytest.approx(_topk_correct(logits, labels, 1).mean(), abs=1e-12)
    assert top3 == pytest.approx(_topk_correct(logits, labels, 3).mean(), abs=1e-12)
    naive = np.mean([m.accumulate()[0] for m in metrics])
    assert abs(naive - top1) > 0.05  # the average of averages would be visibly wrong here


def test_mean_is_sample_weighted():
    m = Mean("loss")
    m.update(torch.tensor(2.0), 3)
    m.update(torch.tensor(5.0), 1)
    assert m.accumulate() == pytest.approx((2 * 3 + 5) / 4)
    assert m.state().tolist() == [11.0, 4.0]
    assert m.name() == ["loss"]


@pytest.mark.parametrize("kwargs, logits, labels, text", [
    ({"topk": (0,)}, None, None, "topk"),
    ({"topk": (3,)}, np.zeros((2, 2)), np.zeros(2, dtype=np.int64), "at least 3 classes"),
    ({}, np.zeros((2, 3)), np.zeros(5, dtype=np.int64), "one class index per row"),
    ({}, np.zeros(3), np.zeros(3, dtype=np.int64), "(N, classes)"),
])
def test_accuracy_errors_say_what_and_hint(kwargs, logits, labels, text):
    with pytest.raises(ValueError) as info:
        m = Accuracy(**kwargs)
        m.compute(torch.from_numpy(logits), torch.from_numpy(labels))
    assert text in str(info.value) and "HINT:" in str(info.value)


def test_meters_reduce_loss_metrics_samples_and_stop_in_one_vector():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(11, 4))
    labels = rng.integers(0, 4, size=11)
    losses = rng.uniform(size=11)
    ranks = []
    for lo, hi in [(0, 3), (3, 11)]:  # two "ranks" with uneven shards
        meters = Meters()
        meters.configure(True, [Accuracy(topk=(1, 2))])
        meters.track(torch.from_numpy(logits[lo:hi]), torch.tensor(losses[lo:hi].mean()),
                     torch.from_numpy(labels[lo:hi]), hi - lo)
        ranks.append(meters)
    assert ranks[0].names() == ["loss", "acc_top1", "acc_top2"]
    # the "allreduce": each rank's vector plus the other's (rank 1 asks to stop)
    sent = []
    other, _ = ranks[1].logs(True, lambda v: sent.append(v) or v)
    logs, stop = ranks[0].logs(False, lambda v: v + sent[0])
    assert stop and logs["samples"] == 11
    assert logs["loss"] == pytest.approx(losses.mean(), abs=1e-12)
    assert logs["acc_top1"] == pytest.approx(_topk_correct(logits, labels, 1).mean(), abs=1e-12)
    assert logs["acc_top2"] == pytest.approx(_topk_correct(logits, labels, 2).mean(), abs=1e-12)
    local, local_stop = ranks[0].logs(False, None)  # no reduce: this rank's values only
    assert local["samples"] == 3 and not local_stop
    assert other["samples"] == 8
