"""dist_sync on real workers, with parameter servers (1 and 2) and without (the engine).

One scenario runs every method on every worker: rank 0's init wins, multi-round push/pull with
per-device lists, big keys split over the servers, key lists, pushpull, broadcast,
row_sparse_pull, Perseus ops (max/min, param_only), SGD with momentum/wd/rescale/clip, 2-bit
compression with residual carry-over, Adam with save/load of the optimizer state, and the
client-side errors. Every rank regenerates every rank's data from (seed, rank), and the expected
values are computed here with numpy, independently of accord. The same expectation is checked
with servers and without, and one test compares the two runs directly.
"""
import os

import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)

BOUND = 16  # ACCORD_KVSTORE_BIGARRAY_BOUND in these runs: keys of >= 16 elements are split
SGD = dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=2.0)
ADAM = dict(learning_rate=0.01, wd=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8)
T = 0.5  # 2-bit threshold


def _data(seed, rank, shape, low=-1.0, high=1.0):
    return np.random.default_rng([seed, rank]).uniform(low, high, size=shape).astype(np.float32)


# --- the scenario (runs on every worker) -----------------------------------------------------

def _scenario(rank, size, tmp, kind="dist_sync"):
    import torch

    import accord.kvstore as kvs
    from accord.kvstore import optimizers

    res = {}
    kv = kvs.create(kind)
    assert (kv.rank, kv.num_workers, kv.type, kv.local_rank) == (rank, size, kind, rank)
    assert kv.is_capable("optimizer")

    kv.init(0, np.full((2, 3), rank + 1.0, np.float32))  # rank 0's value wins
    res["init"] = kv.pull(0)
    res["rounds"] = []
    for r in range(3):  # a per-device list, merged first; no optimizer: assign the sum
        kv.push(0, [torch.full((2, 3), rank + r + 0.5), torch.ones(2, 3)])
        outs = [torch.zeros(2, 3), np.zeros((2, 3), np.float32), np.zeros((3, 2)).T,
                torch.nn.Parameter(torch.zeros(2, 3))]  # + a strided view and a parameter
        kv.pull(0, out=outs)
        for o in (outs[0], outs[2], outs[3]):
            np.testing.assert_array_equal(np.asarray(o.detach() if hasattr(o, "detach") else o), outs[1])
        res["rounds"].append(outs[1])

    kv.init("big", np.zeros(50, np.float32))  # split over the servers
    out = torch.zeros(50)
    kv.pushpull("big", torch.arange(50, dtype=torch.float32) * (rank + 1), out=out)
    res["big"] = out.numpy()

    kv.init([10, 11], [np.ones(2, np.float32), np.ones(3, np.float32)])
    kv.push([10, 11], [[torch.full((2,), 1.0 + rank), torch.full((2,), 2.0)], torch.full((3,), 3.0)])
    res["list"] = [v.numpy() for v in kv.pull([10, 11], out=[torch.zeros(2), torch.zeros(3)])]

    kv.init("stat", np.zeros(4, np.float32))
    mine = np.array([rank, -rank, 2 * rank - 1, 5 - rank], np.float32)
    kv.push("stat", mine, op="max")
    res["max"] = kv.pull("stat").copy()
    kv.push("stat", mine, op="min")
    res["min"] = kv.pull("stat").copy()

    kv.init("p", np.zeros(3, np.float32), param_only=True)
    kv.push("p", np.full(3, 2.0 * rank, np.float32))
    res["param"] = kv.pull("p").copy()

    res["bcast"] = kv.broadcast("b", np.full(2, rank + 7.0, np.float32), out=np.zeros(2, np.float32))
    kv.init("rows", np.arange(12, dtype=np.float32).reshape(4, 3))
    res["rows"] = kv.row_sparse_pull("rows", out=np.full((4, 3), -1.0, np.float32),
                                     row_ids=np.array([2, 0]))

    for bad, err in [(lambda: kv.init(0, np.ones((2, 3), np.float32)), "duplicate init of key 0"),
                     (lambda: kv.push("nope", np.ones(2)), "'nope'.*not been initialised"),
                     (lambda: kv.push(0, np.ones(5, np.float32)), r"shape \(5,\).*\(2, 3\)")]:
        with pytest.raises(ValueError, match=err):
            bad()

    # SGD with every hyperparameter, on the servers (or every replica)
    kv.set_optimizer(optimizers.create("sgd", **SGD))
    kv.init("w", _data(7, 0, (5, 4)))
    res["sgd"] = []
    for r in range(3):
        kv.push("w", _data(100 + r, rank, (5, 4), -3, 3))
        kv.push("p", np.full(3, 4.0 * rank, np.float32))  # param_only: still the mean
        res["sgd"].append(kv.pull("w").copy())
    res["param2"] = kv.pull("p").copy()
    kv.close()

    # 2-bit compression: assign the sum of the dequantized pushes; residuals carry over
    kv2 = kvs.create(kind)
    kv2.set_gradient_compression({"type": "2bit", "threshold": T})
    kv2.init("c", np.zeros(37, np.float32))  # 37 = 2 words + 5 values: padding; split on 2 servers
    res["twobit"] = []
    for r in range(3):
        kv2.push("c", torch.from_numpy(_data(200 + r, rank, 37)))
        res["twobit"].append(kv2.pull("c").copy())
    kv2.close()

    # Adam, its state saved by rank 0 and loaded into a new store that continues the run
    path = os.path.join(tmp, "adam.states")
    kv3 = kvs.create(kind)
    kv3.set_optimizer(optimizers.create("adam", **ADAM))
    kv3.init("a", _data(8, 0, (4, 2)))
    for r in range(2):
        kv3.push("a", _data(300 + r, rank, (4, 2)))
    weights = kv3.pull("a")
    if rank == 0:
        kv3.save_optimizer_states(path, dump_optimizer=True)
    kv3.barrier()
    kv4 = kvs.create(kind)
    kv4.init("a", weights)
    kv4.load_optimizer_states(path)  # brings the optimizer too
    kv4.push("a", _data(302, rank, (4, 2)))
    res["adam"] = [weights.copy(), kv4.pull("a").copy()]
    kv3.close()
    kv4.close()
    return res


