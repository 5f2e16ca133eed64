"""Training with accord.mxnet on real ranks, against one process on the concatenated batch:
DistributedTrainer (SGD with momentum, Adam, predivide, fp16, a user's NDArray compressor),
DistributedOptimizer, the KVStore plug-in in gluon.Trainer (update on the store and off it),
Perseus's KVStore extensions, and SyncBatchNorm (forward, backward, moving statistics; local
and global scope).

Every rank also trains the one-process reference itself (plain gluon, no communication) on the
concatenated batch, from the same initial weights, and compares.
"""
import numpy as np
import pytest
from helpers.fake_hosts import fake_host_env
from helpers.mxnet_env import require_mxnet
from helpers.ranks import run_ranks
from helpers.values import close

require_mxnet()

pytestmark = pytest.mark.timeout(150)

BATCH, STEPS, FEATURES = 4, 4, 5


def _net(mx, seed=0):
    """A float64 MLP with weights from numpy (identical on every rank, independent of MXNet's RNG)."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, in_units=FEATURES, activation="tanh", dtype="float64"),
            mx.gluon.nn.Dense(3, in_units=8, dtype="float64"))
    net.initialize()
    rng = np.random.default_rng(seed)
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.normal(0, 0.5, p.shape), dtype="float64"))
    return net


def _batches(size):
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(BATCH * size, FEATURES)), rng.integers(0, 3, BATCH * size))
            for _ in range(STEPS)]


def _train(mx, net, trainer, batches, rows, step_size):
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in batches:
        data = mx.nd.array(x[rows], dtype="float64")
        label = mx.nd.array(y[rows], dtype="float64")
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(step_size)
    return [p.data().asnumpy() for p in net.collect_params().values()]  # names differ per net


def _reference(mx, optimizer, params, size, batches):
    net = _net(mx)
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, dict(params), kvstore=None)
    return _train(mx, net, trainer, batches, slice(None), BATCH * size)


def _same(got, want, tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        close(g, w, tol)


class _HalvesOnNDArrays:
    """A user's compressor written against Horovod's MXNet interface (NDArrays in and out):
    sends float16 and counts its calls, so the test sees that the trainer ran it."""

    calls = 0

    @classmethod
    def compress(cls, tensor):
        cls.calls += 1
        return tensor.astype("float16"), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.astype(ctx)


def _sparse_embedding_training(mx, hvd, rank, size):
    """Embedding(sparse_grad=True): row_sparse gradients are summed in their dense form, by
    DistributedTrainer and by DistributedOptimizer, and train as one process on the whole batch."""
    rng = np.random.default_rng(11)
    batches = [(rng.integers(0, 10, (BATCH * size, 3)), rng.integers(0, 3, BATCH * size))
               for _ in range(STEPS)]

    def net():
        n = mx.gluon.nn.HybridSequential()
        n.add(mx.gluon.nn.Embedding(10, 4, sparse_grad=True, dtype="float64"),
              mx.gluon.nn.Dense(3, in_units=12, dtype="float64"))
        n.initialize()
        weights = np.random.default_rng(1)
        for p in n.collect_params().values():
            p.set_data(mx.nd.array(weights.normal(0, 0.5, p.shape), dtype="float64"))
        return n

    def train(n, trainer, rows, step_size):
        loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        for x, y in batches:
            with mx.autograd.record():
                loss = loss_fn(n(mx.nd.array(x[rows], dtype="float64")),
                               mx.nd.array(y[rows], dtype="float64"))
            loss.backward()
            assert n[0].weight.grad().stype == "row_sparse"
            trainer.step(step_size)
        return [p.data().asnumpy() for p in n.collect_params().values()]

    ref_net = net()
    want = train(ref_net, mx.gluon.Trainer(ref_net.collect_params(), "sgd", {"learning_rate": 0.5},
                                           kvstore=None), slice(None), BATCH * size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    n = net()
    trainer = hvd.DistributedTrainer(n.collect_params(), "sgd", {"learning_rate": 0.5},
                                     prefix="sparse.")
    _same(train(n, trainer, mine, BATCH), want, 1e-9)
    n = net()
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.5))
    _same(train(n, mx.gluon.Trainer(n.collect_params(), opt, kvstore=None), mine, BATCH), want, 1e-9)
    _cancelling_sparse_rows(mx, hvd, rank, size)


def _cancelling_sparse_rows(mx, hvd, rank, size):
    """A row whose gradients cancel over the ranks (sum exactly zero) still belongs to the summed
    row_sparse gradient, as in one process on the whole batch: SGD's lazy update then applies
    momentum and weight decay to it. Row 3 is looked up by every rank with opposite loss signs;
    rows 5 and 7 by one rank each; the other rows by none (they must stay untouched)."""
    tokens = np.array([[3, 5], [3, 7]][:size] + [[3, 9]] * (size - 2))
    signs = np.array([1.0, -1.0][:size] + [0.0] * (size - 2))
    direction = mx.nd.array(np.arange(1.0, 5.0), dtype="float64")

    def train(trainer, n, rows, step_size, steps=3):
        for _ in range(steps):
            with mx.autograd.record():
                out = n(mx.nd.array(tokens[rows], dtype="float64"))  # (ranks, 2, 4)
                loss = ((out * direction).sum(axis=2).sum(axis=1)
                        * mx.nd.array(signs[rows], dtype="float64")).sum()
            loss.backward()
            trainer.step(step_size)
        return n.weight.data().asnumpy()

    def net():
        n = mx.gluon.nn.Embedding(10, 4, sparse_grad=True, dtype="float64")
        n.initialize()
        n.weight.set_data(mx.nd.array(np.random.default_rng(2).normal(0, 1, (10, 4)), dtype="float64"))
        return n

    params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1}
    ref = net()
    want = train(mx.gluon.Trainer(ref.collect_params(), "sgd", dict(params), kvstore=None), ref,
                 slice(None), size)
    start = net().weight.data().asnumpy()
    assert not np.allclose(want[3], start[3]) and np.allclose(want[0], start[0])  # the case's point
    mine = slice(rank, rank + 1)
    n = net()
    got = train(hvd.DistributedTrainer(n.collect_params(), "sgd", dict(params), prefix="cancel."),
                n, mine, 1)
    close(got, want, 1e-9)
    n = net()
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(**params))
    close(train(mx.gluon.Trainer(n.collect_params(), opt, kvstore=None), n, mine, 1), want, 1e-9)


def _trainers(rank, size):
    import mxnet as mx

    import accord.mxnet as hvd

    hvd.init()
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    batches = _batches(size)
    cases = [("sgd", {"learning_rate": 0.5, "momentum": 0.9, "wd": 0.01}, {}, 1e-6),
             ("adam", {"learning_rate": 0.05}, {}, 1e-6),
             ("sgd", {"learning_rate": 0.5, "momentum": 0.9}, {"gradient_predivide_factor": 2.0}, 1e-6),
             ("sgd", {"learning_rate": 0.5}, {"compression": hvd.Compression.fp16}, 2e-3),
             ("sgd", {"learning_rate": 0.5}, {"compression": _HalvesOnNDArrays}, 2e-3)]
    for i, (optimizer, params, extra, tol) in enumerate(cases):
        want = _reference(mx, optimizer, params, size, batches)
        net = _net(mx)
        trainer = hvd.DistributedTrainer(net.collect_params(), optimizer, dict(params),
                                         prefix=f"case{i}.", **extra)
        _same(_train(mx, net, trainer, batches, mine, BATCH), want, tol)
    assert _HalvesOnNDArrays.calls == STEPS * 4  # every gradient (2 weights, 2 biases), every step
    _sparse_embedding_training(mx, hvd, rank, size)
    # DistributedOptimizer in a plain gluon.Trainer: each rank steps with its own batch size
    want = _reference(mx, "sgd", {"learning_rate": 0.5, "momentum": 0.9}, size, batches)
    net = _net(mx)
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
    _same(_train(mx, net, trainer, batches, mine, BATCH), want, 1e-6)
    # the KVStore plug-in: MXNet's dist_sync semantics (gradients summed over workers, step()
    # given the global batch size), updating on the store (the default) and on each worker
    for optimizer, params, on_kv in (("sgd", {"learning_rate": 0.5, "momentum": 0.9}, None),
                                     ("adam", {"learning_rate": 0.05}, False)):
        want = _reference(mx, optimizer, params, size, batches)
        net = _net(mx)
        trainer = mx.gluon.Trainer(net.collect_params(), optimizer, dict(params), kvstore="accord",
                                   update_on_kvstore=on_kv)
        _same(_train(mx, net, trainer, batches, mine, BATCH * size), want, 1e-6)
        assert trainer._kvstore.type == "dist_sync_accord" and trainer._kvstore.num_workers == size
        assert trainer._update_on_kvstore is (on_kv is None)
        if on_kv is None:  # optimizer state held by the store: gluon saves and loads it there
            import os
            import shutil
            import tempfile

            folder = tempfile.mkdtemp(prefix="accord-mx-states-")
            try:
                trainer.save_states(os.path.join(folder, "states"))
                before = {k: v.asnumpy() for k, v in trainer._kvstore._updater.states.items()}
                trainer.load_states(os.path.join(folder, "states"))
            finally:
                shutil.rmtree(folder)
            after = trainer._kvstore._updater.states
            assert before.keys() == after.keys() and len(before) == len(want)
            for k in before:
                close(after[k].asnumpy(), before[k])
    _perseus_kvstore(rank, size)
    hvd.shutdown()
    return True


def test_trainers_and_kvstore_plugin_equal_one_process_on_the_concatenated_batch():
    assert run_ranks(_trainers, 2, init="accord", timeout=140) == [True, True]


def _perseus_kvstore(rank, size):
    """Perseus's KVStore extensions on NDArrays: local_rank, init(param_only), push(op=...)."""
    import mxnet as mx

    import accord.mxnet as hvd

    kv = hvd.create("dist_sync_perseus")
    assert (kv.rank, kv.num_workers, kv.local_rank, kv.type) == (rank, size, rank, "dist_sync_perseus")
    # the name kv.type reports creates accord's store too ('dist' in it, for scripts that check)
    named = mx.kv.create("dist_sync_accord")
    assert isinstance(named, hvd.AccordKVStore) and named.type == "dist_sync_accord"
    assert named.num_workers == size
    assert isinstance(mx.kv.create("accord"), hvd.AccordKVStore)
    kv.init("w", mx.nd.ones(3) * (rank + 10))  # rank 0's value wins
    close(kv.pull("w").asnumpy(), np.full(3, 10))
    kv.push("w", [mx.nd.ones(3) * (rank + 1), mx.nd.ones(3)])  # two devices, summed, then workers
    out = mx.nd.zeros(3)
    kv.pull("w", out=out)
    close(out.asnumpy(), np.full(3, sum(r + 2 for r in range(size))))
    kv.push("w", mx.nd.array([rank, -rank, 5.0]), op="max")
    kv.pull("w", out=out)
    close(out.asnumpy(), [size - 1, 0, 5])
    kv.push("w", mx.nd.array([rank, -rank, 5.0]), op="min")
    kv.pull("w", out=out)
    close(out.asnumpy(), [0, -(size - 1), 5])
    # param_only keys average over devices and workers and skip the optimizer (Perseus)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))
    kv.init([3, 4], [mx.nd.zeros(2), mx.nd.zeros(2)], param_only=True)
    kv.push(3, mx.nd.ones(2) * rank)
    close(kv.pull(3).asnumpy(), np.full(2, np.mean(range(size))))
    # with an MXNet optimizer: stored -= lr * sum of pushes
    kv.init("v", mx.nd.ones(2))
    kv.push("v", mx.nd.ones(2) * (rank + 1))
    close(kv.pull("v").asnumpy(), np.full(2, 1 - sum(r + 1 for r in range(size))))
    _python_updater(mx, rank, size)
    _row_sparse_values(mx, rank, size)
    kv.barrier()
    with pytest.raises(ValueError, match="not been initialised"):
        kv.push("nope", mx.nd.ones(1))
    with pytest.raises(TypeError, match="NDArrays"):
        kv.push("w", np.ones(3))
    with pytest.raises(ValueError, match="unknown kvstore type"):
        hvd.create("dist_sync_magic")


