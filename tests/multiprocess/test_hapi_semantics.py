"""Model.fit's semantics on 2 real ranks, against a plain-torch reference and Paddle/Keras habits.

- a dataset that does not divide: shards padded as torch's DistributedSampler, drop_last drops
  each rank's short batch, weights/loss/samples equal one process on the same global batches;
- a fit that would run no step (empty data, drop_last with a batch above the share), or a count
  fit cannot use, is a ValueError with a HINT on every rank (not a fit that trains nothing and logs
  zeros, nor a ZeroDivisionError);
- ``work_load_list`` as a numpy array; AMP O1 (bfloat16 on CPU) keeps the ranks identical;
- ``fit(elastic=True)``: callbacks see the real epochs (checkpoint names, eval_freq), drop_last
  applies, and EarlyStopping stops training (the epochs are one fit, not a 1-epoch fit each);
- ``evaluate`` where a rank's share is empty gives the global means; over no sample at all it is
  a ValueError on every rank (not a loss of 0.0 over 0 samples).

One set of ranks runs every scenario (``_job``); each test checks one part of what it returned.
"""
import numpy as np
import pytest
import torch
from helpers.ranks import run_ranks
from helpers.small_nets import _data, _net, _weights, numpy_metrics
from torch import nn

pytestmark = pytest.mark.timeout(120)

N, BATCH, SIZE = 43, 5, 2  # 43 samples: 22 per rank (one padded), batches 5+5+5+5(+2 dropped)


def _outcome(call):
    """("ok", value) or ("raised", "Type: message"): one scenario's failure spoils no other."""
    try:
        return "ok", call()
    except Exception as exc:  # reported to the test that checks this scenario
        return "raised", f"{type(exc).__name__}: {exc}"


def _model(rank, lr=0.1, momentum=0.9, **prepare):
    import accord
    from accord.hapi import Accuracy

    model = accord.Model(_net(seed=rank))  # rank 0's weights are broadcast
    model.prepare(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                  nn.CrossEntropyLoss(), Accuracy(), **prepare)
    return model


def _padded(rank):
    x, y = _data(N, 0)
    model = _model(rank)
    history = model.fit((x, y), batch_size=BATCH, epochs=2, drop_last=True, verbose=0)
    return history, _weights(model.network)


def _weighted(rank):
    x, y = _data(N, 0)
    weights = {}
    for name, work_load_list in (("list", [1, 3]), ("numpy", np.array([1, 3]))):
        model = _model(rank)
        model.fit((x, y), batch_size=BATCH, epochs=1, verbose=0, work_load_list=work_load_list)
        weights[name] = _weights(model.network)
    return weights


def _amp(rank):
    import accord

    x, y = _data(N, 0)
    net = _net(seed=rank).float()  # autocast leaves float64 alone: a float32 network
    dtypes = []
    net[0].register_forward_hook(lambda mod, inp, output: dtypes.append(output.dtype))
    model = accord.Model(net)
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), amp_level="O1")
    model.fit((x.astype(np.float32), y), batch_size=BATCH, epochs=1, verbose=0)
    return set(dtypes), str(net[0].weight.dtype), _weights(net)


def _elastic(rank, tmp):
    import os

    from accord.hapi import Callback, EarlyStopping

    seen = []

    class Record(Callback):
        def on_train_begin(self, logs=None):
            seen.append("train_begin")

        def on_epoch_begin(self, epoch, logs=None):
            seen.append((epoch, self.params["epochs"]))

        def on_eval_end(self, logs=None):
            seen.append("eval")

    x, y = _data(N, 0)
    save_dir = os.path.join(tmp, "elastic")
    history = _model(rank).fit((x, y), (x[:6], y[:6]), batch_size=BATCH, epochs=3, eval_freq=2,
                               drop_last=True, elastic=True, verbose=0, save_dir=save_dir,
                               callbacks=[Record()])
    frozen = _model(rank, lr=0.0)  # the evaluation loss never improves: stop after 2 epochs
    stop = EarlyStopping(monitor="loss", patience=0, save_best_model=False)
    stopped = frozen.fit((x, y), (x, y), batch_size=BATCH, epochs=6, elastic=True, verbose=0,
                         callbacks=[stop])
    return {"seen": seen, "samples": history["samples"], "stopped": len(stopped["loss"]),
            "files": sorted(os.listdir(save_dir)) if rank == 0 else None}


def _per_rank_loader(x, y):
    """One rank's own DataLoader (evaluate uses it as is: the rank's share)."""
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=2)


def _evaluations(rank):
    x, y = _data(N, 0)
    model = _model(rank)  # rank 0's initial weights (_net(seed=0)) on every rank
    # 1 sample over 2 ranks: rank 0's contiguous share is empty, rank 1 holds the sample.
    one = model.evaluate((x[:1], y[:1]), batch_size=4, verbose=0)
    # Per-rank DataLoaders: nothing on rank 0, 3 samples on rank 1.
    own = model.evaluate(_per_rank_loader(x[:3 * rank], y[:3 * rank]), verbose=0)
    return {"one": one, "own": own}