# --- the expectation (numpy only) ------------------------------------------------------------

def _np_sgd(w, grads, p):
    w, mom = w.astype(np.float64), np.zeros_like(w, dtype=np.float64)
    out = []
    for g in grads:
        g = np.clip(p["rescale_grad"] * g, -p["clip_gradient"], p["clip_gradient"])
        mom = p["momentum"] * mom - p["learning_rate"] * p["wd"] * w - p["learning_rate"] * g
        w = w + mom
        out.append(w)
    return out


def _np_adam(w, grads, p):
    w = w.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    out = []
    for t, g in enumerate(grads, start=1):
        g = g + p["wd"] * w
        m = p["beta1"] * m + (1 - p["beta1"]) * g
        v = p["beta2"] * v + (1 - p["beta2"]) * g * g
        lr = p["learning_rate"] * np.sqrt(1 - p["beta2"] ** t) / (1 - p["beta1"] ** t)
        w = w - lr * m / (np.sqrt(v) + p["epsilon"])
        out.append(w)
    return out


def _np_twobit(seq, t):
    """Quantized values sent for a sequence of gradients, with the residual carried over."""
    res = np.zeros_like(seq[0])
    sent = []
    for g in seq:
        res = res + g
        q = np.where(res >= t, t, np.where(res <= -t, -t, 0.0)).astype(np.float32)
        res = res - q
        sent.append(q)
    return sent


def _expected(size):
    ranks = range(size)
    e = {"init": np.ones((2, 3))}
    e["rounds"] = [np.full((2, 3), sum(k + r + 1.5 for k in ranks)) for r in range(3)]
    e["big"] = np.arange(50) * sum(k + 1 for k in ranks)
    e["list"] = [np.full(2, sum(k + 3.0 for k in ranks)), np.full(3, 3.0 * size)]
    stats = np.array([[k, -k, 2 * k - 1, 5 - k] for k in ranks], np.float32)
    e["max"], e["min"] = stats.max(axis=0), stats.min(axis=0)
    e["param"] = np.full(3, np.mean([2.0 * k for k in ranks]))
    e["param2"] = np.full(3, np.mean([4.0 * k for k in ranks]))
    e["bcast"] = np.full(2, 7.0)
    rows = np.zeros((4, 3))
    rows[[0, 2]] = np.arange(12).reshape(4, 3)[[0, 2]]
    e["rows"] = rows
    grads = [sum(_data(100 + r, k, (5, 4), -3, 3).astype(np.float64) for k in ranks) for r in range(3)]
    e["sgd"] = _np_sgd(_data(7, 0, (5, 4)), grads, SGD)
    sent = [_np_twobit([_data(200 + r, k, 37) for r in range(3)], T) for k in ranks]
    e["twobit"] = [sum(sent[k][r] for k in ranks) for r in range(3)]
    grads = [sum(_data(300 + r, k, (4, 2)).astype(np.float64) for k in ranks) for r in range(3)]
    adam = _np_adam(_data(8, 0, (4, 2)), grads, ADAM)
    e["adam"] = [adam[1], adam[2]]
    return e


