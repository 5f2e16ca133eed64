"""accord.Model on 2 real ranks: the same weights as single-process training, metrics summed
exactly over uneven shards, predictions gathered in order, rank-0-only logs and checkpoints.

Starting ranks costs seconds here, so one set of ranks runs every scenario (``_job``) and each
test below checks one part of what it returned against values computed in this process.
"""
import numpy as np
import pytest
import torch
from helpers.ranks import run_ranks
from helpers.small_nets import _data, _net, _weights, numpy_metrics
from torch import nn

pytestmark = pytest.mark.timeout(120)

N_TRAIN, N_EVAL = 42, 7  # 42 = 2 ranks x 21; 7 evaluation samples split 3 + 4




def _momentum(opt):
    return {k: v["momentum_buffer"].numpy().copy() for k, v in opt.state_dict()["state"].items()}


def _refuse_save(*args, **kwargs):
    raise AssertionError("only rank 0 may write checkpoints")


def _refuse_load(*args, **kwargs):
    raise AssertionError("only rank 0 may read checkpoints")


class _StopOn:
    """A callback (duck-typed: imported lazily in the ranks) that stops training on one rank."""

    def __new__(cls, rank, epoch=None, step=None):
        from accord.hapi import Callback

        class Stop(Callback):
            def on_epoch_end(self, e, logs=None):
                if self.model.rank == rank and e == epoch:
                    self.model.stop_training = True

            def on_train_batch_end(self, s, logs=None):
                if self.model.rank == rank and s == step:
                    self.model.stop_training = True

        return Stop()


def _job(rank, size, tmp):
    import contextlib
    import io
    import os

    import accord
    import accord.torch as hvd
    from accord.hapi import Accuracy

    x, y = _data(N_TRAIN, 0)
    xe, ye = _data(N_EVAL, 1)
    out = {}
    if rank != 0:
        torch.save = _refuse_save  # this process only: rank 1 must never write a checkpoint

    # Nobody called hvd.init(): Model sees accord's launcher contract and joins the job itself.
    # Initial weights differ per rank; rank 0's must be broadcast.
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        model = accord.Model(_net(seed=rank))
        model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      nn.CrossEntropyLoss(), Accuracy(topk=(1, 2)))
        out["history"] = model.fit((x, y), (xe, ye), batch_size=4, epochs=3, log_freq=2, verbose=2,
                                   save_dir=os.path.join(tmp, "run"))
    out["log"] = log.getvalue()
    out["world"] = (model.world_size, model.rank, model.world.initialised_here)
    out["wrapped"] = hasattr(model.optimizer, "synchronize")
    out["weights"] = _weights(model.network)

    # Full-batch gradient descent: 21 samples per rank = the whole set per step.
    full = accord.Model(_net(seed=10 + rank))
    full.prepare(torch.optim.SGD(full.parameters(), lr=0.5), nn.CrossEntropyLoss())
    full.fit((x, y), batch_size=N_TRAIN // size, epochs=4, verbose=0)
    out["full_batch"] = _weights(full.network)
    out["second_model_initialised_here"] = full.world.initialised_here

    # Uneven shards (3 and 4 samples): metrics must be the global ones.
    out["evaluate"] = model.evaluate((xe, ye), batch_size=2, verbose=0)
    out["predict"] = model.predict(xe, batch_size=2, verbose=0)
    out["predict_one"] = model.predict(xe[:1], batch_size=2, verbose=0)  # rank 0's shard is empty

    # Checkpoint: rank 0 writes (save() is not collective); load() on every rank: rank 0 reads
    # and broadcasts, so rank 1 never opens the files.
    path = os.path.join(tmp, "ckpt")
    model.save(path)
    restored = accord.Model(_net(seed=50 + rank))
    restored.prepare(torch.optim.SGD(restored.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss())
    real_load = torch.load
    if rank != 0:
        torch.load = _refuse_load
    try:
        restored.load(path)
        out["files_after_load"] = sorted(f for f in os.listdir(tmp) if f.startswith("ckpt"))
        try:
            restored.load(os.path.join(tmp, "missing"))
        except Exception as exc:  # every rank must fail, none may wait forever
            out["missing"] = (type(exc).__name__, str(exc))
    finally:
        torch.load = real_load
    out["restored"] = _weights(restored.network)
    out["restored_momentum"] = _momentum(restored.optimizer)
    out["momentum"] = _momentum(model.optimizer)

    # A callback that asks to stop on one rank only stops every rank at the same step.
    stopper = accord.Model(_net(seed=30))
    stopper.prepare(torch.optim.SGD(stopper.parameters(), lr=0.1), nn.CrossEntropyLoss())
    out["stop_epoch"] = stopper.fit((x, y), batch_size=4, epochs=3, verbose=0,
                                    callbacks=[_StopOn(rank=0, epoch=0)])["samples"]
    out["stop_step"] = stopper.fit((x, y), batch_size=4, epochs=3, verbose=0, log_freq=2,
                                   callbacks=[_StopOn(rank=1, step=0)])["samples"]

    # prepare() again with a new optimizer: the first DistributedOptimizer must let go of the
    # parameters' hooks, or every gradient would be submitted twice.
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss())
    model.fit((x, y), batch_size=4, epochs=1, verbose=0)
    out["reprepared"] = _weights(model.network)

    # Optimizer state: rank 0 has momentum buffers, rank 1 a fresh optimizer; prepare() shares rank 0's.
    net = _net(seed=20 + rank)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if rank == 0:
        nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    shared = accord.Model(net)
    shared.prepare(opt, nn.CrossEntropyLoss())
    out["shared_momentum"] = _momentum(shared.optimizer)
    out["shared_weights"] = _weights(net)
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("hapi"))
    results = run_ranks(_job, 2, tmp, init="accord", timeout=100)
    return results, tmp