def _python_updater(mx, rank, size):
    """MXNet's ``kv._set_updater(fn)``: fn(key, merged, stored) runs on every worker on the sum of
    every device's and worker's push, and updates the stored NDArray in place."""
    kv = mx.kv.create("accord")
    seen = []

    def decay_add(key, merged, stored):
        seen.append((key, type(merged).__name__, type(stored).__name__))
        stored *= 0.5
        stored += merged

    kv.init("u", mx.nd.ones(2) * 4)
    kv.init(9, mx.nd.zeros(3))
    kv._set_updater(decay_add)
    pushed = sum((r + 1) * 3 for r in range(size))  # every rank pushes (r+1) and 2(r+1)
    kv.push("u", [mx.nd.ones(2) * (rank + 1), mx.nd.ones(2) * 2 * (rank + 1)])
    kv.push("u", [mx.nd.ones(2) * (rank + 1), mx.nd.ones(2) * 2 * (rank + 1)])
    close(kv.pull("u").asnumpy(), np.full(2, (4 * 0.5 + pushed) * 0.5 + pushed))
    kv.push(9, mx.nd.arange(3) * (rank + 1))
    close(kv.pull(9).asnumpy(), np.arange(3) * sum(r + 1 for r in range(size)))
    assert seen == [("u", "NDArray", "NDArray")] * 2 + [(9, "NDArray", "NDArray")]
    with pytest.raises(ValueError, match="Python updater"):
        kv.save_optimizer_states("unused-states")
    with pytest.raises(TypeError, match="callable"):
        kv._set_updater("sgd")


