"""accord.Model's AMP level O2 in one process (CPU, bfloat16): half weights except normalization
layers, float32 master weights stepped by the optimizer, bitwise equal to a plain torch loop
written here; masters survive save/load, elastic restore and prepare again."""
import os

import numpy as np
import pytest
import torch
from torch import nn

from accord.hapi import Model
from accord.hapi.elastic import elastic_state
from accord.hapi.master_weights import check_optimizer

pytestmark = pytest.mark.timeout(90)

HALF = torch.bfloat16
NORMS = (nn.BatchNorm1d, nn.LayerNorm, nn.GroupNorm)


def _net(seed=0):
    """A BatchNorm first (inputs then stay float32), half Linears around a LayerNorm."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 8), nn.LayerNorm(8), nn.Tanh(),
                         nn.Linear(8, 3))


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 3, size=n)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def _model(seed=0, make_opt=_sgd, amp_level="O2", **kw):
    model = Model(_net(seed))
    model.prepare(make_opt(model.parameters()), nn.CrossEntropyLoss(), amp_level=amp_level, **kw)
    return model


def _reference(x, y, batch, epochs, make_opt=_sgd, seed=0):
    """O2 by hand, in plain torch: every parameter outside the norm layers cast to bfloat16,
    float32 masters made from the cast values, the optimizer over the masters, forward under
    autocast, master.grad = half grad as float32, half parameters copied back after each step."""
    net = _net(seed)
    half = [p for m in net.modules() if not isinstance(m, NORMS) for p in m.parameters(recurse=False)]
    with torch.no_grad():
        for p in half:
            p.data = p.data.to(HALF)
    masters = {id(p): p.detach().float() for p in half}
    stepped = [masters.get(id(p), p) for p in net.parameters()]
    opt = make_opt(stepped)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        for lo in range(0, len(x), batch):
            net.zero_grad(set_to_none=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=HALF):
                loss = nn.functional.cross_entropy(net(xt[lo:lo + batch]), yt[lo:lo + batch].long())
            loss.backward()
            for p in half:
                masters[id(p)].grad = p.grad.float()
            opt.step()
            with torch.no_grad():
                for p in half:
                    p.copy_(masters[id(p)])
    return net, [masters[id(p)] for p in half]


def _assert_equal(a, b):
    """Bitwise equality of two lists (or state dicts) of tensors."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        a, b = list(a.values()), list(b.values())
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and torch.equal(u, v), (u, v)


def _masters(model):
    return [m.detach().clone() for m in model._state.masters.masters]


def test_o2_casts_everything_but_normalization_layers():
    net = nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 8), nn.LayerNorm(8), nn.GroupNorm(2, 8),
                        nn.Linear(8, 3))
    net[4].register_buffer("offset", torch.zeros(3))  # a floating buffer of a half layer
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = Model(net)
    opt = _sgd(model.parameters())
    model.prepare(opt, nn.CrossEntropyLoss(), amp_level="O2")
    dtypes = {k: v.dtype for k, v in net.state_dict().items()}
    assert {k for k, d in dtypes.items() if d == HALF} == {"1.weight", "1.bias", "4.weight", "4.bias", "4.offset"}
    assert dtypes["0.running_mean"] == dtypes["2.weight"] == dtypes["3.bias"] == torch.float32
    assert dtypes["0.num_batches_tracked"] == torch.int64
    # The optimizer steps float32 masters (the half values upcast) and the norm layers' own params.
    stepped = opt.param_groups[0]["params"]
    assert all(p.dtype == torch.float32 for p in stepped)
    half = [net[1].weight, net[1].bias, net[4].weight, net[4].bias]
    assert not any(p is h for p in stepped for h in half)
    assert any(p is net[0].weight for p in stepped)
    _assert_equal(_masters(model), [before[k].to(HALF).float() for k in ("1.weight", "1.bias", "4.weight", "4.bias")])


