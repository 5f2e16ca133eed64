"""The pieces of ``accord-bench train`` that need no second process: AMP levels, data, memory."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
try:  # scikit-learn sets KMP_* variables when first imported: do it before the leak check looks
    import sklearn.datasets  # noqa: F401
except ImportError:
    pass

from accord.bench.memory import MemoryMeter, current_rss_bytes  # noqa: E402
from accord.bench.options import TrainOptions  # noqa: E402
from accord.bench.precision import Precision  # noqa: E402
from accord.bench.strategies import make_strategy  # noqa: E402
from accord.bench.workload import batches, build_model  # noqa: E402

pytestmark = pytest.mark.timeout(60)

OPTS = TrainOptions(model="lenet", batch_size=4, amp_level="O0", amp_dtype="auto", compiler_opt=False,
                    channels_last=False, steps=1, warmup=0, repeats=1, log_interval=1, data="synthetic",
                    image_size=None, baseline="none", accord_api="hvd",
                    compression="none", device="cpu", threads=1, lr=0.5, seed=0, progress=False)


def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2))


def _one_step(level: str):
    model = _tiny()
    w0 = model[0].weight.detach().clone()
    precision = Precision(level, "auto", "cpu")
    strategy = make_strategy("local", model, precision, lr=0.5, size=1, device=torch.device("cpu"))
    x = torch.tensor([[1.0, 2.0, 3.0]])
    with precision.autocast():
        out = strategy.model(precision.inputs(x))
    loss = out.float().sum()
    precision.backward(loss)
    grad = strategy.model[0].weight.grad.detach().clone()
    with strategy.stepping():
        precision.step(strategy.optimizer)
    return w0, grad, out, strategy, precision


def test_o0_is_plain_sgd():
    w0, grad, out, strategy, _ = _one_step("O0")
    # d(sum(Wx + b))/dW = x for every output row; SGD with momentum: the first step is -lr * g
    assert torch.equal(grad, torch.tensor([[1.0, 2.0, 3.0]] * 2))
    assert out.dtype == torch.float32
    assert torch.allclose(strategy.model[0].weight, w0 - 0.5 * grad)


def test_o1_autocasts_to_bf16_on_cpu_and_keeps_fp32_weights():
    w0, grad, out, strategy, _ = _one_step("O1")
    assert out.dtype == torch.bfloat16
    assert strategy.model[0].weight.dtype == torch.float32
    assert torch.allclose(strategy.model[0].weight, w0 - 0.5 * grad)


def test_o2_half_model_with_fp32_master_weights():
    w0, grad, out, strategy, precision = _one_step("O2")
    weight = strategy.model[0].weight
    assert weight.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    master = precision.masters[0]
    assert master.dtype == torch.float32
    # the master starts from the bf16-rounded weight and takes the step in fp32
    expected = w0.to(torch.bfloat16).float() - 0.5 * grad.float()
    assert torch.allclose(master, expected)
    assert torch.equal(weight, master.to(torch.bfloat16))  # copied back into the model
    assert precision.compute_dtype == "bfloat16"


def test_synthetic_batches_have_the_model_input_shape():
    for model, shape, classes in [("lenet", (4, 1, 28, 28), 10), ("mlp", (4, 1024), 1000),
                                  ("resnet18", (4, 3, 32, 32), 1000)]:
        opts = dataclasses.replace(OPTS, model=model, image_size=32 if model == "resnet18" else None)
        x, y = next(batches(opts, 0, 1, torch.device("cpu")))
        assert tuple(x.shape) == shape and y.shape == (4,) and int(y.max()) < classes
        assert build_model(opts)(x).shape == (4, classes)


def test_digits_are_split_across_ranks():
    pytest.importorskip("sklearn")
    opts = dataclasses.replace(OPTS, data="digits", model="mlp", batch_size=899)
    seen = []
    for rank in range(2):
        x, y = next(batches(opts, rank, 2, torch.device("cpu")))
        assert x.shape == (899, 64) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        assert set(y.tolist()) <= set(range(10))
        seen.append({tuple(row) for row in x.tolist()})
    # 1,797 digits: ranks hold 899 and 898; the whole batch of rank 0 differs from rank 1's
    # (a few digits are exact duplicates of each other in the data set, hence "most")
    assert len(seen[0] & seen[1]) < 20
    opts = dataclasses.replace(OPTS, data="digits", model="resnet18", batch_size=2)
    x, _ = next(batches(opts, 0, 2, torch.device("cpu")))
    assert x.shape == (2, 3, 32, 32)
    assert build_model(opts)(x).shape == (2, 10)


def test_memory_meter_reports_rss():
    assert current_rss_bytes() > 0
    meter = MemoryMeter(torch.device("cpu"))
    first = meter.peak_mb()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    meter.sample()
    assert meter.peak_mb() >= first + 60
    assert meter.describe().startswith("peak RSS ")
    del block