def _row_sparse_values(mx, rank, size):
    """row_sparse NDArrays count as their dense form in init and push (MXNet's stores sum a
    sparse push into the dense stored array); row_sparse_pull fills a row_sparse ``out`` with
    the requested rows; pull leaves row_sparse outs alone unless ignore_sparse=False (MXNet)."""
    kv = mx.kv.create("accord")
    start = np.zeros((5, 3))
    start[[1, 3]] = [[1, 2, 3], [4, 5, 6]]  # two stored rows of five
    kv.init("e", mx.nd.array(start).tostype("row_sparse"))
    close(kv.pull("e").asnumpy(), start)
    pushes = []
    for r in range(size):
        grad = np.zeros((5, 3))
        grad[[r % 5, 4]] = r + 1  # each worker touches its own row and row 4
        pushes.append(grad)
    kv.push("e", mx.nd.array(pushes[rank]).tostype("row_sparse"))
    total = sum(pushes)
    dense = mx.nd.zeros((5, 3))
    kv.pull("e", out=dense)
    close(dense.asnumpy(), total)
    wanted = mx.nd.array([4, 1, 4], dtype="int64")
    rows = mx.nd.zeros((5, 3), stype="row_sparse")
    kv.row_sparse_pull("e", out=rows, row_ids=wanted)
    expected = np.zeros((5, 3))
    expected[[1, 4]] = total[[1, 4]]
    assert rows.stype == "row_sparse"
    close(rows.asnumpy(), expected)
    kept = mx.nd.array(np.full((5, 3), 7.0)).tostype("row_sparse")
    kv.pull("e", out=kept)
    close(kept.asnumpy(), np.full((5, 3), 7.0))
    kv.pull("e", out=kept, ignore_sparse=False)
    close(kept.asnumpy(), total)
    _row_sparse_lazy_updates(mx, rank, size)