def _check(results, size):
    expected = _expected(size)
    for rank, got in enumerate(results):
        for name, want in expected.items():
            have = got[name]
            if isinstance(want, list):
                assert len(have) == len(want), (rank, name)
                for i, (h, w) in enumerate(zip(have, want)):
                    np.testing.assert_allclose(h, w, rtol=2e-5, atol=2e-6, err_msg=f"rank {rank} {name}[{i}]")
            else:
                np.testing.assert_allclose(have, want, rtol=2e-5, atol=2e-6, err_msg=f"rank {rank} {name}")


# --- runs --------------------------------------------------------------------------------------

def _with_servers(num_servers, num_workers, tmp_path, kind="dist_sync", tuning=None):
    from accord.kvstore.cluster import LocalCluster

    with LocalCluster(num_servers, num_workers, env=tuning) as cluster:
        env = cluster.worker_env()
        env.update({"ACCORD_KVSTORE_BIGARRAY_BOUND": str(BOUND), "ACCORD_KVSTORE_TIMEOUT": "20",
                    **(tuning or {})})
        return run_ranks(_scenario, num_workers, str(tmp_path), kind, init="none", env=env, timeout=50)


def _collective_scenario(rank, size, tmp, kind):
    from accord.engine import session

    try:
        return _scenario(rank, size, tmp, kind)
    finally:
        session.shutdown()


def _without_servers(num_workers, tmp_path, kind="dist_sync"):
    return run_ranks(_collective_scenario, num_workers, str(tmp_path), kind, init="accord",
                     timeout=50, env={"ACCORD_KVSTORE_BIGARRAY_BOUND": str(BOUND)})


@pytest.mark.parametrize("num_servers,num_workers,kind,tuning", [
    (2, 2, "dist_sync", {"ACCORD_KVSTORE_CHUNK_ELEMENTS": "8"}),  # pieces sent in chunks
    (2, 1, "dist_device_sync", {"ACCORD_KVSTORE_PAYLOAD_MAC": "0"}),  # trusted-network mode
])
def test_dist_sync_with_servers(tmp_path, num_servers, num_workers, kind, tuning):
    _check(_with_servers(num_servers, num_workers, tmp_path, kind, tuning), num_workers)


def test_dist_sync_without_servers_matches_servers_on_three_workers(tmp_path):
    with_servers = _with_servers(1, 3, tmp_path)
    _check(with_servers, 3)
    without = _without_servers(3, tmp_path)
    _check(without, 3)
    for a, b in zip(with_servers, without):  # the two implementations agree directly too
        for name in ("rounds", "sgd", "twobit", "adam"):
            for x, y in zip(a[name], b[name]):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("num_workers,kind", [(2, "dist_sync"), (1, "dist_device_sync")])
def test_dist_sync_without_servers(tmp_path, num_workers, kind):
    _check(_without_servers(num_workers, tmp_path, kind), num_workers)


# --- optimizer states of more keys than one message header holds ------------------------------

def _many_keys(rank, size, tmp):
    import accord.kvstore as kvs
    from accord.kvstore import optimizers

    keys = [f"layer_{i:04d}.weight" for i in range(1500)]  # ~100 KiB of state entries per server
    kv = kvs.create("dist_sync")
    kv.set_optimizer(optimizers.create("sgd", learning_rate=0.5, momentum=0.9))
    kv.init(keys, [np.zeros(2, np.float32) for _ in keys])
    kv.push(keys, [np.full(2, i, np.float32) for i in range(len(keys))])
    path = os.path.join(tmp, "many.states")
    kv.save_optimizer_states(path, dump_optimizer=True)
    kv2 = kvs.create("dist_sync")
    kv2.init(keys, [np.zeros(2, np.float32) for _ in keys])
    kv2.load_optimizer_states(path)
    kv2.push(keys, [np.zeros(2, np.float32) for _ in keys])  # the momentum alone moves the weights
    moved = [kv2.pull(k).copy() for k in (keys[0], keys[1], keys[-1])]
    kv.close()
    kv2.close()
    return moved


def test_optimizer_states_of_more_keys_than_one_header_holds_are_saved_and_loaded(tmp_path):
    from accord.kvstore.cluster import LocalCluster

    with LocalCluster(1, 1) as cl:
        (moved,) = run_ranks(_many_keys, 1, str(tmp_path), init="none", env=cl.worker_env(), timeout=50)
    # momentum after one push of g: -0.5 g; the next push of 0 moves the weight by 0.9 of it
    for value, g in zip(moved, (0, 1, 1499)):
        np.testing.assert_allclose(value, np.full(2, -0.45 * g, np.float32), rtol=1e-6)