def _reference(batch, epochs, lr, momentum, seed=0, start=None):
    """Single-process SGD on the global batches (DistributedSampler's permutation of seed+epoch)."""
    x, y = _data(N_TRAIN, 0)
    net = _net(seed)
    if start is not None:
        net.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()})
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    losses = []
    for epoch in range(epochs):
        gen = torch.Generator()
        gen.manual_seed(epoch)
        order = torch.randperm(N_TRAIN, generator=gen)
        total = 0.0
        for lo in range(0, N_TRAIN, batch):
            idx = order[lo:lo + batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / N_TRAIN)
    return _weights(net), losses


def _assert_close(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


def test_model_joins_the_job_and_wraps_the_optimizer(ranks):
    results, _ = ranks
    assert [r["world"] for r in results] == [(2, 0, True), (2, 1, True)]
    assert all(r["wrapped"] for r in results)
    assert not any(r["second_model_initialised_here"] for r in results)


def test_two_ranks_train_like_one_process_on_the_global_batch(ranks):
    results, _ = ranks
    want, losses = _reference(batch=8, epochs=3, lr=0.1, momentum=0.9)  # 2 ranks x 4
    for r in results:
        _assert_close(r["weights"], want)
        np.testing.assert_allclose(r["history"]["loss"], losses, rtol=1e-10)
        assert r["history"]["samples"] == [N_TRAIN] * 3


def test_full_batch_gradient_descent_on_two_ranks(ranks):
    results, _ = ranks
    want, _ = _reference(batch=N_TRAIN, epochs=4, lr=0.5, momentum=0.0, seed=10)
    for r in results:
        _assert_close(r["full_batch"], want)


def test_metrics_are_exact_over_uneven_shards(ranks):
    results, _ = ranks
    xe, ye = _data(N_EVAL, 1)
    _, want = numpy_metrics(results[0]["weights"], xe, ye)
    for r in results:
        assert r["evaluate"]["samples"] == N_EVAL
        for k, v in want.items():
            assert r["evaluate"][k] == pytest.approx(v, abs=1e-12), k
        # the evaluation inside fit (last epoch) saw the same weights
        assert r["history"]["eval_acc_top1"][-1] == pytest.approx(want["acc_top1"], abs=1e-12)


def test_predictions_are_gathered_in_dataset_order(ranks):
    results, _ = ranks
    xe, ye = _data(N_EVAL, 1)
    logits, _ = numpy_metrics(results[0]["weights"], xe, ye)
    for r in results:
        np.testing.assert_allclose(r["predict"], logits, rtol=1e-12)
        np.testing.assert_allclose(r["predict_one"], logits[:1], rtol=1e-12)


def test_only_rank_0_logs(ranks):
    results, _ = ranks
    log = results[0]["log"].splitlines()
    assert log[0] == "Epoch 1/3"
    assert log[1].startswith("step 2/6 - loss: ") and " - acc_top1: " in log[1] and log[1].endswith("/step")
    loss = results[0]["history"]["loss"][0]
    assert log[3].startswith(f"step 6/6 - loss: {loss:.4f} - ")  # the global epoch loss
    assert "Eval begin..." in log and "Eval samples: 7" in log
    assert log[-1].startswith("save checkpoint at ") and log[-1].endswith("final")
    assert results[1]["log"] == ""


def test_checkpoints_written_by_rank_0_and_loaded_everywhere(ranks):
    results, tmp = ranks
    import os

    for r in results:  # rank 1 never read the files: rank 0 broadcast what it loaded
        assert r["files_after_load"] == ["ckpt.opt.pt", "ckpt.pt"]
        _assert_close(r["restored"], results[0]["weights"], tol=0)
        _assert_close(r["restored_momentum"], results[0]["momentum"], tol=0)
    assert results[0]["missing"][0] == "FileNotFoundError" and "HINT:" in results[0]["missing"][1]
    assert results[1]["missing"][0] == "RuntimeError" and "rank 0 could not load" in results[1]["missing"][1]
    assert sorted(os.listdir(os.path.join(tmp, "run"))) == [
        "0.opt.pt", "0.pt", "1.opt.pt", "1.pt", "2.opt.pt", "2.pt", "final.opt.pt", "final.pt"]
    saved = torch.load(os.path.join(tmp, "run", "final.pt"), weights_only=True)
    _assert_close({k: v.numpy() for k, v in saved.items()}, results[0]["weights"], tol=0)


def test_a_stop_asked_on_one_rank_stops_all_ranks_together(ranks):
    results, _ = ranks
    for r in results:
        assert r["stop_epoch"] == [N_TRAIN]  # rank 0 asked at the end of epoch 1: one epoch
        assert r["stop_step"] == [2 * 4 * 2]  # rank 1 asked at step 1: both left after step 2


def test_prepare_again_replaces_the_distributed_optimizer(ranks):
    results, _ = ranks
    want, _ = _reference(batch=8, epochs=1, lr=0.05, momentum=0.0, start=results[0]["weights"])
    for r in results:
        _assert_close(r["reprepared"], want)


def test_prepare_broadcasts_rank_0_optimizer_state(ranks):
    results, _ = ranks
    assert results[0]["shared_momentum"]  # rank 0 had state
    _assert_close(results[1]["shared_momentum"], results[0]["shared_momentum"], tol=0)
    _assert_close(results[1]["shared_weights"], results[0]["shared_weights"], tol=0)
