"""Server-side optimizers: MXNet's update rules on numpy and torch, the registry, state files."""
import numpy as np
import pytest
import torch

from accord.kvstore import optimizers as opt

pytestmark = pytest.mark.timeout(30)


def _rng(seed, shape=(4, 3)):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _sgd_reference(w, grads, lr, momentum=0.0, wd=0.0, rescale=1.0, clip=None):
    w = w.astype(np.float64)
    mom = np.zeros_like(w)
    for g in grads:
        g = rescale * g.astype(np.float64)
        if clip is not None:
            g = np.clip(g, -clip, clip)
        if momentum == 0.0:
            w = (1 - lr * wd) * w - lr * g
        else:
            mom = momentum * mom - lr * wd * w - lr * g
            w = w + mom
    return w


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("params", [
    dict(learning_rate=0.1),
    dict(learning_rate=0.1, wd=0.05, rescale_grad=0.25, clip_gradient=0.3),
    dict(learning_rate=0.2, momentum=0.9, wd=0.01, rescale_grad=2.0, clip_gradient=1.0),
])
def test_sgd_matches_the_reference_on_numpy_and_torch(kind, params):
    w0, grads = _rng(0), [_rng(i + 1) for i in range(3)]
    updater = opt.Updater(opt.create("sgd", **params))
    w = w0.copy() if kind == "numpy" else torch.from_numpy(w0.copy())
    for g in grads:
        grad = g if kind == "numpy" else torch.from_numpy(g)
        before = np.array(grad.numpy() if kind == "torch" else grad)
        updater("k", grad, w)
        np.testing.assert_array_equal(grad.numpy() if kind == "torch" else grad, before)  # never modified
    ref = _sgd_reference(w0, grads, params["learning_rate"], params.get("momentum", 0.0),
                         params.get("wd", 0.0), params.get("rescale_grad", 1.0),
                         params.get("clip_gradient"))
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
    assert updater.counts["k"] == 3


def test_adam_matches_the_reference_with_per_key_step_counts():
    p = dict(learning_rate=0.01, beta1=0.8, beta2=0.95, epsilon=1e-6, wd=0.1, clip_gradient=0.5)
    updater = opt.Updater(opt.create("adam", **p))
    w0 = _rng(0)
    w = {"a": w0.copy(), "b": torch.from_numpy(w0.copy())}
    grads = [_rng(i + 1) for i in range(3)]
    ref, m, v = w0.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        for key in ("a", "b"):
            updater(key, g if key == "a" else torch.from_numpy(g), w[key])
        gg = np.clip(g + p["wd"] * ref, -0.5, 0.5)
        m = p["beta1"] * m + (1 - p["beta1"]) * gg
        v = p["beta2"] * v + (1 - p["beta2"]) * gg * gg
        lr = p["learning_rate"] * np.sqrt(1 - p["beta2"] ** t) / (1 - p["beta1"] ** t)
        ref = ref - lr * m / (np.sqrt(v) + p["epsilon"])
    np.testing.assert_allclose(w["a"], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w["b"].numpy(), ref, rtol=1e-5, atol=1e-6)
    assert updater.counts == {"a": 3, "b": 3}
    assert opt.create("adam").learning_rate == 0.001 and opt.create("sgd").learning_rate == 0.01


def test_registry_config_and_errors():
    sgd = opt.create("SGD", learning_rate=0.5, momentum=0.9)
    assert opt.from_config(sgd.config()).params == sgd.params
    assert sgd.config() == {"name": "sgd", "params": {"learning_rate": 0.5, "momentum": 0.9,
                                                      "wd": 0.0, "rescale_grad": 1.0,
                                                      "clip_gradient": None}}
    assert "sgd" in opt.known_optimizers() and "adam" in opt.known_optimizers()
    with pytest.raises(ValueError, match=r"(?s)no hyperparameter\(s\) \['lr'\].*HINT"):
        opt.create("sgd", lr=0.1)
    with pytest.raises(ValueError, match="not a finite number"):
        opt.create("sgd", learning_rate="fast")
    with pytest.raises(ValueError, match="not a finite number"):
        opt.create("sgd", learning_rate=float("nan"))
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        opt.create("lamb")
    with pytest.raises(ValueError, match="not an optimizer configuration"):
        opt.from_config({"params": {}})
    with pytest.raises(AttributeError):
        getattr(sgd, "no_such_thing")  # noqa: B009 - the lookup itself is under test

    @opt.register_optimizer
    class Plus(opt.Optimizer):
        name = "plus_test"

        def create_state(self, weight):
            return []

        def update(self, weight, grad, state, count):
            weight += grad * self.params["rescale_grad"]

    try:
        w = np.zeros(2)
        opt.Updater(opt.from_config({"name": "plus_test", "params": {"rescale_grad": 2.0}}))(0, np.ones(2), w)
        assert w.tolist() == [2.0, 2.0]
    finally:
        opt._REGISTRY.pop("plus_test")
    with pytest.raises(TypeError):
        opt.register_optimizer(int)


def test_register_optimizer_refuses_a_taken_name_unless_override():
    class MySGD(opt.Optimizer):
        name = "SGD"  # names are case-insensitive: this is sgd's

        def create_state(self, weight):
            return []

        def update(self, weight, grad, state, count):
            weight -= grad

    with pytest.raises(ValueError, match=r"(?s)optimizer 'sgd' is already registered.*HINT: .*override=True"):
        opt.register_optimizer(MySGD)
    assert type(opt.create("sgd")) is opt.SGD
    try:
        assert opt.register_optimizer(override=True)(MySGD) is MySGD
        assert type(opt.create("sgd")) is MySGD
    finally:
        opt._REGISTRY["sgd"] = opt.SGD
    with pytest.raises(ValueError, match=r"(?s)unknown optimizer 'lamb'; known: adam, sgd.*HINT"):
        opt.create("lamb")


def test_state_files_round_trip_without_pickle(tmp_path):
    updater = opt.Updater(opt.create("sgd", learning_rate=0.1, momentum=0.5))
    weights = {3: np.ones(4, np.float32), "w": torch.ones(2, 2)}
    for key, w in weights.items():
        updater(key, w * 0 + 1, w)
        updater(key, w * 0 + 1, w)
    path = str(tmp_path / "states")
    opt.save_states(path, updater.export(), updater.optimizer)
    entries, optimizer = opt.load_states(path)
    assert optimizer.params == updater.optimizer.params
    assert {(k, c) for k, c, _ in entries} == {(3, 2), ("w", 2)}
    for key, _count, states in entries:
        np.testing.assert_allclose(states[0].reshape(-1), np.asarray(updater.states[key][0]).reshape(-1))
    # loaded (numpy) states are converted to the weight's kind on the next update
    other = opt.Updater(optimizer)
    other.load(entries)
    w = torch.ones(2, 2)
    other("w", torch.ones(2, 2), w)
    assert isinstance(other.states["w"][0], torch.Tensor) and other.counts["w"] == 3
    np.save(str(tmp_path / "plain.npy"), np.zeros(3))
    with pytest.raises(ValueError, match="not an accord optimizer-state file"):
        opt.load_states(str(tmp_path / "plain.npy"))
    with pytest.raises(TypeError):
        opt.save_states(str(tmp_path / "bad"), [(1.5, 1, [np.zeros(1)])])
