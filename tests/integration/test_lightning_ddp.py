"""Lightning's own DDP on the accord torch.distributed backend, started by accordrun and by torchrun:
``Trainer(strategy=DDPStrategy(process_group_backend="accord"))``, ``Fabric(strategy="ddp_accord")``
and Fabric's ``DDPStrategy(process_group_backend="accord")`` (scripts/lightning_ddp.py), each
against one process trained with plain torch on the global batch."""
import pytest
import torch
from helpers import framework_jobs as jobs

jobs.require("pytorch_lightning", "pip install 'accord[lightning]'")

common = jobs.common()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOL = 1e-10


@pytest.fixture(scope="module", params=["accordrun", "torchrun"])
def out(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"lightning-ddp-{request.param}")
    launch = jobs.accordrun if request.param == "accordrun" else jobs.torchrun
    jobs.succeeded(launch("lightning_ddp.py", str(folder), timeout=240))
    return str(folder)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def test_trainer_ddp_strategy_on_the_accord_backend(out):
    results = common.read(out, "trainer")
    expected = common.reference(common.plan(2, accumulate=2), sgd, accumulate=2, clip=("norm", 0.5))
    assert results[0]["weights"] == results[1]["weights"]
    assert jobs.max_difference(results[0]["weights"], expected) < TOL
    assert [(r["backend"], r["world"]) for r in results] == [("accord", 2)] * 2
    assert results[0]["train_loss"] == results[1]["train_loss"]
    assert results[0]["registered"] == ["DDPStrategy", "accord"]  # Trainer(strategy="ddp_accord")


@pytest.mark.parametrize("case", ["fabric_name", "fabric_object"])
def test_fabric_ddp_on_the_accord_backend(out, case):
    results = common.read(out, case)
    expected = common.reference(common.plan(1, accumulate=2, shuffle=False), sgd, accumulate=2,
                                clip=("norm", 0.3))
    assert results[0]["weights"] == results[1]["weights"]
    assert jobs.max_difference(results[0]["weights"], expected) < TOL
    assert [(r["backend"], r["world"], r["sum"], r["strategy"]) for r in results] == \
        [("accord", 2, 3.0, "DDPStrategy")] * 2
