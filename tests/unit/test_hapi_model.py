"""accord.Model in one process: training equals a plain torch loop, metrics equal numpy,
predictions come back in order, checkpoints round-trip, AMP/compile/callbacks/logging work."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import accord
from accord.hapi import Accuracy, Callback, EarlyStopping, LRScheduler, Model

pytestmark = pytest.mark.timeout(60)


def _net(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def _data(n=42, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, size=n)


def _order(n, epoch, shuffle, seed=0):
    # DistributedSampler's documented contract: torch's permutation for (seed + epoch).
    if not shuffle:
        return np.arange(n)
    gen = torch.Generator()
    gen.manual_seed(seed + epoch)
    return torch.randperm(n, generator=gen).numpy()


def _reference(x, y, batch, epochs, shuffle, lr=0.1, momentum=0.9):
    """Plain torch: SGD over consecutive batches of the epoch's order; returns weights, losses."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    epoch_losses = []
    for epoch in range(epochs):
        order = _order(len(x), epoch, shuffle)
        total = 0.0
        for lo in range(0, len(x), batch):
            idx = torch.from_numpy(order[lo:lo + batch])
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        epoch_losses.append(total / len(x))
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, epoch_losses


def _prepared(net=None, lr=0.1, momentum=0.9, metrics=None, **kw):
    model = Model(net if net is not None else _net())
    model.prepare(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                  nn.CrossEntropyLoss(), metrics if metrics is not None else Accuracy(topk=(1, 2)), **kw)
    return model


def _weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.network.state_dict().items()}


def _assert_same(a, b, tol=1e-12):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_equals_plain_torch_training(shuffle):
    x, y = _data()  # 42 samples, batch 8: the last batch of each epoch has 2
    model = _prepared()
    history = model.fit((x, y), batch_size=8, epochs=3, shuffle=shuffle, verbose=0)
    want, losses = _reference(x, y, 8, 3, shuffle)
    _assert_same(_weights(model), want)
    np.testing.assert_allclose(history["loss"], losses, rtol=1e-12)
    assert history["samples"] == [42, 42, 42] and model.world_size == 1 and model.rank == 0


def test_full_batch_gradient_descent():
    x, y = _data(n=20)
    model = _prepared(momentum=0.0)
    model.fit((x, y), batch_size=20, epochs=4, verbose=0)
    _assert_same(_weights(model), _reference(x, y, 20, 4, shuffle=True, momentum=0.0)[0])


def _numpy_metrics(net, x, y):
    with torch.no_grad():
        logits = net(torch.from_numpy(x)).numpy()
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    best = np.argsort(-logits, axis=1)
    return {"loss": -logp[np.arange(len(y)), y].mean(),
            "acc_top1": (best[:, 0] == y).mean(),
            "acc_top2": (best[:, :2] == y[:, None]).any(1).mean()}


def test_evaluate_matches_numpy():
    x, y = _data()
    model = _prepared()
    model.fit((x, y), batch_size=8, epochs=2, verbose=0)
    xe, ye = _data(n=13, seed=5)
    got = model.evaluate((xe, ye), batch_size=5, verbose=0)
    want = _numpy_metrics(model.network, xe, ye)
    assert got["samples"] == 13
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k


def test_predict_returns_outputs_in_dataset_order():
    x, _ = _data(n=11)
    model = Model(_net())
    out = model.predict(x, batch_size=4, verbose=0)
    with torch.no_grad():
        want = model.network(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12)
    chunks = model.predict(x, batch_size=4, stack_outputs=False, verbose=0)
    assert [c.shape[0] for c in chunks] == [4, 4, 3]

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(5, 2).double(), nn.Linear(5, 1).double()

        def forward(self, v):
            return self.a(v), self.b(v)

    heads = Model(TwoHeads()).predict((x, np.zeros(11)), batch_size=3, verbose=0)  # label ignored
    assert [h.shape for h in heads] == [(11, 2), (11, 1)]
    assert model.predict(x[:0], batch_size=4, verbose=0).shape == (0,)


