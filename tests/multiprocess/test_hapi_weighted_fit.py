"""fit(work_load_list=...) on 2 real ranks: weighted shares give ranks different numbers of steps.

Step k is one update on the union of the ranks' k-th batches, so the expected weights come from
one process running those updates in plain torch (shares and batches rebuilt here from MXNet's
rule and the sampler's documented permutation). One set of ranks runs every scenario (``_job``).
"""
import numpy as np
import pytest
import torch
from helpers.ranks import run_ranks
from helpers.small_nets import _data, _net, _weights, numpy_metrics
from torch import nn

pytestmark = pytest.mark.timeout(120)

N_TRAIN, N_EVAL, BATCH = 42, 7, 4




def _stop_at(rank, step):
    from accord.hapi import Callback

    class Stop(Callback):
        def on_train_batch_end(self, s, logs=None):
            if self.model.rank == rank and s == step:
                self.model.stop_training = True

    return Stop()


def _job(rank, size):
    import contextlib
    import io

    import accord
    import accord.torch as hvd
    from accord.hapi import Accuracy, LRScheduler

    x, y = _data(N_TRAIN, 0)
    xe, ye = _data(N_EVAL, 1)
    out = {}

    # 1. Rank 1 reads 3/4 of the data (32 samples, 8 steps), rank 0 10 samples (3 steps), SGD
    #    with momentum over 2 epochs: rank 0 joins early each epoch and takes rank 1's state.
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        model = accord.Model(_net(seed=rank))  # rank 0's initial weights are broadcast
        model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      nn.CrossEntropyLoss(), Accuracy(topk=(1, 2)))
        out["history"] = model.fit((x, y), (xe, ye), batch_size=BATCH, epochs=2, log_freq=2, eval_freq=2,
                                   work_load_list=[1, 3])
    out["log"] = log.getvalue()
    out["weights"] = _weights(model.network)
    out["evaluate"] = model.evaluate((xe, ye), batch_size=2, verbose=0)

    # 2. The long rank is rank 0; Adam and a step-wise LR schedule: the short rank's optimizer
    #    state, learning rate and scheduler must follow the global steps too.
    adam = accord.Model(_net(seed=7))
    adam.prepare(torch.optim.Adam(adam.parameters(), lr=0.05), nn.CrossEntropyLoss())
    sched = torch.optim.lr_scheduler.StepLR(adam.optimizer, step_size=3, gamma=0.5)
    adam.fit((x, y), batch_size=BATCH, epochs=2, verbose=0, work_load_list=[3, 1],
             callbacks=[LRScheduler(sched, by_step=True, by_epoch=False)])
    out["adam"] = _weights(adam.network)
    out["adam_lr"] = adam.optimizer.param_groups[0]["lr"]
    out["adam_sched_epoch"] = sched.last_epoch

    # 3. drop_last with a batch larger than rank 0's share: rank 0 runs no step at all.
    empty = accord.Model(_net(seed=11))
    empty.prepare(torch.optim.SGD(empty.parameters(), lr=0.2), nn.CrossEntropyLoss())
    out["empty_history"] = empty.fit((x, y), batch_size=16, epochs=1, verbose=0, drop_last=True,
                                     work_load_list=[1, 3])
    out["empty"] = _weights(empty.network)

    # 4. Stops: asked at a step both ranks run (agreed at that log step), and at a step only
    #    the long rank runs (agreed at the epoch's end).
    stopper = accord.Model(_net(seed=30))
    stopper.prepare(torch.optim.SGD(stopper.parameters(), lr=0.1), nn.CrossEntropyLoss())
    out["stop_common"] = stopper.fit((x, y), batch_size=BATCH, epochs=3, verbose=0, log_freq=1,
                                     work_load_list=[1, 3], callbacks=[_stop_at(0, 0)])["samples"]
    out["stop_late"] = stopper.fit((x, y), batch_size=BATCH, epochs=3, verbose=0, log_freq=1,
                                   work_load_list=[1, 3], callbacks=[_stop_at(1, 5)])["samples"]
    out["stopper"] = _weights(stopper.network)

    # 5. remove_hooks(): backward submits nothing; step() still averages every gradient.
    net = _net(seed=40)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=1.0),
                                   named_parameters=net.named_parameters())
    opt.remove_hooks()
    xt, yt = torch.from_numpy(x[rank::2]), torch.from_numpy(y[rank::2])
    nn.functional.cross_entropy(net(xt), yt).backward()
    out["handles_after_backward"] = len(opt._handles)
    local = {n: p.grad.clone() for n, p in net.named_parameters()}
    opt.synchronize()
    out["grads"] = {n: (local[n].numpy(), p.grad.numpy().copy()) for n, p in net.named_parameters()}
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(_job, 2, init="accord", timeout=100)


def _shares(n, weights):
    """MXNet's split rule: round(w * n / sum) rows each (half to even), the last takes the rest."""
    counts = [round(w * n / sum(weights)) for w in weights]
    counts[-1] += n - sum(counts)
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds


