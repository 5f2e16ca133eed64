"""An evaluation over no sample: its mean loss and metrics are undefined, so ``evaluate`` and
``fit(eval_data=...)`` refuse it with a ValueError and a HINT (Paddle's ``Model.evaluate`` fails
too, with a KeyError), instead of reporting loss 0.0 over 0 samples."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accord.hapi import Accuracy, Callback, Model

pytestmark = pytest.mark.timeout(60)


def _data(n=10):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, size=n)


def _model(loss=True, metrics=True):
    torch.manual_seed(0)
    model = Model(nn.Sequential(nn.Linear(5, 3)).double())
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1),
                  nn.CrossEntropyLoss() if loss else None, Accuracy() if metrics else None)
    return model


def _empty_loader():
    x, y = _data(0)
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=4)


@pytest.mark.parametrize("loss, metrics", [(True, True), (True, False), (False, True)])
def test_evaluate_on_empty_arrays_is_a_clear_error(loss, metrics):
    x, y = _data(0)
    with pytest.raises(ValueError, match=r"eval_data gives no sample .*its length is 0\).*\nHINT: "):
        _model(loss, metrics).evaluate((x, y), verbose=0)


def test_evaluate_on_an_empty_dataloader_is_a_clear_error():
    with pytest.raises(ValueError, match=r"eval_data gives no sample .*its length is 0\)"):
        _model().evaluate(_empty_loader(), verbose=0)


def test_evaluate_on_samples_without_labels_says_so():
    x, _ = _data()
    with pytest.raises(ValueError, match="its length is 10, and none of its batches has a label"):
        _model().evaluate(x, verbose=0)


def test_evaluate_with_nothing_to_report_returns_the_count_only():
    # Paddle returns {} here (no loss, no metric name to look up): no mean, nothing undefined.
    x, y = _data(0)
    assert _model(loss=False, metrics=False).evaluate((x, y), verbose=0) == {"samples": 0}


def test_evaluate_still_averages_a_small_set():
    x, y = _data(3)
    model = _model()
    logits = model.network(torch.from_numpy(x)).detach().numpy()
    z = logits - logits.max(axis=1, keepdims=True)
    want = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(3), y]))
    out = model.evaluate((x, y), batch_size=2, verbose=0)
    assert out["samples"] == 3
    np.testing.assert_allclose(out["loss"], want, rtol=1e-12)
    assert out["acc"] == pytest.approx(float(np.mean(logits.argmax(axis=1) == y)))


def test_fit_refuses_empty_eval_data_before_training():
    began = []

    class Begin(Callback):
        def on_train_begin(self, logs=None):
            began.append(True)

    model = _model()
    before = {k: v.clone() for k, v in model.network.state_dict().items()}
    empty = _data(0)
    with pytest.raises(ValueError, match=r"eval_data gives no sample .*\nHINT: "):
        model.fit(_data(), empty, batch_size=4, epochs=2, verbose=0, callbacks=[Begin()])
    assert not began
    for k, v in model.network.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_fit_with_an_empty_eval_dataloader_fails_at_its_first_evaluation():
    # A DataLoader may be one rank's share: only the count summed over ranks can tell.
    model = _model()
    with pytest.raises(ValueError, match=r"eval_data gives no sample"):
        model.fit(_data(), _empty_loader(), batch_size=4, epochs=2, verbose=0)
