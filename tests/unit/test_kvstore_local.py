"""The 'local' and 'device' stores: MXNet's semantics, the registry, errors, states, compression.

Expected values are computed with numpy (or plain Python) here, independently of accord.
"""
import warnings

import numpy as np
import pytest
import torch

import accord.kvstore as kvs
from accord.errors import BackendError
from accord.kvstore import optimizers

pytestmark = pytest.mark.timeout(30)


def _twobit_reference(seq, t):
    res = np.zeros_like(seq[0], dtype=np.float32)
    out = []
    for g in seq:
        res = res + g
        q = np.where(res >= t, t, np.where(res <= -t, -t, 0.0)).astype(np.float32)
        res = res - q
        out.append(q)
    return out


# --- registry ----------------------------------------------------------------------------------

def test_create_types_aliases_and_unknown_names():
    assert kvs.create().type == "local"
    assert kvs.create("LOCAL").type == "local"
    assert kvs.create("device").type == "device"
    assert kvs.create("local_allreduce_device").type == "device"
    assert kvs.create("local_update_cpu").type == "local"
    assert "dist_sync" in kvs.known_types() and "dist_sync_device" in kvs.known_types()
    with pytest.raises(ValueError, match=r"(?s)unknown kvstore type 'nope'.*local.*HINT"):
        kvs.create("nope")
    with pytest.raises(TypeError, match="string"):
        kvs.create(3)


@pytest.fixture
def registry():
    from accord.kvstore import registry

    saved = dict(registry._REGISTRY)
    yield registry
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_register_plugs_in_new_types(registry):
    @kvs.register
    class MyStore(kvs.KVStoreBase):
        def __init__(self):
            super().__init__("mystore")

    @kvs.register("other_name")
    class Other(kvs.KVStoreBase):
        def __init__(self):
            super().__init__("other_name")

    assert isinstance(kvs.create("mystore"), MyStore)
    assert isinstance(kvs.create("Other_Name"), Other)
    kvs.register(MyStore)  # the same class again: nothing changes
    with pytest.raises(TypeError):
        kvs.register(3)


def test_register_refuses_a_taken_name_unless_override(registry):
    @kvs.register
    class MyStore(kvs.KVStoreBase):
        def __init__(self):
            super().__init__("mystore")

    class Other(kvs.KVStoreBase):
        def __init__(self):
            super().__init__("other")

    for taken in ("MyStore", "local", "local_update_cpu"):  # registered, built-in, alias
        with pytest.raises(ValueError, match=rf"(?s)kvstore type '{taken.lower()}' is already registered"
                                             r".*HINT: .*override=True"):
            kvs.register(taken)(Other)
    assert isinstance(kvs.create("mystore"), MyStore)
    assert kvs.create("local").type == "local" and kvs.create("local_update_cpu").type == "local"

    @kvs.register("local_update_cpu", override=True)
    @kvs.register(override=True)
    class Replacement(kvs.KVStoreBase):
        def __init__(self):
            super().__init__("replacement")

    assert isinstance(kvs.create("replacement"), Replacement)
    assert isinstance(kvs.create("local_update_cpu"), Replacement)  # a registered name beats an alias
    assert kvs.create("local").type == "local"


def test_properties_and_capabilities():
    kv = kvs.create("local")
    assert (kv.rank, kv.num_workers, kv.local_rank) == (0, 1, 0)
    assert kv.is_capable("optimizer") and kv.is_capable(kvs.KVStoreBase.OPTIMIZER)
    with pytest.raises(ValueError, match="unknown capability"):
        kv.is_capable("teleport")
    kv.barrier()
    kv._barrier()


# --- init / push / pull semantics --------------------------------------------------------------

@pytest.mark.parametrize("name", ["local", "device"])
def test_push_merges_lists_and_assigns_and_pull_broadcasts(name):
    kv = kvs.create(name)
    kv.init(3, np.full((2, 3), 2.0, np.float32))
    a = np.zeros((2, 3), np.float32)
    kv.pull(3, out=a)
    np.testing.assert_array_equal(a, np.full((2, 3), 2.0))
    kv.push(3, [torch.ones(2, 3) * (i + 1) for i in range(4)])  # 1+2+3+4, assigned not added
    outs = [torch.zeros(2, 3), np.zeros((2, 3), np.float32), torch.zeros(2, 3, dtype=torch.float64)]
    kv.pull(3, out=outs)
    for o in outs:
        np.testing.assert_array_equal(np.asarray(o), np.full((2, 3), 10.0))
    kv.push(3, np.ones((2, 3), np.float32) * 8)
    np.testing.assert_array_equal(kv.pull(3), np.full((2, 3), 8.0))
    # repeated keys in one push are merged like a device list (MXNet groups by key)
    kv.push([3, 3], [np.ones((2, 3), np.float32), np.ones((2, 3), np.float32) * 2])
    np.testing.assert_array_equal(kv.pull(3), np.full((2, 3), 3.0))