def _global_batches(epoch, weights, batch, drop_last=False):
    """Step k's global batch: the union of every rank's k-th batch of this epoch's shard."""
    gen = torch.Generator()
    gen.manual_seed(epoch)  # the sampler's permutation for seed 0
    order = torch.randperm(N_TRAIN, generator=gen)
    per_rank = []
    for lo, hi in _shares(N_TRAIN, weights):
        shard = order[lo:hi]
        stop = len(shard) - len(shard) % batch if drop_last else len(shard)
        per_rank.append([shard[i:min(i + batch, len(shard))] for i in range(0, stop, batch)])
    steps = max(len(b) for b in per_rank)
    return [torch.cat([b[k] for b in per_rank if k < len(b)]) for k in range(steps)]


def _reference(seed, make_opt, weights, epochs, batch=BATCH, drop_last=False, make_sched=None):
    x, y = _data(N_TRAIN, 0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    net = _net(seed)
    opt = make_opt(net.parameters())
    sched = make_sched(opt) if make_sched else None
    losses = []
    for epoch in range(epochs):
        total, count = 0.0, 0
        for idx in _global_batches(epoch, weights, batch, drop_last):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            total, count = total + loss.item() * len(idx), count + len(idx)
        losses.append(total / count)
    return _weights(net), losses, opt


def _assert_close(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


def test_uneven_steps_train_like_one_process_on_the_union_of_batches(results):
    want, losses, _ = _reference(0, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), [1, 3], 2)
    for r in results:
        _assert_close(r["weights"], want)
        np.testing.assert_allclose(r["history"]["loss"], losses, rtol=1e-10)
        assert r["history"]["samples"] == [N_TRAIN, N_TRAIN]
        for t, s in zip(r["history"]["epoch_time"], r["history"]["samples_per_sec"]):
            assert s == pytest.approx(N_TRAIN / t)


def test_adam_and_step_schedule_follow_the_global_steps(results):
    want, _, opt = _reference(
        7, lambda p: torch.optim.Adam(p, lr=0.05), [3, 1], 2,
        make_sched=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5))
    for r in results:
        _assert_close(r["adam"], want)
        assert r["adam_lr"] == opt.param_groups[0]["lr"] == 0.05 * 0.5 ** 5  # 16 steps, halved every 3
        assert r["adam_sched_epoch"] == 16


def test_a_rank_without_any_step_joins_at_once(results):
    want, losses, _ = _reference(11, lambda p: torch.optim.SGD(p, lr=0.2), [1, 3], 1, batch=16,
                                 drop_last=True)
    for r in results:
        _assert_close(r["empty"], want)
        assert r["empty_history"]["samples"] == [32]  # rank 0's 10 samples are dropped
        np.testing.assert_allclose(r["empty_history"]["loss"], losses, rtol=1e-10)


def test_stops_are_agreed_with_uneven_steps(results):
    for r in results:
        # asked on rank 0 after step 1's reduce, agreed at step 2's: 2 steps of 4 + 4 samples
        assert r["stop_common"] == [2 * 2 * BATCH]
        assert r["stop_late"] == [N_TRAIN]  # asked on rank 1 alone at step 6: the epoch ends
    _assert_close(results[0]["stopper"], results[1]["stopper"], tol=0)


def _numpy_metrics(weights, x, y):
    return numpy_metrics(weights, x, y)[1]


def test_metrics_are_exact_over_the_whole_eval_set(results):
    xe, ye = _data(N_EVAL, 1)
    want = _numpy_metrics(results[1]["weights"], xe, ye)
    for r in results:
        assert r["evaluate"]["samples"] == N_EVAL and r["history"]["eval_samples"] == [N_EVAL]
        for k, v in want.items():
            assert r["evaluate"][k] == pytest.approx(v, abs=1e-12), k
            assert r["history"][f"eval_{k}"][-1] == pytest.approx(v, abs=1e-12), k


def test_rank_0_logs_global_steps_and_values(results):
    log = results[0]["log"].splitlines()
    loss = results[0]["history"]["loss"]
    # rank 0 ran 3 of the 8 steps: a line at step 2 (both ranks there), then the epoch's
    # global values once every rank has finished
    assert log[0] == "Epoch 1/2"
    assert log[1].startswith("step 2/8 - loss: ") and " - acc_top1: " in log[1]
    assert log[2].startswith(f"step 8/8 - loss: {loss[0]:.4f} - ") and log[2].endswith("/step")
    assert log[3] == "Epoch 2/2"
    assert log[5].startswith(f"step 8/8 - loss: {loss[1]:.4f} - ")
    assert log[6] == "Eval begin..." and log[-1] == "Eval samples: 7"
    assert results[1]["log"] == ""


def test_remove_hooks_leaves_backward_silent_and_synchronize_averaging(results):
    for r in results:
        assert r["handles_after_backward"] == 0
    for name in results[0]["grads"]:
        mean = (results[0]["grads"][name][0] + results[1]["grads"][name][0]) / 2
        for r in results:
            np.testing.assert_allclose(r["grads"][name][1], mean, rtol=1e-12, atol=1e-14)
