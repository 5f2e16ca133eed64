"""accord.Model's AMP on CUDA, where float16 comes with a GradScaler (one process, one GPU).

O2: the network is float16 except its normalization layers, float32 master weights are stepped,
and the GradScaler made by ``prepare`` scales the loss; a step whose gradients overflow is
skipped (masters unchanged, the scale halved), a finite one moves the masters and the float16
weights follow them. O1: float32 weights, float16 autocast with a GradScaler. Both must learn a
task whose labels a linear map gives. The same O2 rules are checked bitwise on the CPU in
bfloat16 by tests/unit/test_hapi_amp_o2.py; this file is what only a GPU can run.

Marked ``gpu``: skipped where torch sees no CUDA device (also with ACCORD_GPU_TESTS_ON_CPU=1:
its CPU twin is the unit test above).
"""
import numpy as np
import pytest
import torch
from torch import nn

from accord.hapi import Model

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason=f"needs a CUDA device: torch {torch.__version__} sees none "
                                        "(the CPU twin is tests/unit/test_hapi_amp_o2.py)")]

NORMS = (nn.BatchNorm1d, nn.LayerNorm, nn.GroupNorm)


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 3))


def _data(n=256, seed=0):
    """Labels from a fixed linear map: a network that learns reaches a low loss."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    w = rng.normal(size=(5, 3))
    return x, (x @ w).argmax(axis=1)


def _model(amp_level):
    model = Model(_net(), device="cuda")
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                  amp_level=amp_level)
    return model


def _masters(model):
    return [m.detach().clone() for m in model._state.masters.masters]


def _loss(model, x, y):
    return model.evaluate((x, y), batch_size=64, verbose=0)["loss"]


def test_o2_float16_on_cuda_has_half_weights_masters_and_a_grad_scaler():
    model = _model({"level": "O2", "dtype": "float16"})
    for module in model.network.modules():
        for p in module.parameters(recurse=False):
            assert p.is_cuda
            assert p.dtype == (torch.float32 if isinstance(module, NORMS) else torch.float16), module
    assert all(m.dtype == torch.float32 and m.is_cuda for m in model._state.masters.masters)
    scaler = model._state.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()


def test_o2_overflowing_step_is_skipped_and_a_finite_one_moves_the_masters():
    x, y = _data(16)
    model = _model({"level": "O2", "dtype": "float16"})
    batch = ([torch.from_numpy(x)], torch.from_numpy(y))
    model._state.scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 60)  # float16 gradients overflow
    before = _masters(model)
    model.train_batch(*batch)
    after = _masters(model)
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "an overflowing step moved the masters"
    assert model._state.scaler.get_scale() == 2.0 ** 59
    model._state.scaler = torch.amp.GradScaler("cuda", init_scale=8.0)
    model.train_batch(*batch)
    after = _masters(model)
    assert all(torch.isfinite(m).all() for m in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "a finite step did not move the masters"
    for half, master in zip(model._state.masters.params, after):
        assert torch.equal(half.float(), master.half().float())  # the float16 weights follow the masters


@pytest.mark.parametrize("amp_level", [{"level": "O2", "dtype": "float16"}, "O1"])
def test_amp_on_cuda_learns(amp_level):
    x, y = _data()
    model = _model(amp_level)
    first = _loss(model, x, y)
    model.fit((x, y), batch_size=32, epochs=8, verbose=0, shuffle=False)
    last = _loss(model, x, y)
    assert np.isfinite(last) and last < 0.5 * first, (first, last)
    if amp_level == "O1":
        assert all(p.dtype == torch.float32 for p in model.network.parameters())
        assert model._state.scaler is not None and model._state.scaler.is_enabled()
