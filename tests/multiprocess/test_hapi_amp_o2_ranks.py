"""accord.Model with AMP O2 on 2 real ranks (CPU, bfloat16): the gradient allreduce moves half
gradients, every rank's float32 masters start as rank 0's and stay equal, and the weights equal
a single-process O2 loop (written here) that averages the two ranks' half gradients, as the
allreduce does, in bfloat16. After a weighted epoch (ranks join at different steps) every rank
takes the masters of the rank that ran longest.

One set of ranks runs every scenario (starting ranks costs seconds here).
"""
import numpy as np
import pytest
import torch
from helpers.ranks import run_ranks
from torch import nn

pytestmark = pytest.mark.timeout(120)

HALF = torch.bfloat16
N, BATCH, EPOCHS, SIZE = 40, 5, 2, 2  # 20 samples per rank: 4 steps per epoch


def _net(seed):
    """Half Linears around a LayerNorm, which O2 keeps in float32 (no buffers: ranks agree)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 3))


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, size=N)


def _snapshot(model):
    weights = {k: v.detach().float().numpy().copy() for k, v in model.network.state_dict().items()}
    masters = [m.detach().numpy().copy() for m in model._state.masters.masters]
    momentum = {i: (str(s["momentum_buffer"].dtype), s["momentum_buffer"].numpy().copy())
                for i, s in model.optimizer.state_dict()["state"].items()}
    return {"weights": weights, "masters": masters, "momentum": momentum,
            "dtypes": {k: str(v.dtype) for k, v in model.network.state_dict().items()}}


def _job(rank, size):
    import accord
    import accord.torch as hvd
    from accord.torch import async_ops

    reduced = {}  # allreduce name -> dtypes of the tensors the engine was given
    real = async_ops.allreduce_tensors

    def spy(tensors, inplace, name, *args, **kwargs):
        reduced[name] = sorted({str(t.dtype) for t in tensors})
        return real(tensors, inplace, name, *args, **kwargs)

    async_ops.allreduce_tensors = spy
    x, y = _data()
    model = accord.Model(_net(seed=rank))  # rank 1 starts elsewhere: prepare gives it rank 0's
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                  amp_level="O2")
    out = {"prepared": _snapshot(model)}
    model.fit((x, y), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    out["trained"] = _snapshot(model)
    out["reduced"] = {k: v for k, v in reduced.items() if k and not k.startswith("accord.")}
    # Rank 0 reads 1/4 of the data (3 steps), rank 1 3/4 (8 steps): rank 0 joins early and
    # must then take rank 1's masters, not keep its own stale ones.
    model.fit((x, y), batch_size=4, epochs=1, shuffle=False, verbose=0, work_load_list=[1, 3])
    out["weighted"] = _snapshot(model)
    async_ops.allreduce_tensors = real
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(_job, SIZE, init="accord", timeout=100)


def _half_params(net):
    return [p for m in net.modules() if not isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)]


def _reference():
    """O2 by hand in one process: per step, each rank's batch (rank r reads samples r, r + 2,
    ...) gives half gradients; their average is taken in their own dtype, as the allreduce
    does; the float32 masters (and LayerNorm's own float32 parameters) are stepped."""
    x, y = (torch.from_numpy(a) for a in _data())
    net = _net(seed=0)
    half = _half_params(net)
    for p in half:
        p.data = p.data.to(HALF)
    masters = {id(p): p.detach().float() for p in half}
    params = list(net.parameters())
    opt = torch.optim.SGD([masters.get(id(p), p) for p in params], lr=0.1, momentum=0.9)
    shards = [list(range(N))[r::SIZE] for r in range(SIZE)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the ranks: the same kernels, the same roundings
    try:
        for _ in range(EPOCHS):
            for lo in range(0, N // SIZE, BATCH):
                grads = []
                for shard in shards:
                    idx = shard[lo:lo + BATCH]
                    net.zero_grad(set_to_none=True)
                    with torch.autocast("cpu", dtype=HALF):
                        nn.functional.cross_entropy(net(x[idx]), y[idx].long()).backward()
                    grads.append([p.grad for p in params])
                opt.zero_grad(set_to_none=True)
                for p, g0, g1 in zip(params, *grads):
                    mean = (g0 + g1) / SIZE  # in the gradient's dtype: bfloat16 for half params
                    masters.get(id(p), p).grad = mean.float()
                opt.step()
                with torch.no_grad():
                    for p in half:
                        p.copy_(masters[id(p)])
    finally:
        torch.set_num_threads(threads)
    return ({k: v.detach().float().numpy() for k, v in net.state_dict().items()},
            [masters[id(p)].numpy() for p in half])


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        a, b = list(a.values()), list(b.values())
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_the_allreduce_moves_half_gradients(results):
    for r in results:
        assert r["prepared"]["dtypes"] == {"0.weight": "torch.bfloat16", "0.bias": "torch.bfloat16",
                                           "1.weight": "torch.float32", "1.bias": "torch.float32",
                                           "3.weight": "torch.bfloat16", "3.bias": "torch.bfloat16"}
        assert r["reduced"] == {"0.weight": ["torch.bfloat16"], "0.bias": ["torch.bfloat16"],
                                "1.weight": ["torch.float32"], "1.bias": ["torch.float32"],
                                "3.weight": ["torch.bfloat16"], "3.bias": ["torch.bfloat16"]}


def test_prepare_gives_every_rank_rank_0s_masters(results):
    _assert_same(results[1]["prepared"]["masters"], results[0]["prepared"]["masters"])
    _assert_same(results[1]["prepared"]["weights"], results[0]["prepared"]["weights"])


def test_two_ranks_train_like_one_process_averaging_half_gradients(results):
    weights, masters = _reference()
    for r in results:
        _assert_same(r["trained"]["weights"], weights)
        _assert_same(r["trained"]["masters"], masters)


def test_after_a_weighted_epoch_every_rank_has_the_longest_ranks_masters(results):
    a, b = (r["weighted"] for r in results)
    assert not all(np.array_equal(u, v) for u, v in zip(a["masters"], results[0]["trained"]["masters"]))
    _assert_same(a["masters"], b["masters"])
    _assert_same(a["weights"], b["weights"])
    # broadcast_optimizer_state went through the groups, which hold the masters: float32 state
    assert sorted(a["momentum"]) == list(range(6))
    for i in range(6):
        assert a["momentum"][i][0] == b["momentum"][i][0] == "torch.float32"
        np.testing.assert_array_equal(a["momentum"][i][1], b["momentum"][i][1])
    for r in results:  # the half weights are the masters rounded
        half = [r["weighted"]["weights"][k] for k in ("0.weight", "0.bias", "3.weight", "3.bias")]
        _assert_same(half, [torch.from_numpy(m).to(HALF).float().numpy() for m in r["weighted"]["masters"]])