def test_save_load_round_trip_and_resume(tmp_path):
    x, y = _data()
    model = _prepared()
    model.fit((x, y), batch_size=8, epochs=2, verbose=0)
    model.save(str(tmp_path / "ckpt"))
    params = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert set(params) == set(model.network.state_dict())
    assert "optimizer" in torch.load(tmp_path / "ckpt.opt.pt", weights_only=True)

    restored = _prepared(net=_net(seed=99))  # different initial weights, fresh optimizer
    restored.load(str(tmp_path / "ckpt.pt"))
    _assert_same(_weights(restored), _weights(model), tol=0)
    momentum = {k: v["momentum_buffer"] for k, v in model.optimizer.state_dict()["state"].items()}
    for k, v in restored.optimizer.state_dict()["state"].items():
        assert torch.equal(v["momentum_buffer"], momentum[k])
    # Continuing from the checkpoint is exactly continuing the original run.
    model.fit((x, y), batch_size=8, epochs=1, verbose=0)
    restored.fit((x, y), batch_size=8, epochs=1, verbose=0)
    _assert_same(_weights(restored), _weights(model), tol=0)

    with pytest.raises(FileNotFoundError, match="HINT:"):
        restored.load(str(tmp_path / "missing"))


def test_load_skip_mismatch(tmp_path):
    model = Model(_net())
    model.save(str(tmp_path / "w"), training=False)
    assert not (tmp_path / "w.opt.pt").exists()
    other = Model(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 4)).double())
    before = other.network[2].weight.detach().clone()
    other.load(str(tmp_path / "w"), skip_mismatch=True)
    assert torch.equal(other.network[0].weight, model.network[0].weight)
    assert torch.equal(other.network[2].weight, before)  # shape differs: kept


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])


def test_torch_dataset_trains_like_arrays():
    x, y = _data()
    a, b = _prepared(), _prepared()
    a.fit((x, y), batch_size=8, epochs=2, verbose=0)
    b.fit(_Dataset(x, y), batch_size=8, epochs=2, verbose=0)
    _assert_same(_weights(a), _weights(b), tol=0)