def _row_sparse_lazy_updates(mx, rank, size):
    """With an optimizer on the store, a row_sparse push is applied as MXNet's own stores apply
    it: the merged gradient holds every row some push held (even one whose sum is exactly zero)
    and the optimizer's lazy update touches exactly those rows. The reference is MXNet's 'local'
    store in this process, given every worker's push as one device each."""
    def pushes(step):
        grads = []
        for r in range(size):
            grad = np.zeros((6, 2))
            grad[r] = (r + 1) * (step + 1)
            grad[5] = [1.0, -2.0] if r == 0 else ([-1.0, 2.0] if r == 1 else 0.0)  # cancels
            grads.append(mx.nd.array(grad).tostype("row_sparse"))
        return grads

    start = mx.nd.array(np.random.default_rng(3).normal(size=(6, 2)))
    stores = {"accord": mx.kv.create("accord"), "local": mx.kv.create("local")}
    for kind, kv in stores.items():
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.1))
        kv.init("lazy", start.copy())
        for step in range(3):
            kv.push("lazy", pushes(step)[rank] if kind == "accord" else pushes(step))
    got, want = mx.nd.zeros((6, 2)), mx.nd.zeros((6, 2))
    stores["accord"].pull("lazy", out=got)
    stores["local"].pull("lazy", out=want)
    got, want = got.asnumpy(), want.asnumpy()
    begin = start.asnumpy()
    assert not np.allclose(want[5], begin[5]) and np.allclose(want[size:5], begin[size:5])
    close(got, want, 1e-6)