def test_o2_fit_equals_a_plain_torch_o2_loop_bitwise():
    x, y = _data()
    model = _model()
    seen = []
    model.network[0].register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, out.dtype)))
    model.network[1].register_forward_hook(lambda mod, inp, out: seen.append(("linear", out.dtype)))
    model.fit((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    net, masters = _reference(x, y, batch=8, epochs=2)
    _assert_equal(model.network.state_dict(), net.state_dict())
    _assert_equal(_masters(model), masters)
    # Inputs take the first layer's dtype: float32 for the BatchNorm kept in float32; the half
    # Linear after it runs in bfloat16.
    assert set(seen) == {(torch.float32, torch.float32), ("linear", HALF)}


def test_o2_masters_carry_precision_the_half_weights_lack():
    # With a tiny learning rate a bfloat16 weight alone would not move (the update is below its
    # rounding step); the float32 masters accumulate it. Guards against stepping the half weights.
    x, y = _data()
    model = _model(make_opt=lambda p: torch.optim.SGD(p, lr=1e-4))
    start = _masters(model)
    model.fit((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    moved = _masters(model)
    assert any(not torch.equal(a, b) for a, b in zip(start, moved))
    net, masters = _reference(x, y, batch=8, epochs=2, make_opt=lambda p: torch.optim.SGD(p, lr=1e-4))
    _assert_equal(moved, masters)


def test_o2_save_load_round_trip_continues_training_identically(tmp_path):
    x, y = _data()
    path = str(tmp_path / "ckpt")
    straight = _model(make_opt=_adam)
    straight.fit((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    straight.save(path)
    saved_masters = _masters(straight)
    straight.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)

    resumed = _model(seed=1, make_opt=_adam)  # other initial weights: all must come from the files
    resumed.load(path)
    _assert_equal(_masters(resumed), saved_masters)
    resumed.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    _assert_equal(resumed.network.state_dict(), straight.network.state_dict())
    _assert_equal(_masters(resumed), _masters(straight))
    _assert_equal(resumed.optimizer.state_dict()["state"][0], straight.optimizer.state_dict()["state"][0])

    files = torch.load(path + ".pt", weights_only=True), torch.load(path + ".opt.pt", weights_only=True)
    assert files[0]["1.weight"].dtype == HALF and files[0]["0.weight"].dtype == torch.float32
    assert sorted(files[1]["master_weights"]) == ["1.bias", "1.weight", "4.bias", "4.weight"]


def test_o2_load_without_saved_masters_takes_the_half_weights(tmp_path):
    x, y = _data()
    trained = _model()
    trained.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    trained.save(str(tmp_path / "weights"), training=False)  # no .opt.pt: no masters saved
    assert not os.path.exists(tmp_path / "weights.opt.pt")
    fresh = _model(seed=2)
    fresh.load(str(tmp_path / "weights"))
    _assert_equal(_masters(fresh), [p.detach().float() for p in trained._state.masters.params])


def test_o2_elastic_restore_brings_the_masters_back():
    x, y = _data()
    model = _model(make_opt=_adam)
    model.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    state = elastic_state(model, None)
    state.commit()
    committed, weights = _masters(model), {k: v.clone() for k, v in model.network.state_dict().items()}
    model.train_batch([torch.from_numpy(x[:8])], torch.from_numpy(y[:8]))
    assert not torch.equal(_masters(model)[0], committed[0])
    state.restore()
    _assert_equal(_masters(model), committed)
    _assert_equal(model.network.state_dict(), weights)


def test_o2_with_compile_trains_like_eager():
    x, y = _data()
    eager, compiled = _model(), _model(compile={"backend": "eager"})
    eager.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    compiled.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert compiled._state.forward is not compiled.network
    _assert_equal(compiled.network.state_dict(), eager.network.state_dict())
    _assert_equal(_masters(compiled), _masters(eager))


def test_o2_evaluate_and_predict_run_the_half_network():
    x, y = _data()
    model = _model()
    model.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    out = model.predict(x, batch_size=8, verbose=0)
    net = model.network.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=HALF):
        want = net(torch.from_numpy(x)).float().numpy()
    np.testing.assert_array_equal(out, want)
    result = model.evaluate((x, y), batch_size=40, verbose=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=HALF):
        loss = nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
    assert result["loss"] == pytest.approx(float(loss), rel=1e-6)


def test_o2_float_labels_stay_float32():
    x, _ = _data()
    target = np.linspace(-1, 1, 3 * len(x), dtype=np.float32).reshape(len(x), 3) / 3.0
    labels = []
    model = Model(nn.Sequential(nn.Linear(5, 3)))
    model.prepare(_sgd(model.parameters()), lambda out, lab: labels.append(lab.dtype) or
                  nn.functional.mse_loss(out.float(), lab), amp_level="O2")
    model.fit((x, target), batch_size=8, epochs=1, verbose=0)
    assert set(labels) == {torch.float32} and model.network[0].weight.dtype == HALF


def test_prepare_again_gives_the_network_its_float32_weights_back():
    x, y = _data()
    model = _model()
    opt = model.optimizer
    model.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    masters = _masters(model)
    model.prepare(opt, nn.CrossEntropyLoss(), amp_level="O0")
    assert all(p.dtype == torch.float32 for p in model.network.parameters())
    _assert_equal([model.network[1].weight, model.network[1].bias, model.network[4].weight,
                   model.network[4].bias], masters)
    # the optimizer holds the network's parameters again, with their momentum buffers
    params = list(model.network.parameters())
    assert all(any(p is q for q in params) for p in opt.param_groups[0]["params"])
    assert all(p in opt.state for p in params)
    model.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)  # still trains, in float32
    model.prepare(opt, nn.CrossEntropyLoss(), amp_level={"level": "O2", "dtype": "bfloat16"})
    assert model.network[1].weight.dtype == HALF
    model.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)


def test_o2_float16_loss_scaling_skips_overflowing_steps():
    # A GradScaler is made for float16 on CUDA only; give one to a CPU model to check that an
    # inf gradient skips the step on the masters and the half weights stay in step with them.
    x, y = _data()
    model = _model(amp_level={"level": "O2", "dtype": "float16"})
    assert model.network[1].weight.dtype == torch.float16 and model._state.scaler is None
    model._state.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 60)
    before = _masters(model)
    model.train_batch([torch.from_numpy(x[:8])], torch.from_numpy(y[:8]))  # float16 gradients overflow at this scale
    _assert_equal(_masters(model), before)
    assert model._state.scaler.get_scale() == 2.0 ** 59
    model._state.scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    model.train_batch([torch.from_numpy(x[:8])], torch.from_numpy(y[:8]))
    after = _masters(model)
    assert all(torch.isfinite(m).all() for m in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    _assert_equal([p.float() for p in model._state.masters.params], [m.half().float() for m in after])


@pytest.mark.parametrize("amp_level, words", [
    ("O3", "'O3' is not supported"),
    ({"level": "O2", "dtype": "float32"}, "not a half-precision type"),
    ({"level": "o2", "dtype": "int8"}, "not a half-precision type"),
])
def test_bad_amp_levels_are_refused_with_a_hint(amp_level, words):
    model = Model(_net())
    with pytest.raises(ValueError, match="HINT:") as info:
        model.prepare(_sgd(model.parameters()), nn.CrossEntropyLoss(), amp_level=amp_level)
    assert words in str(info.value)
    assert model.network[1].weight.dtype == torch.float32  # refused before touching anything


def test_o2_refuses_adasum_with_a_hint():
    class AdasumLike:  # a DistributedOptimizer(op=Adasum) has no gradient op
        def synchronize(self):
            pass

        def skip_synchronize(self):
            pass

    with pytest.raises(ValueError, match="Adasum.*\nHINT:"):
        check_optimizer(AdasumLike())