def test_amp_o1_runs_linear_layers_in_bfloat16_on_cpu():
    x, y = _data()
    net = _net(dtype=torch.float32)
    seen = []
    net[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    model = _prepared(net=net, amp_level="O1")
    history = model.fit((x.astype(np.float32), y), batch_size=8, epochs=1, verbose=0)
    assert seen and set(seen) == {torch.bfloat16}
    assert np.isfinite(history["loss"][0])
    assert model.network[0].weight.dtype == torch.float32  # master weights stay float32
    with pytest.raises(ValueError, match="HINT:"):
        _prepared(amp_level="O3")  # O2 exists: tests/unit/test_hapi_amp_o2.py


def test_compile_gives_the_same_training():
    x, y = _data()
    eager, compiled = _prepared(), _prepared(compile={"backend": "eager"})
    eager.fit((x, y), batch_size=8, epochs=1, verbose=0)
    compiled.fit((x, y), batch_size=8, epochs=1, verbose=0)
    _assert_same(_weights(compiled), _weights(eager))
    assert compiled._state.forward is not compiled.network  # the forward pass goes through torch.compile


def test_fit_logs_in_paddle_style(capsys):
    x, y = _data(n=24)
    model = _prepared(metrics=Accuracy())
    model.fit((x, y), (x[:10], y[:10]), batch_size=4, epochs=2, log_freq=3, verbose=2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Epoch 1/2"
    assert lines[1].startswith("step 3/6 - loss: ") and " - acc: " in lines[1] and lines[1].endswith("/step")
    assert lines[2].startswith("step 6/6 - loss: ")
    assert lines[3] == "Eval begin..."
    assert lines[-1] == "Eval samples: 10"
    model.fit((x, y), batch_size=4, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""


class _Recorder(Callback):
    def __init__(self, stop_after_epoch=None):
        super().__init__()
        self.calls = []
        self.stop_after_epoch = stop_after_epoch

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(f"epoch_end{epoch}:{sorted(logs)}")
        if epoch == self.stop_after_epoch:
            self.model.stop_training = True

    def on_eval_end(self, logs=None):
        self.calls.append(f"eval_end:{logs['samples']}")

    def on_train_end(self, logs=None):
        self.calls.append("train_end")


def test_callbacks_checkpoints_and_stopping(tmp_path):
    x, y = _data()
    rec = _Recorder(stop_after_epoch=1)
    model = _prepared(metrics=Accuracy())
    history = model.fit((x, y), (x[:9], y[:9]), batch_size=8, epochs=5, callbacks=[rec],
                        save_dir=str(tmp_path), verbose=0)
    assert len(history["loss"]) == 2 and history["eval_samples"] == [9, 9]
    keys = sorted(["acc", "epoch_time", "loss", "samples", "samples_per_sec", "step"])
    assert rec.calls == ["train_begin", f"epoch_end0:{keys}", "eval_end:9", f"epoch_end1:{keys}",
                         "eval_end:9", "train_end"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "0.opt.pt", "0.pt", "1.opt.pt", "1.pt", "final.opt.pt", "final.pt"]


def test_early_stopping_and_lr_scheduler(tmp_path):
    x, y = _data()
    model = _prepared(lr=0.0)  # nothing changes, so the eval loss never improves after the first
    sched = torch.optim.lr_scheduler.StepLR(model.optimizer, step_size=1, gamma=0.5)
    stop = EarlyStopping(monitor="loss", patience=1)
    history = model.fit((x, y), (x, y), batch_size=8, epochs=10, verbose=0, save_dir=str(tmp_path),
                        callbacks=[stop, LRScheduler(sched)])
    assert len(history["loss"]) == 3 and stop.stopped_epoch == 2
    assert (tmp_path / "best_model.pt").exists()

    model = _prepared(lr=0.8)
    sched = torch.optim.lr_scheduler.StepLR(model.optimizer, step_size=1, gamma=0.5)
    model.fit((x, y), batch_size=8, epochs=3, verbose=0, callbacks=[LRScheduler(sched)])
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_errors_say_what_and_hint():
    x, y = _data()
    with pytest.raises(RuntimeError, match="prepare"):
        Model(_net()).fit((x, y), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="HINT:"):
        _prepared().fit((x, y[:10]), batch_size=4, verbose=0)
    with pytest.raises(TypeError, match="HINT:"):
        _prepared().fit(42, batch_size=4, verbose=0)
    with pytest.raises(TypeError, match="HINT:"):
        _prepared(metrics=[lambda p, t: 0])
    with pytest.raises(ValueError, match="batch_size"):
        _prepared().fit((x, y), batch_size=0, verbose=0)
    with pytest.raises(ValueError, match="no label"):
        _prepared().fit(x, batch_size=4, verbose=0)


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(8):
            yield torch.zeros(5, dtype=torch.float64), torch.tensor(i % 3)


def test_iterable_data_without_a_length_is_refused_clearly():
    model = _prepared()
    for data in (torch.utils.data.DataLoader(_Stream(), batch_size=4), _Stream()):
        for call in (lambda d: model.fit(d, batch_size=4, verbose=0), lambda d: model.evaluate(d, verbose=0),
                     lambda d: model.predict(d, verbose=0)):
            with pytest.raises(ValueError, match="_Stream") as info:
                call(data)
            assert "HINT:" in str(info.value)


def test_accord_model_is_a_lazy_attribute():
    assert accord.Model is Model
    code = ("import sys, accord; assert 'torch' not in sys.modules; "
            "accord.Model; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_bare_cuda_device_means_this_ranks_gpu(monkeypatch):
    """Model(device="cuda") on local rank 3 of a host with 2 GPUs goes to cuda:1 (torch's
    set_device refuses a device without an index); explicit indices and the CPU stay as given."""
    from accord.hapi.world import World

    world = World(size=4, rank=3, local_rank=3)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert world.placement("cuda") == torch.device("cuda", 1)
    assert world.placement(torch.device("cuda")) == torch.device("cuda", 1)
    assert world.placement("cuda:0") == torch.device("cuda", 0)
    assert world.placement("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="(?s)sees no CUDA device.*HINT"):
        world.placement("cuda")