_HOSTS = ["a", "a", "b"]


def _sync_bn(rank, size):
    import mxnet as mx

    import accord.mxnet as hvd

    hvd.init()
    channels = 3
    for scope, peers in ((1, list(range(size))), ("local", [r for r, h in enumerate(_HOSTS)
                                                           if h == _HOSTS[rank]])):
        xs = [np.random.default_rng([3, r]).normal(size=(r + 2, channels, 4)) for r in range(size)]
        ws = [np.random.default_rng([4, r]).normal(size=(r + 2, channels, 4)) for r in range(size)]
        gamma = np.array([1.0, 2.0, 0.5])
        beta = np.array([0.1, -0.2, 0.3])

        def run(layer, x, w, gamma=gamma, beta=beta):
            layer.cast("float64")
            layer.initialize()
            layer.gamma.set_data(mx.nd.array(gamma, dtype="float64"))
            layer.beta.set_data(mx.nd.array(beta, dtype="float64"))
            data = mx.nd.array(x, dtype="float64")
            data.attach_grad()
            with mx.autograd.record():
                y = layer(data)
                loss = (y * mx.nd.array(w, dtype="float64")).sum()
            loss.backward()
            return (y.asnumpy(), data.grad.asnumpy(), layer.gamma.grad().asnumpy(),
                    layer.beta.grad().asnumpy(), layer.running_mean.data().asnumpy(),
                    layer.running_var.data().asnumpy())

        ref = run(mx.gluon.nn.BatchNorm(in_channels=channels),
                  np.concatenate([xs[r] for r in peers]), np.concatenate([ws[r] for r in peers]))
        got = run(hvd.SyncBatchNorm(in_channels=channels, comm_scope=scope),
                  xs[rank], ws[rank])
        start = sum(r + 2 for r in peers if r < rank)
        rows = slice(start, start + rank + 2)
        close(got[0], ref[0][rows], 1e-9)
        close(got[1], ref[1][rows], 1e-9)
        # gamma/beta gradients are local: their sum over the scope is the big batch's
        both = hvd.allgather_object((got[2], got[3]))
        close(sum(both[r][0] for r in peers), ref[2], 1e-9)
        close(sum(both[r][1] for r in peers), ref[3], 1e-9)
        close(got[4], ref[4], 1e-6)  # MXNet's own update mixes in float32 (momentum): ~2e-7 apart
        close(got[5], ref[5], 1e-6)
    with pytest.raises(ValueError, match="comm_scope"):
        hvd.SyncBatchNorm(comm_scope=2)
    hvd.shutdown()
    return True


def _fake_hosts(rank):
    return fake_host_env(rank, _HOSTS)


def test_sync_batch_norm_equals_batch_norm_on_the_scope_batch():
    results = run_ranks(_sync_bn, 3, init="accord", per_rank_env=_fake_hosts, timeout=140)
    assert results == [True] * 3