def test_pull_without_out_returns_the_kind_given_to_init_and_key_lists_work():
    kv = kvs.create()
    kv.init(["w", "b"], [torch.zeros(2, 2, dtype=torch.float64), np.zeros(3, np.int64)])
    kv.push(["w", "b"], [[torch.ones(2, 2), torch.ones(2, 2)], np.arange(3)])
    w, b = kv.pull(["w", "b"])
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float64
    assert isinstance(b, np.ndarray) and b.dtype == np.int64
    np.testing.assert_array_equal(w.numpy(), np.full((2, 2), 2.0))
    np.testing.assert_array_equal(b, [0, 1, 2])
    # a float push into an int key is converted to the key's dtype
    kv.push("b", np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(kv.pull("b"), [1, 2, 3])


def test_pushpull_broadcast_and_row_sparse_pull():
    kv = kvs.create()
    kv.init(1, np.zeros(4, np.float32))
    value = [torch.ones(4), torch.full((4,), 2.0)]
    kv.pushpull(1, value)  # out=None: written back into the pushed values
    for v in value:
        np.testing.assert_array_equal(v.numpy(), np.full(4, 3.0))
    out = torch.zeros(4)
    kv.pushpull(1, torch.full((4,), 5.0), out=out)
    assert out.tolist() == [5.0] * 4
    got = kv.broadcast("bc", np.arange(3, dtype=np.float32), out=[np.zeros(3, np.float32)] * 2)
    np.testing.assert_array_equal(got[1], [0, 1, 2])
    kv.init("m", np.arange(12, dtype=np.float32).reshape(4, 3))
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = np.full((4, 3), -1.0, np.float32)
    kv.row_sparse_pull("m", out=out, row_ids=np.array([2, 2, 0]))  # repeats, unsorted
    expected = np.zeros((4, 3))
    expected[[0, 2]] = full[[0, 2]]
    np.testing.assert_array_equal(out, expected)
    outs = [torch.zeros(4, 3), torch.zeros(4, 3)]
    kv.row_sparse_pull("m", out=outs, row_ids=[torch.tensor([1]), [3]])  # one row_ids per output
    assert outs[0][1].tolist() == full[1].tolist() and outs[0].sum() == full[1].sum()
    assert outs[1][3].tolist() == full[3].tolist() and outs[1].sum() == full[3].sum()
    with pytest.raises(ValueError, match="out and row_ids"):
        kv.row_sparse_pull("m", out=out)


def test_perseus_ops_and_param_only():
    kv = kvs.create()
    kv.init("s", np.zeros(3, np.float32))
    vals = [np.array([1, -5, 2], np.float32), np.array([0, 4, 2], np.float32), np.array([3, 0, -1], np.float32)]
    kv.push("s", vals, op="max")
    np.testing.assert_array_equal(kv.pull("s"), np.max(vals, axis=0))
    kv.push("s", vals, op="MIN")
    np.testing.assert_array_equal(kv.pull("s"), np.min(vals, axis=0))
    with pytest.raises(ValueError, match="push op"):
        kv.push("s", vals, op="prod")
    kv.set_optimizer(optimizers.create("sgd", learning_rate=1.0))
    kv.push("s", vals, op="max")  # statistics never go through the optimizer
    np.testing.assert_array_equal(kv.pull("s"), np.max(vals, axis=0))
    kv.init("p", np.zeros(3, np.float32), param_only=True)
    kv.push("p", vals)  # a parameter: the mean, no optimizer
    np.testing.assert_allclose(kv.pull("p"), np.mean(vals, axis=0), rtol=1e-6)


def test_errors_name_the_key_and_the_fix():
    kv = kvs.create()
    kv.init(0, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"(?s)duplicate init of key 0.*HINT"):
        kv.init(0, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="duplicate init of key 5"):
        kv.init([5, 5], [np.zeros(1), np.zeros(1)])
    assert 5 not in kv._keys  # a failed init leaves nothing behind
    for call in (lambda: kv.push(9, np.zeros(1)), lambda: kv.pull(9), lambda: kv.pull(9, out=np.zeros(1))):
        with pytest.raises(ValueError, match=r"(?s)key 9, which has not been initialised.*kv.init\(9"):
            call()
    with pytest.raises(ValueError, match=r"push of key 0 with shape \(3, 2\).*\(2, 3\)"):
        kv.push(0, [np.zeros((2, 3)), np.zeros((3, 2))])
    with pytest.raises(ValueError, match=r"pull of key 0 with shape \(6,\)"):
        kv.pull(0, out=np.zeros(6))
    with pytest.raises(TypeError, match="inconsistent types of keys"):
        kv.init([1, "1"], [np.zeros(1), np.zeros(1)])
    with pytest.raises(TypeError, match="ints or strs"):
        kv.init(1.5, np.zeros(1))
    with pytest.raises(TypeError, match="ints or strs"):
        kv.init(True, np.zeros(1))
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        kv.push([0, 1], [np.zeros((2, 3))])
    with pytest.raises(ValueError, match="one value per key"):
        kv.init(7, [np.zeros(1), np.zeros(1)])
    with pytest.raises(TypeError, match="not a torch tensor or numpy array"):
        kv.push(0, [[1, 2, 3]])
    with pytest.raises(ValueError, match="empty list"):
        kv.push(0, [])
    with pytest.raises(ValueError, match=r"(?s)not supported for kvstore type 'local'.*HINT"):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    with pytest.raises(TypeError, match="set_updater"):
        kv.set_optimizer(object())
    kv.init(np.int64(12), np.zeros(1))  # numpy integers are int keys
    assert 12 in kv._keys


def test_a_key_that_is_not_valid_unicode_is_refused_with_a_hint_on_every_call():
    kv = kvs.create()
    kv.init("w", np.zeros(2, np.float32))
    bad = "w\udc80x"  # what errors='surrogateescape' makes of the byte 0x80
    calls = [lambda: kv.init(bad, np.zeros(2)), lambda: kv.push(bad, np.zeros(2)),
             lambda: kv.pull(bad), lambda: kv.init(["v", bad], [np.zeros(1), np.zeros(1)])]
    for call in calls:
        with pytest.raises(ValueError, match=r"(?s)key 'w\\udc80x' is not valid Unicode text: "
                                             r"surrogates not allowed at position 1.*HINT: .*UTF-8") as info:
            call()
        assert not isinstance(info.value, UnicodeError)
    assert list(kv._keys) == ["w"]  # nothing half-initialised


# --- optimizer, updater, states -----------------------------------------------------------------

def test_optimizer_updates_stored_values_like_numpy_sgd():
    kv = kvs.create()
    w0 = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    kv.init("w", w0)
    kv.set_optimizer("sgd")  # a registered name: MXNet's defaults, lr 0.01
    kv.push("w", [np.ones((3, 4), np.float32)] * 2)
    np.testing.assert_allclose(kv.pull("w"), w0 - 0.01 * 2, rtol=1e-6)
    kv.set_optimizer({"name": "sgd", "params": {"learning_rate": 0.5, "wd": 0.1}})
    w1 = kv.pull("w")
    g = np.full((3, 4), 2.0, np.float32)
    kv.push("w", g)
    np.testing.assert_allclose(kv.pull("w"), (1 - 0.5 * 0.1) * w1 - 0.5 * g, rtol=1e-6)


def test_set_updater_runs_a_python_function():
    kv = kvs.create()
    kv.init(3, torch.full((2,), 4.0))
    calls = []

    def update(key, merged, stored):
        calls.append(key)
        stored += merged * 2

    kv.set_updater(update)
    kv.push(3, torch.ones(2))
    assert kv.pull(3).tolist() == [6.0, 6.0] and calls == [3]
    with pytest.raises(ValueError, match="custom updater"):
        kv.save_optimizer_states("unused")
    with pytest.raises(TypeError):
        kv.set_updater(3)


def test_save_and_load_optimizer_states_continue_adam(tmp_path):
    params = dict(learning_rate=0.05, beta1=0.8, beta2=0.9, epsilon=1e-6, wd=0.01)
    w0 = np.random.default_rng(2).normal(size=5).astype(np.float32)
    grads = [np.random.default_rng(10 + i).normal(size=5).astype(np.float32) for i in range(3)]

    def reference(steps):
        w, m, v = w0.astype(np.float64), np.zeros(5), np.zeros(5)
        for t, g in enumerate(grads[:steps], 1):
            g = g + params["wd"] * w
            m = params["beta1"] * m + (1 - params["beta1"]) * g
            v = params["beta2"] * v + (1 - params["beta2"]) * g * g
            lr = params["learning_rate"] * np.sqrt(1 - params["beta2"] ** t) / (1 - params["beta1"] ** t)
            w = w - lr * m / (np.sqrt(v) + params["epsilon"])
        return w

    kv = kvs.create()
    with pytest.raises(ValueError, match="no optimizer"):
        kv.save_optimizer_states(str(tmp_path / "none"))
    kv.init(0, torch.from_numpy(w0.copy()))
    kv.set_optimizer(optimizers.create("adam", **params))
    for g in grads[:2]:
        kv.push(0, torch.from_numpy(g))
    np.testing.assert_allclose(kv.pull(0).numpy(), reference(2), rtol=1e-5)
    path = str(tmp_path / "states")
    kv.save_optimizer_states(path, dump_optimizer=True)
    fresh = kvs.create("device")
    fresh.init(0, kv.pull(0))
    fresh.load_optimizer_states(path)  # the file brings the optimizer too
    fresh.push(0, torch.from_numpy(grads[2]))
    np.testing.assert_allclose(fresh.pull(0).numpy(), reference(3), rtol=1e-5)
    other = kvs.create()
    other.init(0, kv.pull(0))
    kv.save_optimizer_states(path)  # without the optimizer: the store must have one
    with pytest.raises(ValueError, match="no optimizer"):
        other.load_optimizer_states(path)
    (tmp_path / "junk").write_bytes(b"not a states file")
    with pytest.raises(ValueError, match="not an accord optimizer-state file"):
        other.load_optimizer_states(str(tmp_path / "junk"))


# --- 2-bit compression on the device store -----------------------------------------------------

def test_device_store_two_bit_compression_per_device_residuals():
    t = 0.5
    kv = kvs.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": t})
    n = 37
    kv.init("g", np.zeros(n, np.float32))
    seqs = [[np.random.default_rng([d, r]).uniform(-1, 1, n).astype(np.float32) for r in range(4)]
            for d in range(2)]
    sent = [_twobit_reference(seq, t) for seq in seqs]
    for r in range(4):
        kv.push("g", [torch.from_numpy(seqs[0][r]), torch.from_numpy(seqs[1][r])])
        np.testing.assert_array_equal(kv.pull("g"), sent[0][r] + sent[1][r])
    with pytest.raises(ValueError, match="threshold"):
        kv.set_gradient_compression({"type": "2bit", "threshold": -1})
    with pytest.raises(ValueError, match="unknown gradient compression type"):
        kv.set_gradient_compression({"type": "1bit"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_store_merges_on_the_gpu():
    kv = kvs.create("device")
    kv.init(0, torch.zeros(4, device="cuda"))
    kv.push(0, [torch.ones(4, device="cuda"), torch.ones(4)])  # a CPU value is moved, merged on the GPU
    assert kv._stored[0].device.type == "cuda"
    out = torch.zeros(4)
    kv.pull(0, out=[out])
    assert out.tolist() == [2.0] * 4
    kv.set_optimizer(optimizers.create("sgd", learning_rate=0.5, momentum=0.9))
    kv.push(0, torch.ones(4, device="cuda"))
    assert kv.pull(0).device.type == "cuda"
    np.testing.assert_allclose(kv.pull(0).cpu().numpy(), 1.5)


def test_dist_async_without_servers_is_refused(monkeypatch):
    monkeypatch.delenv("ACCORD_NUM_SERVERS", raising=False)
    monkeypatch.delenv("DMLC_NUM_SERVER", raising=False)
    with pytest.raises(BackendError, match=r"(?s)dist_async.*HINT.*--num-servers"):
        kvs.create("dist_async")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kvs.create("device")  # no warning on the common path