def _job(rank, size, tmp):
    import accord.torch as hvd

    x, y = _data(N, 0)
    refused = {
        "eval_empty": lambda: _model(rank).evaluate((x[:0], y[:0]), verbose=0),
        "eval_empty_loaders": lambda: _model(rank).evaluate(_per_rank_loader(x[:0], y[:0]), verbose=0),
        "empty": lambda: _model(rank).fit((x[:0], y[:0]), batch_size=4, verbose=0),
        "no_step": lambda: _model(rank).fit((x, y), batch_size=30, drop_last=True, verbose=0),
        "log_freq": lambda: _model(rank).fit((x, y), batch_size=4, log_freq=0, verbose=0),
        "epochs": lambda: _model(rank).fit((x, y), batch_size=4, epochs=1.5, verbose=0),
    }
    out = {name: _outcome(call) for name, call in refused.items()}
    out["padded"] = _outcome(lambda: _padded(rank))
    out["weighted"] = _outcome(lambda: _weighted(rank))
    out["amp"] = _outcome(lambda: _amp(rank))
    out["evaluations"] = _outcome(lambda: _evaluations(rank))
    out["elastic"] = _outcome(lambda: _elastic(rank, tmp))
    hvd.shutdown()
    return out


def _ok(result):
    status, value = result
    assert status == "ok", value
    return value


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(_job, SIZE, str(tmp_path_factory.mktemp("semantics")), init="accord", timeout=100)


def _reference(epochs=2, lr=0.1, momentum=0.9):
    """One process: each step averages the ranks' mean losses over their padded shards' batches."""
    x, y = (torch.from_numpy(a) for a in _data(N, 0))
    net = _net(seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    losses, samples = [], []
    for epoch in range(epochs):
        gen = torch.Generator()
        gen.manual_seed(epoch)
        order = torch.randperm(N, generator=gen).tolist()
        per_rank = -(-N // SIZE)
        padded = [order[i % N] for i in range(per_rank * SIZE)]
        shards = [padded[r::SIZE] for r in range(SIZE)]
        total = count = 0
        for lo in range(0, per_rank - BATCH + 1, BATCH):  # drop_last: full batches only
            opt.zero_grad()
            parts = [nn.functional.cross_entropy(net(x[s[lo:lo + BATCH]]), y[s[lo:lo + BATCH]]) for s in shards]
            (sum(parts) / SIZE).backward()
            opt.step()
            total += sum(p.item() for p in parts) * BATCH
            count += BATCH * SIZE
        losses.append(total / count)
        samples.append(count)
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}, losses, samples


def test_padded_shards_and_drop_last_train_like_one_process(results):
    want, losses, samples = _reference()
    for history, weights in (_ok(r["padded"]) for r in results):
        for k in want:
            np.testing.assert_allclose(weights[k], want[k], rtol=1e-10, atol=1e-12, err_msg=k)
        np.testing.assert_allclose(history["loss"], losses, rtol=1e-10)
        assert history["samples"] == samples == [40, 40]


@pytest.mark.parametrize("case, words", [
    ("empty", "0 training samples"), ("no_step", "batch_size=30, drop_last=True give 0 batches"),
    ("log_freq", "log_freq must be an int >= 1"), ("epochs", "epochs must be an int >= 0")])
def test_a_fit_that_cannot_train_fails_on_every_rank(results, case, words):
    for r in results:
        status, message = r[case]
        assert status == "raised" and message.startswith("ValueError: "), message
        assert words in message and "\nHINT: " in message, message


@pytest.mark.parametrize("case", ["eval_empty", "eval_empty_loaders"])
def test_evaluate_over_no_sample_fails_on_every_rank(results, case):
    for r in results:
        status, message = r[case]
        assert status == "raised" and message.startswith("ValueError: eval_data gives no sample "), message
        assert "on any of the 2 rank(s) (its length is 0)" in message and "\nHINT: " in message


def test_evaluate_with_an_empty_share_gives_the_global_means(results):
    x, y = _data(N, 0)
    weights = _weights(_net(seed=0))
    for name, n in (("one", 1), ("own", 3)):
        _, want = numpy_metrics(weights, x[:n], y[:n])
        for r in results:
            got = _ok(r["evaluations"])[name]
            assert got["samples"] == n, (name, got)
            np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-12, err_msg=name)
            assert got["acc"] == pytest.approx(want["acc_top1"]), name


def test_numpy_work_load_list_trains_like_a_list(results):
    for weights in (_ok(r["weighted"]) for r in results):
        for k, v in weights["list"].items():
            np.testing.assert_array_equal(weights["numpy"][k], v)


def test_amp_o1_bfloat16_keeps_ranks_identical(results):
    (dtypes0, weight0, w0), (dtypes1, _, w1) = (_ok(r["amp"]) for r in results)
    assert dtypes0 == dtypes1 == {torch.bfloat16} and weight0 == "torch.float32"
    for k in w0:
        np.testing.assert_array_equal(w0[k], w1[k])


def test_elastic_fit_runs_one_loop_over_the_real_epochs(results):
    runs = [_ok(r["elastic"]) for r in results]
    for run in runs:
        assert run["seen"] == ["train_begin", (0, 3), (1, 3), "eval", (2, 3), "eval"]
        assert run["samples"] == [40, 40, 40]  # drop_last: 4 batches of 5 per rank
        assert run["stopped"] == 2
    assert runs[0]["files"] == [
        "0.opt.pt", "0.pt", "1.opt.pt", "1.pt", "2.opt.pt", "2.pt", "final.opt.pt", "final.pt"]


def test_amp_dtype_must_be_half_precision():
    import accord

    model = accord.Model(_net(seed=0).float())
    with pytest.raises(ValueError, match="float8.*\nHINT: "):
        model.prepare(torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                      amp_level={"level": "O1", "dtype": "float8"})
